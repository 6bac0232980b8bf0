"""Resumable steps: a killed, failed or displaced attempt's checkpoints serve the next attempt of
the same recipe, and only it (docs/reliability.md, "Resumable steps")."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from marin.execution.errors import CodeDriftError, InvalidStepError
from marin.execution.lazy import lower, run
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability import resumable_pipeline
from tests.reliability.conftest import REPO, child_env
from tests.reliability.pipelines import wait_for_file


def runner(prefix: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.resumable_pipeline", prefix, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 90) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def iterations(counter: Path) -> list[int]:
    return [int(line.split()[1]) for line in counter.read_text().splitlines() if line]


def wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.01)


def kill_then_resume(prefix: str, tmp_path: Path, *args: str, **env: str) -> dict[str, Any]:
    """Run the counting step, SIGKILL its runner at iteration 55, run it again."""
    counter = tmp_path / "counter"
    base = child_env(MARIN_TEST_COUNTER=str(counter), **env)
    code, _, err = finish(runner(prefix, {**base, "MARIN_TEST_KILL_AT": "55"}, *args))
    assert code == -9, err[-3000:]
    assert iterations(counter) == list(range(55))
    code, out, err = finish(runner(prefix, base, *args))
    assert code == 0, err[-3000:]
    done = iterations(counter)
    # 0..54, then 50..100 from the checkpoint at 50: about 105, not 155.
    assert done == list(range(55)) + list(range(50, 101)), done
    assert "resume count@v1: partial output from attempt 1" in err, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["attempt"] == {"number": 2, "resumed": True}
    assert report["result"] == {"started_at": 50}
    return report


@pytest.mark.parametrize("where", ["out", "ckpt"])
def test_killed_runner_resumes_from_its_checkpoint(tmp_path: Path, where: str) -> None:
    prefix = str(tmp_path / "prefix")
    kill_then_resume(prefix, tmp_path, where)
    location = open_prefix(prefix)
    assert not os.path.exists(f"{prefix}/count/v1.marin/checkpoints"), "removed after commit"
    assert not os.path.exists(f"{prefix}/count/v1.marin/attempt.json")
    assert os.path.exists(f"{prefix}/count/v1/checkpoints") == (where == "out")  # the step's
    assert read_record(location, "count/v1") is not None


def test_killed_isolated_runner_resumes(tmp_path: Path) -> None:
    """The runner is killed while ``fn`` runs in its isolated child: the child dies with it
    (it would otherwise go on counting), and the next run resumes."""
    kill_then_resume(str(tmp_path / "prefix"), tmp_path, "ckpt", "isolate", MARIN_TEST_ISOLATED="1")


def test_killed_runner_resumes_on_s3(tmp_path: Path, s3_server: dict[str, str]) -> None:
    prefix = f"s3://marin-tests/resume-{os.getpid()}-{time.time_ns()}"
    kill_then_resume(prefix, tmp_path, "ckpt", **s3_server)


def marin(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_plan_why_and_run_json_show_the_resume(tmp_path: Path) -> None:
    prefix, env = str(tmp_path / "prefix"), child_env()
    code, _, _ = finish(runner(prefix, {**env, "MARIN_TEST_KILL_AT": "55"}, "out"))
    assert code == -9
    target = "tests/reliability/resumable_pipeline.py:counting"
    plan = marin("plan", target, "--prefix", prefix, env=env)
    assert "resume: partial output from attempt 1 (" in plan.stdout, plan.stdout + plan.stderr
    assert "same fingerprint)" in plan.stdout
    why = marin("why", target, "count@v1", "--prefix", prefix, env=env)
    assert "  resume: partial output from attempt 1 (" in why.stdout, why.stdout + why.stderr
    ran = marin("run", target, "--prefix", prefix, "--json", env=env)
    step = json.loads(ran.stdout)["steps"][0]
    assert (step["build_attempt"], step["resumed"]) == (2, True), ran.stderr[-2000:]


def test_a_changed_config_clears_the_checkpoint(tmp_path: Path) -> None:
    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    base = child_env(MARIN_TEST_COUNTER=str(counter))
    code, _, _ = finish(runner(prefix, {**base, "MARIN_TEST_KILL_AT": "55"}, "out", "", "10"))
    assert code == -9
    code, out, err = finish(runner(prefix, base, "out", "", "20"))  # every=20: a new recipe
    assert code == 0, err[-3000:]
    assert "clear count@v1: partial output from attempt 1" in err
    assert "has another fingerprint" in err and "the config or version changed" in err
    assert "(config.every: 10 -> 20); it is cleared" in err  # the field, as drift names it
    assert iterations(counter) == list(range(55)) + list(range(101))
    assert json.loads(out.strip().splitlines()[-1])["attempt"] == {"number": 1, "resumed": False}


def test_displaced_isolated_attempt_never_publishes(tmp_path: Path) -> None:
    """A's heartbeat pauses at iteration 35; B takes the lease over and resumes from 30, and
    holds at 65. A's child (released only then) never publishes: it was killed once B took
    over. B's checkpoint is intact, B commits, and A serves B's build."""
    prefix, published = str(tmp_path / "prefix"), tmp_path / "published"
    a_started, a_release = tmp_path / "a-started", tmp_path / "a-release"
    b_started, b_release = tmp_path / "b-started", tmp_path / "b-release"
    base = child_env(MARIN_TEST_PUBLISHED=str(published), MARIN_LEASE_TTL="4")
    a = runner(
        prefix,
        {**base, "MARIN_FAULT_PAUSE_HEARTBEAT": "1",
         "MARIN_TEST_HOLD_AT": f"35:{a_started}:{a_release}"},
        "ckpt", "isolate",
    )  # fmt: skip
    wait_for_file(str(a_started))
    a_child = int(a_started.read_text())
    b = runner(
        prefix, {**base, "MARIN_TEST_HOLD_AT": f"65:{b_started}:{b_release}"}, "ckpt", "isolate"
    )
    try:
        wait_for_file(str(b_started), timeout=20)
    except TimeoutError:
        for proc in (a, b):
            proc.kill()
        raise AssertionError(f"A:\n{finish(a)[2][-3000:]}\nB:\n{finish(b)[2][-3000:]}") from None
    wait_gone(a_child)  # killed by its runner once B took the lease
    a_release.touch()  # a live A child would publish 40 now, over B's 60
    checkpoint = tmp_path / "prefix/count/v1.marin/checkpoints/state.json"
    assert json.loads(checkpoint.read_text())["next"] == 60  # B's, intact
    b_release.touch()
    code_b, out_b, err_b = finish(b)
    code_a, _, err_a = finish(a)
    assert code_b == 0, err_b[-3000:]
    assert code_a == 0, err_a[-3000:]
    assert "skip count@v1: built by another runner" in err_a
    lines = [line.split() for line in published.read_text().splitlines()]
    a_lines = [int(n) for pid, n in lines if int(pid) == a_child]
    assert a_lines == [10, 20, 30], lines  # nothing after the takeover
    assert json.loads(out_b.strip().splitlines()[-1])["attempt"] == {"number": 2, "resumed": True}


# --- in one process ---------------------------------------------------------------------------

FAILED_ONCE: set[str] = set()
ran: list[int] = []


def fail_once(out: str, upto: int, where: str) -> int:
    """Counts with checkpoints in ``checkpoint_path`` (or the output path); fails at 55 the
    first time."""
    import fsspec

    from marin.execution.pipeline.context import current_context

    ctx = current_context()
    folder = ctx.checkpoint_path if where == "ckpt" else out
    fs, root = fsspec.core.url_to_fs(f"{folder}/state")
    fs.makedirs(root.rsplit("/", 1)[0], exist_ok=True)
    start = int(fs.cat_file(root)) if fs.exists(root) else 0
    for i in range(start, upto + 1):
        if i == 55 and out not in FAILED_ONCE:
            FAILED_ONCE.add(out)
            raise RuntimeError("preempted at 55")
        ran.append(i)
        if (i + 1) % 10 == 0 and ctx.still_holds_lease():
            fs.pipe_file(root, str(i + 1).encode())
    return start


def test_a_retry_within_one_run_resumes_on_memory(caplog: pytest.LogCaptureFixture) -> None:
    from marin.execution.lazy import OUT, apply

    ran.clear()
    step = apply("retry", fail_once, version="v1", out=OUT, upto=100, where="ckpt")
    prefix = f"memory://resume-{time.time_ns()}"
    with caplog.at_level(logging.INFO, logger="marin"):
        run(step.with_options(resumable=True, retries=1), prefix=prefix)
    assert list(range(55)) + list(range(50, 101)) == ran
    record = read_record(open_prefix(prefix), "retry/v1")
    assert record is not None and record.result == 50
    assert record.provenance["attempt"] == {"number": 2, "resumed": True}
    assert "resume retry@v1: partial output from attempt 1" in caplog.text


def test_without_resumable_a_retry_starts_over(tmp_path: Path) -> None:
    from marin.execution.lazy import OUT, apply

    ran.clear()
    step = apply("plain", fail_once, version="v1", out=OUT, upto=100, where="out")
    run(step.with_options(retries=1), prefix=str(tmp_path))
    assert list(range(55)) + list(range(101)) == ran  # its debris was cleared, as before
    record = read_record(open_prefix(str(tmp_path)), "plain/v1")
    assert record is not None and "attempt" not in record.provenance
    assert not os.path.exists(tmp_path / "plain/v1.marin/attempt.json")


def test_plan_says_resume_or_error_on_code_drift(tmp_path: Path) -> None:
    """``marin plan`` (the one decide path) names the attempt it resumes; under
    ``on_code_drift=error`` a partial output of other code stops the run before it starts."""
    from dataclasses import replace

    from marin.execution.digest.code import CodeDigest
    from marin.execution.plan.options import RunOptions
    from marin.execution.plan.read import read_stored_step
    from marin.execution.run.runner import StepRunner
    from marin.execution.store.step_folder import Attempt, attempt_path

    def plan(handle: Any, prefix: str, on_code_drift: str = "warn") -> Any:
        return StepRunner(RunOptions(on_code_drift=on_code_drift), prefix=prefix).plan(
            lower(handle)
        )[0]

    prefix = str(tmp_path / "prefix")
    handle = resumable_pipeline.counting_step("ckpt")
    spec = lower(handle, memo={})
    location = open_prefix(prefix)
    os.makedirs(f"{prefix}/count/v1.marin")
    attempt = Attempt(2, spec.fingerprint, spec.code or CodeDigest(None), "2026-01-01T00:00Z", "h",
                      placement=spec.output_path)  # fmt: skip
    location.put_file(location.path(attempt_path(spec.output_path)), attempt.to_json())
    location.put_file(location.path("count/v1.marin/status.json"), b'{"state": "FAILED"}')
    decision = plan(handle, prefix=prefix).decisions["count/v1"]
    assert decision.resume is not None
    assert decision.resume.line().startswith("resume: partial output from attempt 2 (")
    assert "ago, same fingerprint)" in decision.resume.line()
    assert spec.code is not None and spec.code.digest is not None
    first = replace(spec.code.parts[0], digest="1" * 64)
    other = replace(
        attempt, code=replace(spec.code, digest="0" * 64, parts=(first, *spec.code.parts[1:]))
    )
    location.put_file(location.path(attempt_path(spec.output_path)), other.to_json())
    assert read_stored_step(spec, location).attempt == other
    with pytest.raises(CodeDriftError, match="partial output of attempt 2"):
        plan(handle, prefix=prefix, on_code_drift="error")
    rebuild = plan(handle, prefix=prefix, on_code_drift="rebuild").decisions["count/v1"]
    assert rebuild.resume is not None and not rebuild.resume.resume


def test_options_are_checked_once() -> None:
    step = resumable_pipeline.counting_step()
    with pytest.raises(InvalidStepError, match="keep_checkpoints=True on a step that is not"):
        step.with_options(resumable=False, keep_checkpoints=True)
    with pytest.raises(InvalidStepError, match="resumable='yes'"):
        step.with_options(resumable="yes")  # type: ignore[arg-type]
    assert (
        lower(step, memo={}).fingerprint
        == lower(step.with_options(resumable=False), memo={}).fingerprint
    )


def test_a_takeover_of_a_thread_of_this_process_is_not_resumed(tmp_path: Path) -> None:
    """An in-thread ``fn`` cannot be stopped: while it runs here, an attempt that took its
    lease over clears instead of resuming what that thread may still write."""
    from marin.execution.builder.attempt import (
        TAKEN_OVER_IN_THREAD,
        record_attempt,
        running_here,
        start_attempt,
    )
    from marin.execution.store.identity import Recipe
    from marin.execution.store.lease import Lease
    from marin.execution.vocabulary import Leftover

    location = open_prefix(str(tmp_path))
    spec = lower(resumable_pipeline.counting_step(), memo={})
    recipe = Recipe.of(spec)
    first = Lease(location, spec.output_path, ttl=60)
    assert first.try_acquire() is None
    record_attempt(location, spec, start_attempt(location, spec, first, None, "warn"), recipe, "")
    first.release()
    taker = Lease(location, spec.output_path, ttl=60)
    assert taker.try_acquire() is None
    taker.took_over = True
    with running_here(location, spec):  # the displaced attempt's fn, still on its thread
        refused = start_attempt(location, spec, taker, Leftover.DEBRIS, "warn")
    assert refused is not None and not refused.resumed and refused.number == 1
    record_attempt(location, spec, start_attempt(location, spec, taker, None, "warn"), recipe, "")
    resumed = start_attempt(location, spec, taker, Leftover.DEBRIS, "warn")
    assert resumed is not None and resumed.resumed and resumed.number == 2
    assert "cleared" in TAKEN_OVER_IN_THREAD
    taker.release()


def test_keep_checkpoints_keeps_the_folder_after_the_commit(tmp_path: Path) -> None:
    from marin.execution.lazy import OUT, apply

    step = apply("keep", fail_once, version="v1", out=OUT, upto=100, where="ckpt")
    run(step.with_options(resumable=True, keep_checkpoints=True, retries=1), prefix=str(tmp_path))
    assert (tmp_path / "keep/v1.marin/checkpoints/state").read_text() == "100"
    assert not (tmp_path / "keep/v1.marin/attempt.json").exists()


def test_force_clears_a_partial_output_and_a_retry_of_the_forced_run_resumes(
    tmp_path: Path,
) -> None:
    """Red team round 5, finding 8: ``--force`` of a resumable step resumed its (damaged)
    partial output; forcing repairs, so it starts afresh, and says so in the plan. A retry
    within the forced run resumes what that run wrote."""
    from tests.ux.helpers import marin

    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    target = "tests/reliability/resumable_pipeline.py:counting"
    env = child_env(MARIN_TEST_COUNTER=str(counter))
    killed = marin("run", target, "--prefix", prefix, env={**env, "MARIN_TEST_KILL_AT": "55"})
    assert killed.returncode == -9 and iterations(counter) == list(range(55))
    plan = marin("plan", target, "--prefix", prefix, "--force", "count", env=env)
    assert "clear: partial output from attempt 1 (" in plan.stdout, plan.stdout
    assert "is cleared: --force rebuilds the step from scratch" in plan.stdout, plan.stdout
    counter.unlink()
    kill_once = {"MARIN_TEST_KILL_AT": "30", "MARIN_TEST_KILL_ONCE": str(tmp_path / "once")}
    forced = marin("run", target, "--prefix", prefix, "--force", "count", env={**env, **kill_once})
    assert forced.returncode == -9  # the forced run's first attempt dies at 30: from 0, not 50
    assert iterations(counter) == list(range(30))
    again = marin("run", target, "--prefix", prefix, env=env)  # its attempt is the repair's
    assert again.returncode == 0, again.stderr[-3000:]
    assert iterations(counter) == list(range(30)) + list(range(30, 101))


def test_a_retry_within_a_forced_run_resumes_its_own_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from marin.execution.lazy import OUT, apply

    prefix = f"memory://resume-forced-{time.time_ns()}"
    step = apply("retry", fail_once, version="v1", out=OUT, upto=100, where="ckpt")
    step = step.with_options(resumable=True, retries=1)
    ran.clear()
    run(step, prefix=prefix)  # built once
    ran.clear()
    FAILED_ONCE.clear()
    with caplog.at_level(logging.INFO, logger="marin"):
        run(step, prefix=prefix, force=["retry"])
    assert list(range(55)) + list(range(50, 101)) == ran  # the retry resumed at 50
    assert "resume retry@v1: partial output from attempt 1" in caplog.text


def test_a_later_forced_run_in_the_same_process_clears_an_earlier_forced_runs_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by the random-history checker (seed 2580, soak): the memo of forced attempts was
    per process, so a second ``--force`` run in one process (a notebook, a Prefect worker, the
    checker's in-process CLI) resumed the first forced run's partial output, even of other code,
    and committed a mix of two attempts. Only a retry of the forced run that wrote it resumes."""
    from marin.execution.lazy import OUT, apply

    prefix = f"memory://force-twice-{time.time_ns()}"
    step = apply("twice", fail_once, version="v1", out=OUT, upto=100, where="ckpt")
    step = step.with_options(resumable=True)  # no retries: the first forced run fails at 55
    ran.clear()
    FAILED_ONCE.clear()
    with pytest.raises(Exception, match="preempted at 55"):
        run(step, prefix=prefix, force=["twice"])
    assert ran == list(range(55))
    ran.clear()
    with caplog.at_level(logging.INFO, logger="marin"):
        run(step, prefix=prefix, force=["twice"])
    assert ran == list(range(101))  # from scratch: not resumed at 50
    assert "clear twice@v1: partial output from attempt 1" in caplog.text
    assert "is cleared: --force rebuilds the step from scratch" in caplog.text
    assert "resume twice@v1" not in caplog.text


def test_code_reached_through_a_registry_or_a_local_import_never_resumes_old_code(
    tmp_path: Path,
) -> None:
    """Finding 7: a tokenizer reached through ``TOKENIZERS[name]`` (a registry dict filled by a
    decorator), or through ``import lazyhelp`` inside the step function, was invisible to the
    code digest: after an edit, ``--on-code-drift rebuild`` resumed the old code's partial
    output and committed both tokenizers' results. The registry's functions are code (drift);
    a module imported inside the function that the driver has not imported is unseen, so the
    digest is unknown, never "unchanged": both partials are cleared."""
    from tests.ux.helpers import marin

    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "r7"\nversion = "0.1"\n')
    source = (REPO / "tests/reliability/code_registry_pipeline.py").read_text()
    (project / "pipe.py").write_text(source)
    (project / "lazyhelp.py").write_text('def split(text):\n    return text.split(" ")\n')
    env = child_env(MARIN_USER="alice")
    env["PYTHONPATH"] = os.pathsep.join([str(project), env["PYTHONPATH"]])
    argv = ["pipe.py:pipeline", "--prefix", "P", "--no-progress"]
    failed = marin("run", *argv, env={**env, "FAIL_ONCE": "1"}, cwd=project)
    assert failed.returncode == 1 and "preempted" in failed.stdout + failed.stderr
    for name in ("pipe.py", "lazyhelp.py"):  # both tokenizers now split on commas too
        path = project / name
        path.write_text(path.read_text().replace(
            'return text.split(" ")', 'return text.replace(",", " ").split(" ")'))  # fmt: skip
    plan = marin("plan", *argv[:3], "--on-code-drift", "error", env=env, cwd=project)
    assert plan.returncode == 1
    assert "code changed since the partial output of attempt 1" in plan.stderr
    assert "code: words changed (pipe.py" in plan.stderr
    rebuilt = marin("run", *argv, "--on-code-drift", "rebuild", "-v", env=env, cwd=project)
    assert rebuilt.returncode == 0, rebuilt.stderr
    log = rebuilt.stderr
    assert "clear r7/words@v1: partial output from attempt 1" in log and "ran other code" in log
    assert "clear r7/lazy@v1: partial output from attempt 1" in log
    assert "unseen: lazyhelp (imported inside the function" in log
    assert "resume r7/" not in log
    for step in ("words", "lazy"):
        record = read_record(open_prefix(str(project / "P")), f"r7/{step}/v1")
        assert record is not None and record.result == ['["a", "b", "c"]'], step


def test_a_partial_output_gc_was_deleting_is_never_resumed(tmp_path: Path) -> None:
    """Red team round 12, finding 1: the runner dies at 55; a teammate's ``marin gc`` of
    another pipeline dies while deleting the step (its output half deleted, its attempt
    record and checkpoints left beside gc's mark): the next run starts from 0, and the plan
    says why."""
    from marin.execution.store.records import GC_DELETING, read_status_file
    from tests.ux.helpers import marin

    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    target = "tests/reliability/resumable_pipeline.py:counting"
    env = child_env(MARIN_TEST_COUNTER=str(counter))
    killed = marin("run", target, "--prefix", prefix, env={**env, "MARIN_TEST_KILL_AT": "55"})
    assert killed.returncode == -9 and iterations(counter) == list(range(55))
    other = "tests/reliability/remote_pipelines.py:fan"
    crash = {**env, "MARIN_FAULT_CRASH": "gc-after-record@count"}
    gc = marin("gc", other, "--prefix", prefix, env=crash)
    assert gc.returncode == -9, gc.stderr[-2000:]
    assert read_status_file(open_prefix(prefix), "count/v1")["error"] == GC_DELETING
    assert os.path.exists(f"{prefix}/count/v1.marin/attempt.json")
    plan = marin("plan", target, "--prefix", prefix, env=env)
    assert "is cleared: marin gc was deleting the step and did not finish" in plan.stdout, (
        plan.stdout + plan.stderr
    )
    counter.unlink()
    again = marin("run", target, "--prefix", prefix, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert iterations(counter) == list(range(101))  # from 0: nothing half deleted resumed


def test_a_rebuild_killed_before_it_clears_leaves_no_attempt_to_resume(tmp_path: Path) -> None:
    """Red team round 14, finding 1: a rebuild of a built resumable step wrote its attempt
    record before it cleared the old output; killed while clearing, the next run resumed the
    old output (its checkpoint at 100: nothing ran) and committed it as the new build. The
    record is written once the output is cleared: the next run starts from 0."""
    from tests.ux.helpers import marin

    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    target = "tests/reliability/resumable_pipeline.py:counting"
    env = child_env(MARIN_TEST_COUNTER=str(counter))
    assert marin("run", target, "--prefix", prefix, env=env).returncode == 0
    crash = {**env, "MARIN_FAULT_CRASH": "before-clear@count"}
    killed = marin("run", target, "--prefix", prefix, "--force", "count", env=crash)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not os.path.exists(f"{prefix}/count/v1.marin/attempt.json")
    assert os.path.exists(f"{prefix}/count/v1/checkpoints/state.json")  # the old build's
    plan = marin("plan", target, "--prefix", prefix, env=env)
    assert plan.returncode == 0 and "resume:" not in plan.stdout, plan.stdout + plan.stderr
    counter.unlink()
    again = marin("run", target, "--prefix", prefix, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert iterations(counter) == list(range(101))  # from 0: the old output was never resumed


def test_a_run_without_resumable_retires_an_earlier_attempt(tmp_path: Path) -> None:
    """Red team round 14, finding 2: a run of the step without ``resumable`` cleared the output
    but left the earlier attempt's record and checkpoints; once it failed, the next resumable
    run resumed that old checkpoint (at 50) over the other run's files. The record and the
    checkpoints go before the output is cleared: the next run starts from 0."""
    from tests.ux.helpers import marin

    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    env = child_env(MARIN_TEST_COUNTER=str(counter))
    code, _, err = finish(runner(prefix, {**env, "MARIN_TEST_KILL_AT": "55"}, "ckpt"))
    assert code == -9, err[-3000:]
    assert os.path.exists(f"{prefix}/count/v1.marin/checkpoints")
    plain = "tests/reliability/resumable_pipeline.py:counting_plain"
    died = marin("run", plain, "--prefix", prefix, env=env)  # no checkpoint path: it fails
    assert died.returncode == 1 and "fail count@v1" in died.stderr, died.stderr[-2000:]
    assert not os.path.exists(f"{prefix}/count/v1.marin/attempt.json")
    assert not os.path.exists(f"{prefix}/count/v1.marin/checkpoints")
    counter.unlink()
    code, _, err = finish(runner(prefix, env, "ckpt"))
    assert code == 0, err[-3000:]
    assert iterations(counter) == list(range(101))  # from 0, not from the checkpoint at 50


@pytest.mark.parametrize("placement", [None, 7, ""])
def test_an_attempt_without_a_readable_placement_is_never_resumed(
    tmp_path: Path, placement: object
) -> None:
    """Red team round 15, finding 4: an ``attempt.json`` whose placement was missing, null or a
    number was resumed as "same fingerprint": where it was made is unknown, never the same."""
    from tests.ux.helpers import marin

    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    target = "tests/reliability/resumable_pipeline.py:counting"
    env = child_env(MARIN_TEST_COUNTER=str(counter))
    killed = marin("run", target, "--prefix", prefix, env={**env, "MARIN_TEST_KILL_AT": "55"})
    assert killed.returncode == -9
    path = Path(prefix) / "count/v1.marin/attempt.json"
    data = json.loads(path.read_text())
    data["placement"] = placement
    path.write_text(json.dumps(data))
    plan = marin("plan", target, "--prefix", prefix, env=env)
    assert "it did not record where it was made (placement)" in plan.stdout, plan.stdout
    counter.unlink()
    assert marin("run", target, "--prefix", prefix, env=env).returncode == 0
    assert iterations(counter) == list(range(101))


def _killed_at_55(prefix: str, counter: Path) -> tuple[str, dict[str, str], Path]:
    """The counting step's runner killed at 55 (``marin run``): the CLI target, the
    environment and its ``attempt.json``."""
    from tests.ux.helpers import marin

    target = "tests/reliability/resumable_pipeline.py:counting"
    env = child_env(MARIN_TEST_COUNTER=str(counter))
    killed = marin("run", target, "--prefix", prefix, env={**env, "MARIN_TEST_KILL_AT": "55"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    return target, env, Path(prefix) / "count/v1.marin/attempt.json"


def test_an_attempt_naming_an_input_the_step_lacks_is_never_resumed(tmp_path: Path) -> None:
    """Red team round 16, finding 1: an ``attempt.json`` whose inputs named one the step does
    not have (planted, or from a version of the step with another dependency) was resumed:
    only the step's own inputs were compared. Exact input builds are the same set of inputs:
    the plan says why it is cleared, and the run starts from 0."""
    from tests.ux.helpers import marin

    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    target, env, path = _killed_at_55(prefix, counter)
    data = json.loads(path.read_text())
    assert data["inputs"] == {}  # the step has no inputs
    data["inputs"] = {"ghost@v1": "b" * 32}
    path.write_text(json.dumps(data))
    plan = marin("plan", target, "--prefix", prefix, env=env)
    words = "read other input builds: upstream 'ghost@v1' is not an input of this step"
    assert "clear: partial output from attempt 1 (" in plan.stdout, plan.stdout + plan.stderr
    assert words in plan.stdout and "resume:" not in plan.stdout
    counter.unlink()
    ran = marin("run", target, "--prefix", prefix, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert words in ran.stderr and "resume count@v1" not in ran.stderr
    assert iterations(counter) == list(range(101))  # from 0, not from the checkpoint at 50


@pytest.mark.parametrize(
    ("planted", "why"),
    [
        (b'{"number": 1, "fingerp', "not a JSON object: torn, or edited by hand"),
        (b"[1, 2]", "not a JSON object: torn, or edited by hand"),
        ({"number": "1"}, "its number is missing or not a whole number above 0"),
        ({"fingerprint": 7}, "its fingerprint is missing or not a string"),
        ({"holder": None}, "its holder is missing or not a string"),
    ],
)
def test_the_plan_says_an_unreadable_attempt_is_cleared(
    tmp_path: Path, planted: bytes | dict[str, Any], why: str
) -> None:
    """Red team round 16, finding 2: a torn ``attempt.json``, or one of wrong types, is cleared
    by the run (its recipe is unknown), but ``marin plan`` said nothing of it. The plan (and
    ``--json``) says it is cleared, and why, in the words the run logs."""
    from tests.ux.helpers import marin

    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    target, env, path = _killed_at_55(prefix, counter)
    if isinstance(planted, dict):
        planted = json.dumps({**json.loads(path.read_text()), **planted}).encode()
    path.write_bytes(planted)
    words = f"partial output with an unreadable attempt.json ({why}) is cleared"
    plan = marin("plan", target, "--prefix", prefix, env=env)
    assert f"clear: {words}" in plan.stdout, plan.stdout + plan.stderr
    shown = marin("plan", target, "--prefix", prefix, "--json", env=env)
    (step,) = [s for s in json.loads(shown.stdout)["steps"] if s.get("resume")]
    assert step["resume"]["resume"] is False and words in step["resume"]["reason"]
    counter.unlink()
    ran = marin("run", target, "--prefix", prefix, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"clear count@v1: {words}" in ran.stderr, ran.stderr[-3000:]
    assert iterations(counter) == list(range(101))
