"""The one run loop through ``StepRunner``: local retries, served steps re-checked when served,
and the run options checked once (local disk and memory://)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import fsspec
import pytest

from marin.execution.errors import InvalidStepError, PipelineFailedError, StepFailedError
from marin.execution.lazy import OUT, apply, lower
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import metadata_dir, read_record
from marin.execution.vocabulary import Wait


class Attempts:
    """Counts each step's calls, and fails the first ``failing`` calls of the steps named."""

    def __init__(self, failing: dict[str, int] | None = None) -> None:
        self.failing = dict(failing or {})
        self.calls: dict[str, int] = {}

    def fn(self, name: str) -> Any:
        def step(deps: Any, out_path: str) -> str:
            self.calls[name] = self.calls.get(name, 0) + 1
            for dep in deps:
                fs, path = fsspec.core.url_to_fs(dep)
                if not fs.exists(path):
                    raise FileNotFoundError(f"{name}: input {dep} is gone")
            if self.calls[name] <= self.failing.get(name, 0):
                raise RuntimeError(f"{name}: attempt {self.calls[name]} fails")
            with fsspec.open(out_path, "w", auto_mkdir=True) as f:
                f.write(name)
            return name

        step.__qualname__ = f"attempts_{name}"
        return step


def runner(prefix: str, listener: Any = None, **options: Any) -> StepRunner:
    r = StepRunner(RunOptions(**options), prefix=prefix, listener=listener)
    r.retry_delay_s = 0.01  # the backoff itself is not under test
    return r


def by_step(report: Any) -> dict[str, dict[str, Any]]:
    return {s["step"]: s for s in json.loads(json.dumps(report.to_json()))["steps"]}


# -- retries ---------------------------------------------------------------------------------


def test_local_runner_retries_a_failed_step(prefix: str, caplog: Any) -> None:
    attempts = Attempts({"flaky": 2, "once": 1})
    root = apply("r/root", attempts.fn("root"), version="v0", deps=[], out_path=OUT)
    flaky = apply(
        "r/flaky", attempts.fn("flaky"), version="v0", deps=[root], out_path=OUT
    ).with_options(retries=2)
    after = apply("r/after", attempts.fn("after"), version="v0", deps=[flaky], out_path=OUT)
    once = apply("r/once", attempts.fn("once"), version="v0", deps=[root], out_path=OUT)
    with (
        caplog.at_level(logging.INFO, logger="marin"),
        pytest.raises(PipelineFailedError, match="r/once@v0") as caught,
    ):
        runner(prefix, keep_going=True).run(lower([after, once]))
    # Retried as declared, and only as declared (no retries: one attempt).
    assert attempts.calls == {"root": 1, "flaky": 3, "after": 1, "once": 1}
    steps = by_step(caught.value.report)
    assert (steps["r/once@v0"]["action"], steps["r/once@v0"]["attempts"]) == ("failed", 1)
    assert steps["r/flaky@v0"]["action"] == "built" and steps["r/flaky@v0"]["attempts"] == 3
    assert steps["r/root@v0"]["attempts"] == 1 and steps["r/after@v0"]["attempts"] == 1
    assert "retry r/flaky@v0 (attempt 2 of 3)" in caplog.text
    assert "retry r/flaky@v0 (attempt 3 of 3)" in caplog.text
    assert read_record(open_prefix(prefix), lower(flaky).output_path) is not None


def test_retries_exhausted_fail_the_run_with_the_last_error(prefix: str) -> None:
    attempts = Attempts({"flaky": 5})
    flaky = apply(
        "r/flaky", attempts.fn("flaky"), version="v0", deps=[], out_path=OUT
    ).with_options(retries=1)
    with pytest.raises(StepFailedError, match="attempt 2 fails") as caught:
        runner(prefix).run(lower([flaky]))
    assert attempts.calls == {"flaky": 2}
    flaky_result = by_step(caught.value.report)["r/flaky@v0"]
    assert (flaky_result["action"], flaky_result["attempts"]) == ("failed", 2)


# -- a served step is re-checked when served --------------------------------------------------


class DeleteOnPlan:
    """A real progress listener hook used to inject the fault: right after the plan, another
    process deletes ``output_path``'s record and output (done here, with the storage API)."""

    def __init__(self, prefix: str, output_path: str) -> None:
        self.location = open_prefix(prefix)
        self.output_path = output_path

    def on_plan(self, total: int, skipped: int) -> None:
        self.location.remove_tree(self.location.path(metadata_dir(self.output_path)))
        self.location.remove_tree(self.location.path(self.output_path))

    def on_start(self, spec: Any) -> None: ...
    def on_finish(self, outcome: Any) -> None: ...
    def on_fail(self, spec: Any, error: BaseException) -> None: ...


def test_served_step_deleted_after_the_plan_is_rebuilt(prefix: str, caplog: Any) -> None:
    attempts = Attempts()
    base = apply("s/base", attempts.fn("base"), version="v0", deps=[], out_path=OUT)
    top = apply("s/top", attempts.fn("top"), version="v0", deps=[base], out_path=OUT)
    runner(prefix).run(lower([base]))
    base_path = lower(base).output_path
    with caplog.at_level(logging.WARNING, logger="marin"):
        report = runner(prefix, listener=DeleteOnPlan(prefix, base_path)).run(lower([top]))
    assert attempts.calls == {"base": 2, "top": 1}
    steps = by_step(report)
    assert steps["s/base@v0"]["action"] == "built"
    assert steps["s/top@v0"]["action"] == "built"
    assert "its record is gone" in caplog.text
    location = open_prefix(prefix)
    rebuilt = read_record(location, base_path)
    assert rebuilt is not None
    top_record = read_record(location, lower(top).output_path)
    assert top_record is not None and top_record.inputs == {"s/base@v0": rebuilt.build_id}
    assert report.artifact(lower(base)).record == rebuilt


def test_requested_served_target_deleted_after_the_plan_is_rebuilt(prefix: str) -> None:
    """A target served from its record and deleted after the plan (by another process) is built
    again before the run returns (the run builds another step), so the caller never gets an
    artifact that is gone."""
    attempts = Attempts()
    base = apply("s/base", attempts.fn("base"), version="v0", deps=[], out_path=OUT)
    other = apply("s/other", attempts.fn("other"), version="v0", deps=[], out_path=OUT)
    runner(prefix).run(lower([base]))
    base_spec = lower(base)
    listener = DeleteOnPlan(prefix, base_spec.output_path)
    report = runner(prefix, listener=listener).run(lower([base, other]))
    assert attempts.calls == {"base": 2, "other": 1}
    assert by_step(report)["s/base@v0"]["action"] == "built"
    rebuilt = read_record(open_prefix(prefix), base_spec.output_path)
    assert rebuilt is not None and report.artifact(base_spec).record == rebuilt


def test_served_step_that_cannot_be_rebuilt_blocks_its_dependent(prefix: str) -> None:
    attempts = Attempts()
    base = apply("s/base", attempts.fn("base"), version="v0", deps=[], out_path=OUT)
    top = apply("s/top", attempts.fn("top"), version="v0", deps=[base], out_path=OUT)
    runner(prefix).run(lower([base]))
    attempts.failing = {"base": 2}  # its rebuild (call 2) fails
    listener = DeleteOnPlan(prefix, lower(base).output_path)
    with pytest.raises(StepFailedError, match=r"attempt 2 fails \(step s/base@v0\)") as caught:
        runner(prefix, listener=listener).run(lower([top]))
    assert attempts.calls == {"base": 2}
    steps = by_step(caught.value.report)
    assert steps["s/base@v0"]["action"] == "failed"
    top_result = steps["s/top@v0"]
    assert (top_result["action"], top_result["reason"]) == (
        "blocked",
        "not run: dependency s/base@v0 failed",
    )


def test_a_run_that_builds_nothing_reads_each_target_once_more(
    prefix: str, monkeypatch: Any
) -> None:
    """The re-check is cheap: a cached re-run reads each served target's record once more, at
    its end, and nothing else (issue 43, item 11)."""
    import marin.execution.run.loop as orchestrate

    attempts = Attempts()
    base = apply("s/base", attempts.fn("base"), version="v0", deps=[], out_path=OUT)
    top = apply("s/top", attempts.fn("top"), version="v0", deps=[base], out_path=OUT)
    runner(prefix).run(lower([top]))
    reads: list[str] = []

    def counting(location: Any, path: str) -> Any:
        reads.append(path)
        return read_record(location, path)

    monkeypatch.setattr(orchestrate, "read_record", counting)
    runner(prefix).run(lower([top]))
    assert reads == [lower(top).output_path]
    reads.clear()
    runner(prefix, force=["s/top"]).run(lower([top]))  # top builds: its served input is read
    assert reads == [lower(base).output_path]


def test_a_served_target_deleted_after_the_plan_of_a_run_that_builds_nothing_is_rebuilt(
    prefix: str,
) -> None:
    """Issue 43, item 11: nothing to build, the target deleted between plan and run: the run
    does not report it built without it; it builds it again (and records it)."""
    attempts = Attempts()
    base = apply("s/base", attempts.fn("base"), version="v0", deps=[], out_path=OUT)
    top = apply("s/top", attempts.fn("top"), version="v0", deps=[base], out_path=OUT)
    runner(prefix).run(lower([top]))
    top_spec = lower(top)
    report = runner(prefix, listener=DeleteOnPlan(prefix, top_spec.output_path)).run(top_spec)
    assert attempts.calls == {"base": 1, "top": 2}
    assert by_step(report)["s/top@v0"]["action"] == "built"
    location = open_prefix(prefix)
    rebuilt = read_record(location, top_spec.output_path)
    assert rebuilt is not None and report.artifact(top_spec).record == rebuilt
    assert location.exists(location.path(top_spec.output_path))


def test_a_served_target_deleted_after_the_plan_that_cannot_be_rebuilt_fails_the_run(
    prefix: str,
) -> None:
    attempts = Attempts()
    base = apply("s/base", attempts.fn("base"), version="v0", deps=[], out_path=OUT)
    runner(prefix).run(lower([base]))
    attempts.failing = {"base": 2}  # its rebuild (call 2) fails
    listener = DeleteOnPlan(prefix, lower(base).output_path)
    with pytest.raises(StepFailedError, match=r"attempt 2 fails \(step s/base@v0\)") as caught:
        runner(prefix, listener=listener).run(lower([base]))
    assert by_step(caught.value.report)["s/base@v0"]["action"] == "failed"


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_concurrent": True}, "max_concurrent=True"),
        ({"on_drift": 0}, "on_drift=0 is not a drift policy"),
        ({"cascade": "yes"}, "cascade='yes'"),
    ],
)
def test_bad_runner_options_are_option_errors(kwargs: dict[str, Any], match: str) -> None:
    from marin.execution.errors import OptionError

    with pytest.raises(OptionError, match=match) as caught:
        StepRunner(RunOptions(**kwargs))
    assert isinstance(caught.value, InvalidStepError)  # what these checks raised before


# -- the executor seam ------------------------------------------------------------------------


class DeferOnce:
    """Wraps a real ``ThreadExecutor``; reports each step's first submit as pending on another
    runner's live lease, as a build that meets one returns it."""

    retries_steps = False
    wait = Wait.RETURN

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.deferred: list[str] = []

    def submit(self, job: Any, on_done: Any) -> None:
        from marin.execution.builder.outcome import LeaseHeld, Pending
        from marin.execution.run.executors import Completion, CompletionKind

        if job.path not in self.deferred:
            self.deferred.append(job.path)
            pending = Pending(job.spec, LeaseHeld("other", time.time() + 60), job.build)
            on_done(Completion(job, CompletionKind.PENDING, pending=pending))
            return
        self.inner.submit(job, on_done)

    def shutdown(self, *, wait: bool) -> None:
        self.inner.shutdown(wait=wait)


def test_a_deferred_step_is_put_back_and_built_later(prefix: str) -> None:
    from marin.execution.run.executors import ThreadExecutor
    from marin.execution.run.loop import RunLoop
    from marin.execution.run.report import RunReport

    attempts = Attempts()
    base = apply("d/base", attempts.fn("base"), version="v0", deps=[], out_path=OUT)
    top = apply("d/top", attempts.fn("top"), version="v0", deps=[base], out_path=OUT)
    plan, location = StepRunner(prefix=prefix).plan(lower([top]))
    report = RunReport(location, plan)
    executor = DeferOnce(ThreadExecutor(2))
    RunLoop(plan, report, executor, max_concurrent=2, retry_delay_s=0.01).run()
    assert executor.deferred == [lower(base).output_path, lower(top).output_path]
    assert attempts.calls == {"base": 1, "top": 1}
    steps = by_step(report)
    assert [(s["action"], s["attempts"]) for s in steps.values()] == [("built", 1), ("built", 1)]


# -- drivers that share the work ---------------------------------------------------------------


def test_a_step_held_by_another_runner_frees_its_slot(prefix: str, caplog: Any) -> None:
    """With one slot, a step another runner's live lease holds is deferred: the runner builds
    the other ready step meanwhile (before, it waited in its slot for the lease), then comes
    back and builds the held step once the lease is released."""
    import threading

    from marin.execution.store.lease import Lease

    order: list[str] = []

    def record(name: str) -> Any:
        def fn(deps: Any, out_path: str) -> str:
            order.append(name)
            if name == "free":  # the other runner lets the held step's lease go now
                other.release()
            return name

        fn.__qualname__ = f"shared_{name}"
        return fn

    held = apply("sh/held", record("held"), version="v0", deps=[], out_path=OUT)
    after = apply("sh/after", record("after"), version="v0", deps=[held], out_path=OUT)
    free = apply("sh/free", record("free"), version="v0", deps=[], out_path=OUT)
    other = Lease(open_prefix(prefix), lower(held).output_path)
    result: list[Any] = []

    def other_runner() -> None:  # a live lease of another holder (another thread's id)
        result.append(other.try_acquire())

    thread = threading.Thread(target=other_runner)
    thread.start()
    thread.join()
    assert result == [None]
    # Old behaviour would block here forever: let the lease go after 20 s so it fails instead.
    fallback = threading.Timer(20, other.release)
    fallback.start()
    try:
        with caplog.at_level(logging.INFO, logger="marin"):
            report = runner(prefix, max_concurrent=1).run(lower([after, free]))
    finally:
        fallback.cancel()
    assert order == ["free", "held", "after"]  # held was critical-path first, and deferred
    assert [s["action"] for s in by_step(report).values()] == ["built"] * 3
    assert "wait sh/held@v0: lease held by" in caplog.text
    assert "going on with other steps" in caplog.text


def test_scheduler_defer_frees_the_slot_and_resume_makes_it_ready_again() -> None:
    """The scheduler only frees a deferred node's slot and readies it again: while it waits,
    the run loop's ``Waiting`` holds it."""
    from marin.execution.run.scheduler import Scheduler

    s = Scheduler({"a": [], "b": [], "c": ["a"]})
    s.prepare()
    assert s.get_ready(1) == ["a"]  # the critical path first
    s.defer("a")
    assert s.running == set()
    assert s.get_ready(1) == ["b"]
    s.resume("a")
    assert s.get_ready(1) == ["a"]
    s.done("a")
    s.done("b")
    assert s.get_ready() == ["c"]
    with pytest.raises(ValueError, match="is not running"):
        s.defer("a")
    with pytest.raises(ValueError, match="is not deferred"):
        s.resume("a")


def test_a_deferred_step_stays_not_started_when_the_run_stops() -> None:
    from marin.execution.run.scheduler import Scheduler

    s = Scheduler({"a": [], "b": []})
    s.prepare()
    assert s.get_ready(2) == ["a", "b"]
    s.defer("a")
    s.failed("b")  # fail-fast: nothing new starts
    s.resume("a")
    assert not s.is_active() and s.get_ready() == []
    assert s.finish().not_started == ["a"]
