"""Remote steps on the ``local`` backend: real driver processes, real detached jobs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from marin.execution.errors import InvalidStepError
from marin.execution.lazy import OUT, apply, lower
from marin.execution.remote.procs import start_time
from marin.execution.run.remote_slots import Slots
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.step_folder import JobRecord, create_job, read_job
from tests.reliability import remote_pipelines
from tests.reliability.conftest import REPO, child_env
from tests.reliability.pipelines import wait_for_file

TRAIN = "remote/train/v1"


def marin_run(
    target: str, prefix: str, env: dict[str, str], err: Path, *extra: str
) -> subprocess.Popen[str]:
    cli = [
        sys.executable,
        "-m",
        "marin.cli",
        "run",
        f"tests/reliability/remote_pipelines.py:{target}",
    ]
    return subprocess.Popen(
        [*cli, "--prefix", prefix, *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err.open("w"),
        text=True,
        start_new_session=True,
    )


def marin_cli(
    command: str, target: str, prefix: str, env: dict[str, str], *extra: str, ok: bool = True
) -> str:
    where = (
        [f"tests/reliability/remote_pipelines.py:{target}", "--prefix", prefix]
        if target
        else [prefix]
    )
    done = subprocess.run(
        [sys.executable, "-m", "marin.cli", command, *where, *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode == 0) == ok, done.stderr
    return done.stdout


def wait_for_text(path: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert time.monotonic() < deadline, (
            f"{text!r} never appeared in {path}:\n{path.read_text()}"
        )
        time.sleep(0.01)


def setup(tmp_path: Path, **extra: str) -> tuple[str, dict[str, str]]:
    """The prefix (``tmp_path/prefix``) and the environment of a test's drivers and jobs;
    local jobs' folders go to ``tmp_path/jobs`` (``job_folders``)."""
    (tmp_path / "started").mkdir()
    env = child_env(
        MARIN_TEST_CALLS=str(tmp_path / "calls"),
        MARIN_TEST_STARTED=str(tmp_path / "started"),
        MARIN_TEST_GATE=str(tmp_path / "gate"),
        MARIN_REMOTE_POLL_MAX_S="0.2",
        MARIN_LOCAL_JOBS=str(tmp_path / "jobs"),
        **extra,
    )
    return str(tmp_path / "prefix"), env


def setup_prefect(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """``setup`` for a flow run in a child process: its own ephemeral Prefect server under
    ``tmp_path/prefect-home`` (no ``PREFECT_API_URL`` inherited)."""
    home = tmp_path / "prefect-home"
    prefix, env = setup(
        tmp_path,
        PREFECT_HOME=str(home),
        PREFECT_SERVER_MEMO_STORE_PATH=str(home / "memo_store.toml"),
        PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(home / "storage"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="90",
    )
    env.pop("PREFECT_API_URL", None)
    return prefix, env


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def job_folders(prefix: str) -> list[str]:
    """The local jobs' folders of a test ``setup`` made (beside its prefix)."""
    jobs = Path(prefix).parent / "jobs"
    return sorted(p for p in os.listdir(jobs) if p.startswith("marin-")) if jobs.is_dir() else []


def driver_killed_while_its_job_runs(tmp_path: Path, prefix: str, env: dict[str, str]) -> int:
    """SIGKILL ``marin run`` of ``chain`` once its training job runs; the job's pid."""
    first = marin_run("chain", prefix, env, tmp_path / "first.err")
    started = tmp_path / "started" / "remote_train"
    wait_for_file(str(started), timeout=60)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    wait_for_text(started, "\n")  # created a moment before its line is written
    return int(started.read_text().split()[0])


def test_sigkilled_driver_reattaches_one_job(tmp_path: Path) -> None:
    """SIGKILL ``marin run`` while the job runs: the next run reattaches; fn ran once."""
    prefix, env = setup(tmp_path)
    job_pid = driver_killed_while_its_job_runs(tmp_path, prefix, env)
    assert start_time(job_pid) is not None  # the job outlived its driver
    plan = marin_cli("plan", "chain", prefix, env, "--json")
    shown = next(s["job"] for s in json.loads(plan)["steps"] if s["step"] == "remote/train@v1")
    assert shown["state"] == "running" and shown["job_id"] == job_folders(prefix)[0]
    second = marin_run("chain", prefix, env, tmp_path / "second.err")
    wait_for_text(tmp_path / "second.err", "reattach remote/train@v1")
    (tmp_path / "gate").touch()
    assert second.wait(timeout=60) == 0, (tmp_path / "second.err").read_text()
    assert calls(tmp_path) == [f"remote/train {job_pid}"]  # fn ran once
    location = open_prefix(prefix)
    record = read_record(location, TRAIN)
    job = read_job(location, TRAIN)
    assert record is not None and job is not None
    assert record.provenance["job"]["job_id"] == job.job_id
    assert job_folders(prefix) == []  # committed: the job's files are gone (cleanup.py)
    assert record.result == {"pid": job_pid}
    assert read_record(location, "remote/eval/v1") is not None  # downstream built from it
    assert "submit remote/train" not in (tmp_path / "second.err").read_text()
    shown = marin_cli("show", "", f"{prefix}/{TRAIN}", env)
    assert f"job          local job {job.job_id}" in shown


def test_driver_killed_right_after_the_submit_is_followed_by_a_reattach(tmp_path: Path) -> None:
    """The ``after-submit`` crash point: the driver dies once ``job.json`` names the submitted
    job; the next run reattaches to that job (one submission, fn ran once)."""
    prefix, env = setup(tmp_path)
    crash = {**env, "MARIN_FAULT_CRASH": "after-submit@remote/train"}
    first = marin_run("chain", prefix, crash, tmp_path / "first.err")
    assert first.wait(timeout=60) == -signal.SIGKILL, (tmp_path / "first.err").read_text()
    job = read_job(open_prefix(prefix), TRAIN)
    assert job is not None and job.job_id == job_folders(prefix)[0]
    second = marin_run("chain", prefix, env, tmp_path / "second.err")
    wait_for_text(tmp_path / "second.err", f"reattach remote/train@v1: local job {job.job_id}")
    (tmp_path / "gate").touch()
    assert second.wait(timeout=60) == 0, (tmp_path / "second.err").read_text()
    assert len(calls(tmp_path)) == 1  # fn ran once
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.provenance["job"]["job_id"] == job.job_id
    assert "submit remote/train" not in (tmp_path / "second.err").read_text()


def test_a_job_of_another_config_is_cancelled_never_reattached(tmp_path: Path) -> None:
    """The driver dies while its job runs; the config changes (same version): the next run
    stops that job and builds the new config in a job of its own, never collecting the old."""
    prefix, env = setup(tmp_path)
    old_pid = driver_killed_while_its_job_runs(tmp_path, prefix, env)
    changed = {**env, "MARIN_TEST_VARIANT": "b"}
    assert "cancel (another config): local job" in marin_cli("plan", "chain", prefix, changed)
    second = marin_run("chain", prefix, changed, tmp_path / "second.err")
    wait_for_text(tmp_path / "second.err", "submit remote/train@v1")
    assert "another config" in (tmp_path / "second.err").read_text()
    assert start_time(old_pid) is None  # stopped before its output was cleared
    (tmp_path / "gate").touch()
    assert second.wait(timeout=60) == 0, (tmp_path / "second.err").read_text()
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.result["variant"] == "b"
    assert record.result["pid"] != old_pid and len(calls(tmp_path)) == 2


def test_waiting_remote_steps_hold_no_slot(tmp_path: Path) -> None:
    """max_concurrent=1, three remote steps that each wait for all three: they can only finish
    if all three jobs run at once (a barrier, not a stopwatch)."""
    (tmp_path / "barrier").mkdir()
    prefix, env = setup(tmp_path, MARIN_TEST_BARRIER=str(tmp_path / "barrier"))
    del env["MARIN_TEST_GATE"]
    proc = marin_run("fan", prefix, env, tmp_path / "err", "--max-concurrent", "1")
    assert proc.wait(timeout=90) == 0, (tmp_path / "err").read_text()
    assert sorted(os.listdir(tmp_path / "barrier")) == ["fan_a", "fan_b", "fan_c"]


def test_max_remote_bounds_jobs_and_not_local_steps() -> None:
    """The loop's two bounds: remote jobs count against max_remote only, local steps against
    max_concurrent only."""
    slots = Slots(1, 2, lambda path: path.startswith("r"))
    assert slots.free({"r1", "l1"}) == 1  # one job slot left, no local slot
    assert not slots.admit("l2") and slots.admit("r2") and not slots.admit("r3")
    assert slots.free(set()) == 3
    assert slots.admit("l1") and slots.admit("r1") and slots.admit("r2") and not slots.admit("l2")


@pytest.mark.parametrize("retries", [0, 1])
def test_failing_job_fails_step_with_log_tail_and_retry_submits_anew(
    tmp_path: Path, retries: int
) -> None:
    """A job whose fn raises fails the step, naming the job and its log; retries=1 submits a
    second job, which commits."""
    (tmp_path / "fail").touch()
    prefix, env = setup(
        tmp_path, MARIN_TEST_FAIL=str(tmp_path / "fail"), MARIN_TEST_RETRIES=str(retries)
    )
    del env["MARIN_TEST_GATE"]
    proc = marin_run("chain", prefix, env, tmp_path / "err")
    code = proc.wait(timeout=60)
    err = (tmp_path / "err").read_text()
    location = open_prefix(prefix)
    if retries == 0:
        assert code != 0 and read_record(location, TRAIN) is None
        assert "local job marin-" in err and "failed: RuntimeError: loss is nan" in err
        assert re.search(r"last lines of its log:\W+training diverged", err)  # the log tail
        assert "training diverged" in (Path(prefix) / f"{TRAIN}.marin" / "log.txt").read_text()
        assert read_job(location, TRAIN) is None  # the next run submits a new job
        (tmp_path / "fail").touch()
        report = json.loads(marin_cli("run", "chain", prefix, env, "--json", ok=False))
        failed = next(s for s in report["steps"] if s["step"] == "remote/train@v1")
        assert failed["action"] == "failed" and failed["job"]["job_id"].startswith("marin-")
        assert job_folders(prefix) == []  # a failed job's files go once its tail is in log.txt
        assert len(calls(tmp_path)) == 2
        return
    assert code == 0, err
    report = json.loads(marin_cli("run", "chain", prefix, env, "--json"))  # all built now
    assert all("job" not in step for step in report["steps"])  # a served step ran no job
    record = read_record(location, TRAIN)
    assert record is not None and len(calls(tmp_path)) == 2 and job_folders(prefix) == []
    assert record.provenance["job"]["job_id"].startswith("marin-")


def test_a_job_killed_by_a_signal_names_it(tmp_path: Path) -> None:
    """Issue 55: a ``local`` job's process SIGKILLed from outside (as the OOM killer does) was
    "lost: its process ended without a result". Its watcher names the signal, in the driver's
    error (``max_preemptions=0``: no resubmit) and in ``marin ls``."""
    prefix, env = setup(tmp_path, MARIN_TEST_MAX_PREEMPTIONS="0")
    driver = marin_run("chain", prefix, env, tmp_path / "err")
    started = tmp_path / "started" / "remote_train"
    wait_for_file(str(started), timeout=60)
    wait_for_text(started, "\n")
    os.kill(int(started.read_text().split()[0]), signal.SIGKILL)  # the job's process alone
    assert driver.wait(timeout=60) == 1
    err = (tmp_path / "err").read_text()
    killed = r"local job marin-\w+ failed: ended lost \(its process was killed by SIGKILL\)"
    assert re.search(killed, err), err
    ls = [sys.executable, "-m", "marin.cli", "ls", "--prefix", prefix]
    listed = subprocess.run(ls, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert "its process was killed by SIGKILL" in listed.stdout, listed


def test_a_preemption_past_max_preemptions_is_not_retried_under_retries(
    tmp_path: Path,
) -> None:
    """Red team gang2 F3: ``max_preemptions=0, retries=2`` and the job SIGKILLed: the step
    fails at once, one job submitted; ``retries`` count only ``fn``'s errors, never a loss
    past its budget (the error is final, ``is_final``, on every runner)."""
    prefix, env = setup(tmp_path, MARIN_TEST_MAX_PREEMPTIONS="0", MARIN_TEST_RETRIES="2")
    driver = marin_run("chain", prefix, env, tmp_path / "err")
    started = tmp_path / "started" / "remote_train"
    wait_for_file(str(started), timeout=60)
    wait_for_text(started, "\n")
    os.kill(int(started.read_text().split()[0]), signal.SIGKILL)
    (tmp_path / "gate").touch()  # a wrongful retry's job would now succeed
    assert driver.wait(timeout=60) == 1
    err = (tmp_path / "err").read_text()
    assert "after 0 preemptions (max_preemptions=0)" in err, err
    assert "retry remote/train@v1" not in err, err
    assert len(calls(tmp_path)) == 1 and read_record(open_prefix(prefix), TRAIN) is None


def test_lost_lease_cancels_the_job_and_never_commits(tmp_path: Path) -> None:
    """A stalls (heartbeat paused) until B takes over and reattaches; A wakes, finds its lease
    lost, cancels its job and commits nothing; B sees the job stopped, submits anew, commits."""
    prefix, env = setup(tmp_path, MARIN_LEASE_TTL="1")
    resume = tmp_path / "resume"
    a_env = {**env, "MARIN_FAULT_PAUSE_HEARTBEAT": f"until:{resume}"}
    a = marin_run("chain", prefix, a_env, tmp_path / "a.err")
    wait_for_file(str(tmp_path / "started" / "remote_train"))
    first_job = job_folders(prefix)[0]
    b = marin_run("chain", prefix, env, tmp_path / "b.err")
    wait_for_text(tmp_path / "b.err", f"reattach remote/train@v1: local job {first_job}")
    resume.touch()
    wait_for_file(str(tmp_path / "jobs" / first_job / "cancelled"))
    (tmp_path / "gate").touch()
    assert b.wait(timeout=60) == 0, (tmp_path / "b.err").read_text()
    a.wait(timeout=60)
    assert "lost the lease while local job" in (tmp_path / "a.err").read_text()
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.provenance["job"]["job_id"] != first_job
    # The cancelled job's folder stays (it never ended with a result); the committed one's goes.
    assert job_folders(prefix) == [first_job] and len(calls(tmp_path)) == 2


def test_job_record_create_holds_between_racing_drivers_on_s3(s3_server: dict[str, str]) -> None:
    """Two drivers past the lease: one job.json create wins; the other reads the winner's."""
    os.environ.update(s3_server)
    location = open_prefix(f"s3://marin-tests/remote-{os.getpid()}-{time.time_ns()}")
    barrier = threading.Barrier(8)
    won: list[str] = []

    def race(i: int) -> None:
        mine = JobRecord("local", f"job-{i}", f"build-{i}", "now", {})
        barrier.wait()
        won.append(create_job(location, "s/v1", mine).job_id)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(won)) == 1 and read_job(location, "s/v1").job_id == won[0]  # type: ignore[union-attr]


def test_remote_option_is_checked_and_not_fingerprinted() -> None:
    plain = apply("m/train", remote_pipelines.train, version="v1", data="d", out_path=OUT)
    remote = plain.with_options(remote="local")
    assert lower(remote).fingerprint == lower(plain).fingerprint
    with pytest.raises(
        InvalidStepError, match=r"remote='nope' names no registered backend.*m/train"
    ):
        lower(plain.with_options(remote="nope"))
    with pytest.raises(InvalidStepError, match="drop timeout="):
        lower(plain.with_options(remote="local", timeout=5))
    inline = apply("m/x", lambda out_path: 1, version="v1", out_path=OUT)
    with pytest.raises(InvalidStepError, match="cannot be imported by reference"):
        lower(inline.with_options(remote="local"))


def test_ctrl_c_names_the_running_job_and_the_next_run_reattaches(tmp_path: Path) -> None:
    prefix, env = setup(tmp_path)
    first = marin_run("chain", prefix, env, tmp_path / "first.err")
    wait_for_file(str(tmp_path / "started" / "remote_train"))
    job = job_folders(prefix)[0]
    first.send_signal(signal.SIGINT)
    first.wait(timeout=30)
    err = (tmp_path / "first.err").read_text()
    assert f"local job {job} of remote/train@v1 keeps running" in err and "reattaches" in err
    (tmp_path / "gate").touch()
    second = marin_run("chain", prefix, env, tmp_path / "second.err")
    assert second.wait(timeout=60) == 0, (tmp_path / "second.err").read_text()
    assert f"reattach remote/train@v1: local job {job}" in (tmp_path / "second.err").read_text()
    assert len(calls(tmp_path)) == 1 and job_folders(prefix) == []


def test_the_example_trains_as_a_local_job(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "marin.cli", "run", "examples/remote_train.py:pipeline",
         "--prefix", str(tmp_path / "p")],
        cwd=REPO, env=child_env(MARIN_EXAMPLE_PACE="0"), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = read_record(open_prefix(str(tmp_path / "p")), "linear/train/v1")
    assert record is not None and record.provenance["job"]["backend"] == "local"
    assert record.result == {"w": 3.0, "b": 0.998}


def test_a_hostile_job_record_is_never_followed(tmp_path: Path) -> None:
    """job.json is untrusted: a record naming a folder or id Marin never writes is replaced by
    a job of the build's own, and nothing is read from where it points."""
    from marin.execution.builder.commit import build_step
    from marin.execution.builder.request import BuildRequest
    from marin.execution.store.step_folder import job_path

    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "result.pkl").write_bytes(b"not a pickle Marin wrote")
    location = open_prefix(str(tmp_path / "prefix"))
    spec = apply("h/train", remote_pipelines.train, version="v1", data="d", out_path=OUT)
    spec = spec.with_options(remote="local").lower()
    hostile = JobRecord("local", "evil", "b", "now", {"workdir": str(tmp_path)})
    create_job(location, spec.output_path, hostile)
    outcome = build_step(BuildRequest(spec, location))
    assert outcome.record.provenance["job"]["job_id"] != "evil"
    assert json.loads(Path(location.path(job_path(spec.output_path))).read_text())["job_id"] != (
        "evil"
    )
