"""Placement options on handles, device assignment, and ``isolate=True`` subprocess runs.

The local scheduler integration (``StepRunner(resources=...)``) is the lead's; here a tiny driver
(`_run_with_pool`) stands in for it, using only the building blocks the scheduler will use:
``ResourcePool.try_acquire``/``release`` and ``assigned_devices`` around the real ``build_step``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from marin.execution.builder.commit import build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.errors import InvalidStepError
from marin.execution.lazy import OUT, ArtifactStep, apply, lower
from marin.execution.pipeline.context import assigned_devices, current_context
from marin.execution.pipeline.isolation import IsolatedCall, StepTimeoutError, TimedCall
from marin.execution.pipeline.resources import ResourcePool, Resources, parse_capacity
from marin.execution.step_spec import StepSpec
from marin.execution.store.lease import read_lease
from marin.execution.store.location import Location, open_prefix
from marin.execution.store.records import FAILED, log_path, read_record, read_status
from tests.conformance.scenarios import read_calls
from tests.pids import exits_within
from tests.resources import resource_pipelines as rp


@pytest.fixture
def location(tmp_path: object) -> Location:
    return open_prefix(str(tmp_path) + "/prefix")


def _run_with_pool(specs: Sequence[StepSpec], pool: ResourcePool, location: Location) -> None:
    """Build independent steps at once, each only while it holds a grant (the lead's loop)."""
    changed = threading.Condition()
    errors: list[BaseException] = []

    def one(spec: StepSpec) -> None:
        with changed:
            while (grant := pool.try_acquire(spec.step_id, spec.resources)) is None:
                changed.wait(30)
        try:
            with assigned_devices(grant.devices):
                build_step(BuildRequest(spec, location))
        except BaseException as exc:
            errors.append(exc)
        finally:
            with changed:
                pool.release(grant)
                changed.notify_all()

    threads = [threading.Thread(target=one, args=(s,)) for s in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_placement_options_are_validated_and_kept_out_of_the_fingerprint() -> None:
    plain = apply("train", rp.whoami, version="v1", out_path=OUT)
    placed = plain.with_options(
        resources={"gpu": 2, "memory": "16GiB", "cpu": 8}, timeout="2h", queue="gpu-a100",
        isolate=True,
    )  # fmt: skip
    a, b = lower(plain), lower(placed)
    assert a.fingerprint == b.fingerprint
    assert b.resources == Resources(cpu=8, memory=16 * 1024**3, gpu=2)
    assert (b.timeout, b.queue, b.isolate) == (7200.0, "gpu-a100", True)
    isolated = b.run  # plain-data inputs: no fingerprint guard around it (lazy._guarded_run)
    assert isinstance(isolated, IsolatedCall) and isolated.fn is rp.whoami
    timed = lower(plain.with_options(timeout=5))
    assert isinstance(timed.run, TimedCall)
    bare = lower(plain).run  # no placement wrapper without options: run(build_config(ctx))
    assert bare.run is plain.run and bare.build_config == plain.build_config


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"resources": {"gpu": "two"}}, "resources.gpu='two' is not an amount"),
        ({"timeout": "soon"}, "timeout='soon' is not a duration"),
        ({"queue": "gpu queue; rm -rf"}, "is not a queue name"),
        ({"queue": ""}, "is not a queue name"),
    ],
)
def test_bad_options_fail_at_with_options_naming_the_step(options: dict, needle: str) -> None:
    step = apply("train", rp.whoami, version="v1", out_path=OUT)
    with pytest.raises(InvalidStepError) as info:
        step.with_options(**options)
    assert needle in str(info.value) and "(step train@v1)" in str(info.value)


def test_isolate_needs_fn_importable_by_reference() -> None:
    def closure(out_path: str) -> None:
        return None

    for fn in (closure, lambda out_path: None):
        step = apply("train", fn, version="v1", out_path=OUT)
        with pytest.raises(InvalidStepError) as info:
            step.with_options(isolate=True)
        text = str(info.value)
        assert "cannot be imported by reference (step train@v1)" in text
        assert "top level of a module" in text
    with pytest.raises(InvalidStepError, match="cannot be imported by reference"):
        ArtifactStep("raw", "v1", run=lambda config: None, isolate=True)


def test_isolated_step_runs_in_a_subprocess_and_commits_through_build_step(
    location: Location,
) -> None:
    spec = lower(apply("who", rp.whoami, version="v1", out_path=OUT).with_options(isolate=True))
    outcome = build_step(BuildRequest(spec, location))
    assert outcome.action == "built"
    assert outcome.record.result["pid"] != os.getpid()
    assert outcome.record.result["cuda"] == ""  # asked for no GPU: sees none
    assert read_record(location, spec.output_path) is not None
    assert os.path.isdir(location.path(spec.output_path))


def test_isolated_errors_and_output_reach_the_runner_and_the_step_log(location: Location) -> None:
    spec = lower(apply("bad", rp.fail, version="v1", message="boom").with_options(isolate=True))
    with pytest.raises(KeyError, match="boom") as info:
        build_step(BuildRequest(spec, location))
    assert any("raised in the isolated process" in n for n in info.value.__notes__)
    assert read_record(location, spec.output_path) is None
    status = read_status(location, spec.output_path)
    assert status is not None and status["state"] == FAILED
    with open(location.path(log_path(spec.output_path))) as f:
        assert "about to fail" in f.read()


def test_isolated_timeout_kills_the_process_and_commits_nothing(
    location: Location, tmp_path: object
) -> None:
    pid_file = os.path.join(str(tmp_path), "pid")
    spec = lower(
        apply("hang", rp.hang, version="v1", pid_file=pid_file).with_options(
            isolate=True, timeout=3
        )
    )
    with pytest.raises(StepTimeoutError) as info:
        build_step(BuildRequest(spec, location))
    assert "timeout of 3s; its process was killed (step hang@v1)" in str(info.value)
    pid = int(open(pid_file).read())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert read_record(location, spec.output_path) is None
    status = read_status(location, spec.output_path)
    assert status is not None and status["state"] == FAILED


def test_a_timeout_without_isolation_fails_the_step(location: Location) -> None:
    rp.RELEASE.clear()
    spec = lower(
        ArtifactStep("slow", "v1", run=lambda config: rp.wait_for_release()).with_options(
            timeout=0.5
        )
    )
    try:
        with pytest.raises(StepTimeoutError, match="cannot be killed"):
            build_step(BuildRequest(spec, location))
    finally:
        rp.RELEASE.set()  # let the abandoned thread finish
    assert read_record(location, spec.output_path) is None


def test_a_file_loaded_pipeline_runs_isolated(location: Location, tmp_path: object) -> None:
    from marin.execution.pipeline.targets import load_target

    path = os.path.join(str(tmp_path), "my_pipe.py")
    with open(path, "w") as f:
        f.write(
            "import os\n"
            "from marin.execution.lazy import OUT, apply\n"
            "def pid(out_path):\n"
            "    return os.getpid()\n"
            "pipeline = apply('pid', pid, version='v1', out_path=OUT).with_options(isolate=True)\n"
        )
    (handle,) = load_target(f"{path}:pipeline")
    outcome = build_step(BuildRequest(lower(handle), location))
    assert outcome.record.result != os.getpid()


def test_a_partial_of_a_file_loaded_pipelines_function_runs_isolated(
    location: Location, tmp_path: Path
) -> None:
    """Red team r30-3: ``partial(gen, k=1)`` from a pipeline loaded by its file failed every
    time in the child (``No module named 'marin_target_...'``): the child loaded the module of
    the partial's type (``functools``), not of its function."""
    from marin.execution.pipeline.targets import load_target

    path = tmp_path / "partial_pipe.py"
    path.write_text(
        "import dataclasses, functools\n"
        "from marin.execution.lazy import OUT, apply\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class Scale:\n"
        "    k: int\n"
        "def gen(out_path, k, scale):\n"
        "    return k * scale.k\n"
        "pipeline = apply('gen', functools.partial(gen, k=3), version='v1', out_path=OUT,\n"
        "                 scale=functools.partial(Scale, 2)()).with_options(isolate=True)\n"
    )
    (handle,) = load_target(f"{path}:pipeline")
    assert build_step(BuildRequest(lower(handle), location)).record.result == 6


def test_an_isolated_step_whose_source_was_edited_after_lowering_fails_and_commits_nothing(
    location: Location, tmp_path: Path
) -> None:
    """Round 24 finding 4: the child imports ``fn`` when the step starts, while the record names
    the code digest of the lowering. The source edited in between (a long run) made the child
    build the edited code under the lowered code's digest; it now checks, as a remote job
    does, and the attempt fails naming the step and the fix, with nothing committed."""
    from marin.execution.pipeline.targets import load_target

    path = tmp_path / "edited_pipe.py"
    path.write_text(
        "from marin.execution.lazy import OUT, apply\n"
        "def word(out_path):\n"
        "    return 'ORIGINAL'\n"
        "pipeline = apply('word', word, version='v1', out_path=OUT).with_options(isolate=True)\n"
    )
    (handle,) = load_target(f"{path}:pipeline")
    spec = lower(handle)
    path.write_text(path.read_text().replace("'ORIGINAL'", "'EDITED'"))
    with pytest.raises(RuntimeError) as info:
        build_step(BuildRequest(spec, location))
    text = str(info.value)
    assert text.startswith("marin.execution.errors.CodeChangedError: error: the isolated process")
    assert "runs other code than the run lowered: word changed between the run's lowering" in text
    assert "(step word@v1)" in text and "run again" in text and "PYTHONHASHSEED=0" in text
    assert read_record(location, spec.output_path) is None
    status = read_status(location, spec.output_path)
    assert (
        status is not None and status["state"] == FAILED and "CodeChangedError" in status["error"]
    )
    sys.modules.pop("marin_target_edited_pipe")  # the next run (a new process) lowers the edit
    (again,) = load_target(f"{path}:pipeline")
    assert build_step(BuildRequest(lower(again), location)).record.result == "EDITED"


def test_a_config_class_edited_after_lowering_fails_an_isolated_step_and_a_worker_check(
    location: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r29-3: the child checked ``fn``'s code only, not the methods of its config's
    classes, which the record's digest counts: ``Cfg.scaled`` edited while the step started
    was built under the lowered digest (and served once the edit was reverted)."""
    from marin.execution.errors import CodeChangedError
    from marin.execution.pipeline.lower import code_inputs
    from marin.execution.pipeline.targets import load_target
    from marin.execution.remote.code_check import check_code, expected_code

    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "scaled_cfg.py"
    cfg.write_text(
        "from dataclasses import dataclass\n\n\n@dataclass(frozen=True)\nclass Cfg:\n"
        "    k: int\n\n    def scaled(self):\n        return self.k * 10\n"
    )
    path = tmp_path / "scaled_pipe.py"
    path.write_text(
        "from marin.execution.lazy import OUT, apply\n"
        "from scaled_cfg import Cfg\n"
        "def gen(out_path, cfg):\n"
        "    return cfg.scaled()\n"
        "plain = apply('gen', gen, version='v1', out_path=OUT, cfg=Cfg(1))\n"
        "pipeline = plain.with_options(isolate=True)\n"
    )
    (handle,) = load_target(f"{path}:pipeline")
    spec = lower(handle)
    assert spec.code is not None and [p.name for p in spec.code.parts] == ["gen", "Cfg"]
    sent = lower(load_target(f"{path}:plain")[0])  # a Dask worker's spec runs fn in-process
    assert sent.code is not None
    check_code(sent.run, code_inputs(sent.run), expected=expected_code(sent.step_id, sent.code))
    cfg.write_text(cfg.read_text().replace("* 10", "* 20"))
    later = cfg.stat().st_mtime_ns + 10**9  # an edit a second later (not within mtime's tick)
    os.utime(cfg, ns=(later, later))
    with pytest.raises(RuntimeError) as info:
        build_step(BuildRequest(spec, location))
    assert "CodeChangedError" in str(info.value) and "Cfg changed" in str(info.value)
    assert read_record(location, spec.output_path) is None
    # The same check a Dask worker makes of the spec it was sent:
    with pytest.raises(CodeChangedError, match="Cfg") as edited:
        check_code(
            sent.run, code_inputs(sent.run), expected=expected_code(sent.step_id, sent.code),
            where="Dask worker",
        )  # fmt: skip
    assert "PYTHONHASHSEED" not in str(edited.value)  # an edit was seen: no other cause to name


def test_gpu_steps_get_distinct_devices_and_cuda_visible_devices(
    location: Location, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capacity gpu=2 on a CPU-only machine: 4 isolated 1-GPU steps, never 2 on one device."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    calls = os.path.join(str(tmp_path), "calls.jsonl")
    steps = [
        apply(f"eval/{i}", rp.wait_for_peers, version="v1", calls=calls, step=f"eval/{i}",
              peers=2, out_path=OUT).with_options(
            resources={"gpu": 1, "cpu": 0.5}, isolate=True
        )
        for i in range(4)
    ]  # fmt: skip
    specs = lower(steps)
    pool = ResourcePool(parse_capacity("cpu=2,gpu=2"))
    t0 = time.monotonic()
    _run_with_pool(specs, pool, location)
    assert time.monotonic() - t0 < 110
    results = [read_record(location, s.output_path) for s in specs]
    devices = {r.result["cuda"] for r in results if r is not None}
    assert devices == {"0", "1"}
    assert len({r.result["pid"] for r in results if r is not None}) == 4
    peak, per_device = rp.overlaps(read_calls(calls))
    assert peak == 2  # the cap is reached and never exceeded
    assert per_device == {"0": 1, "1": 1}  # no device used twice at once
    assert pool.peak() == {"cpu": 1.0, "gpu": 2.0}
    for spec in specs:
        with open(location.path(log_path(spec.output_path))) as f:
            assert "ran with CUDA_VISIBLE_DEVICES=" in f.read()


def test_devices_reach_the_context_of_a_thread_step(location: Location) -> None:
    seen: list[tuple[int, ...]] = []
    spec = lower(
        ArtifactStep("ctx", "v1", run=lambda config: seen.append(current_context().devices))
    )
    with assigned_devices((1, 3)):
        build_step(BuildRequest(spec, location))
    assert seen == [(1, 3)]


def test_a_function_of_a_script_run_as_main_runs_isolated(tmp_path: Path) -> None:
    """``python my_pipeline.py``: fn lives in ``__main__``; the child loads the script under
    ``__mp_main__`` (as multiprocessing's spawn does), so its main block does not run twice."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(
        "import os\n"
        "from marin.execution.lazy import OUT, apply, resolve\n"
        "def work(out_path):\n"
        "    print('child says hi')\n"
        "    return os.getpid()\n"
        "if __name__ == '__main__':\n"
        "    print('main block ran')\n"
        "    step = apply('w', work, version='v1', out_path=OUT).with_options(isolate=True)\n"
        f"    a = resolve(step, prefix={str(tmp_path / 'p')!r})\n"
        "    print('child pid differs:', a.record.result != os.getpid())\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "child pid differs: True" in result.stdout
    assert result.stdout.count("main block ran") == 1
    log = (tmp_path / "p" / "w" / "v1.marin" / "log.txt").read_text()
    assert "child says hi" in log and "main block ran" not in log


def _helper_pids(pid_file: str) -> tuple[int, int, int]:
    in_group, own_session, child = (int(p) for p in open(pid_file).read().split())
    return in_group, own_session, child


def test_an_isolated_step_that_leaves_helpers_running_ends_them_and_does_not_wait(
    location: Location, tmp_path: object
) -> None:
    """Issue 43 item 6: fn starts helpers that hold its stdout open and returns; the build
    ends at once (not when the helpers close the pipe), and the step's process group is gone."""
    pid_file = os.path.join(str(tmp_path), "pids")
    step = apply("serve", rp.start_helpers, version="v1", pid_file=pid_file)
    spec = lower(step.with_options(isolate=True, timeout=120))
    done = threading.Event()
    builder = threading.Thread(
        target=lambda: (build_step(BuildRequest(spec, location)), done.set()), daemon=True
    )
    builder.start()
    finished = done.wait(60)
    in_group, own_session, _ = _helper_pids(pid_file)
    try:
        assert finished, "the build waited for fn's helper processes"
        assert read_record(location, spec.output_path) is not None
        assert exits_within(in_group, 30)  # the step's process group ended with the step
        with open(location.path(log_path(spec.output_path))) as f:
            assert "helpers started" in f.read()
    finally:
        for pid in (in_group, own_session):  # the one in its own session is out of reach
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_an_isolated_step_that_times_out_ends_its_helpers_too(
    location: Location, tmp_path: object
) -> None:
    pid_file = os.path.join(str(tmp_path), "pids")
    step = apply("serve", rp.start_helpers, version="v1", pid_file=pid_file, then_hang=True)
    spec = lower(step.with_options(isolate=True, timeout=3))
    started = time.monotonic()
    try:
        with pytest.raises(StepTimeoutError, match="timeout of 3s; its process was killed"):
            build_step(BuildRequest(spec, location))
        assert time.monotonic() - started < 30
        in_group, _, child = _helper_pids(pid_file)
        assert exits_within(child, 30) and exits_within(in_group, 30)
        assert read_record(location, spec.output_path) is None
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            os.kill(_helper_pids(pid_file)[1], signal.SIGKILL)


@pytest.fixture
def attempts() -> Iterator[None]:
    rp.ATTEMPTS.clear()
    rp.RELEASE.clear()
    rp.LATE_WRITTEN.clear()
    yield
    rp.RELEASE.set()  # let any abandoned attempt finish


def test_a_timeout_with_retries_and_no_isolation_is_refused(tmp_path: Path, attempts: None) -> None:
    """Issue 43 item 7: attempt 1 timed out, the retry cleared the output, attempt 1's thread
    wrote into it late, and the commit held both attempts' files. The combination is refused
    before anything runs; isolated, a timeout kills the attempt, so retries are fine."""
    from marin.execution.step_runner import StepRunner

    step = apply("mix", rp.write_per_attempt, version="v1", out_path=OUT)
    runner = StepRunner(prefix=str(tmp_path / "p"))
    with pytest.raises(InvalidStepError) as info:
        runner.run(lower(step.with_options(timeout=0.5, retries=1)))
    text = str(info.value)
    assert "timeout=0.5 with retries=1" in text and "(step mix@v1)" in text
    assert "use isolate=True so a timeout can kill the attempt" in text
    assert rp.ATTEMPTS == []
    assert lower(step.with_options(timeout=0.5, retries=1, isolate=True)).retries == 1


def test_a_timed_out_thread_holds_the_lease_until_it_returns(
    location: Location, attempts: None
) -> None:
    """Without retries, a later build of the step must not clear and fill the output while the
    abandoned thread can still write into it: the lease stays held until that fn returns."""
    spec = lower(
        apply("late", rp.write_per_attempt, version="v1", out_path=OUT).with_options(timeout=0.5)
    )
    with pytest.raises(StepTimeoutError, match="cannot be killed"):
        build_step(BuildRequest(spec, location))
    held = read_lease(location, spec.output_path)
    assert held is not None and not held.expired  # the abandoned fn still runs
    done = threading.Event()
    outcome: dict[str, object] = {}

    def build_again() -> None:
        try:
            outcome["built"] = build_step(BuildRequest(spec, location)).action
        except BaseException as exc:
            outcome["error"] = exc
        done.set()

    threading.Thread(target=build_again, daemon=True).start()
    rp.RELEASE.set()  # attempt 1 writes its late file and returns; only then may the next build
    assert done.wait(60) and outcome == {"built": "built"}
    assert sorted(os.listdir(location.path(spec.output_path))) == ["attempt-2"]


def test_an_isolated_error_the_runner_cannot_unpickle_keeps_its_type_and_message(
    location: Location,
) -> None:
    """Issue 43 item 12: the parent's unpickling TypeError hid the real error."""
    spec = lower(apply("odd", rp.fail_oddly, version="v1").with_options(isolate=True))
    with pytest.raises(RuntimeError) as info:
        build_step(BuildRequest(spec, location))
    assert str(info.value) == (
        "tests.resources.resource_pipelines.NeedsTwo: tokenize failed: no vocab"
    )
    notes = "\n".join(info.value.__notes__)
    assert "raised in the isolated process of step odd@v1" in notes
    assert 'raise NeedsTwo("tokenize", "no vocab")' in notes
    status = read_status(location, spec.output_path)
    assert status is not None and "NeedsTwo" in status["error"]
