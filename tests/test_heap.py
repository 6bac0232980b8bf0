"""The objects a run and its plan start with are out of the garbage collector's scans meanwhile
(``marin.execution.heap``): frozen for the run and the plan, thawed after them, and a process's
own freeze is never touched."""

from __future__ import annotations

import gc
import threading
import uuid
from collections.abc import Iterator

import pytest

from marin.execution.lazy import OUT, ArtifactStep, apply
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner

seen: dict[str, int] = {}
"""Step name -> ``gc.get_freeze_count()`` while its fn ran."""
release_slow = threading.Event()
slow_started = threading.Event()


def record_freeze(out: str, label: str) -> str:
    seen[label] = gc.get_freeze_count()
    return label


def slow(out: str) -> str:
    slow_started.set()
    assert release_slow.wait(60), "the test never released the slow step"
    seen["slow, after the other run ended"] = gc.get_freeze_count()
    return "slow"


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    seen.clear()
    release_slow.clear()
    slow_started.clear()
    yield
    gc.unfreeze()


def _prefix() -> str:
    return f"memory://heap-{uuid.uuid4().hex}"


def _step(label: str) -> ArtifactStep:
    return apply(label, record_freeze, version="v1", out=OUT, label=label)


def test_a_run_freezes_what_it_starts_with_and_thaws_it_after() -> None:
    assert gc.get_freeze_count() == 0
    StepRunner(RunOptions(max_concurrent=2), prefix=_prefix()).run(_step("a").lower())
    assert seen["a"] > 0  # the graph and everything before the run, out of the scans
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_its_own_heap_keeps_it_as_it_was() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()  # frozen objects that are freed leave the count: it only falls
    made_since = [[] for _ in range(5_000)]  # tracked, and not frozen: a run that froze adds them
    StepRunner(RunOptions(max_concurrent=2), prefix=_prefix()).run(_step("b").lower())
    assert 0 < seen["b"] <= frozen  # the run froze nothing more
    assert 0 < gc.get_freeze_count() <= frozen  # and did not thaw the process's own
    del made_since  # alive until here: through the whole run


def test_overlapping_runs_thaw_only_when_the_last_one_ends() -> None:
    slow_step = apply("slow", slow, version="v1", out=OUT)
    errors: list[BaseException] = []

    def run_slow() -> None:
        try:
            StepRunner(RunOptions(max_concurrent=1), prefix=_prefix()).run(slow_step.lower())
        except BaseException as exc:
            errors.append(exc)

    first = threading.Thread(target=run_slow)
    first.start()
    assert slow_started.wait(60)
    StepRunner(RunOptions(max_concurrent=1), prefix=_prefix()).run(_step("quick").lower())
    assert seen["quick"] > 0
    release_slow.set()
    first.join(60)
    assert not errors
    assert seen["slow, after the other run ended"] > 0  # still frozen: the slow run went on
    assert gc.get_freeze_count() == 0


def test_a_plan_reads_and_decides_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan before a run (and ``marin plan``) allocates views and decisions per step: the
    collector's passes it sets off skip the graph too, and the heap is thawed after it."""
    import marin.execution.plan.decide as decide_module
    import marin.execution.plan.read as inspect_module
    from marin.execution.pipeline.graph import Graph
    from marin.execution.plan.options import RunOptions
    from marin.execution.plan.read import plan_run
    from marin.execution.store.location import open_prefix

    counts: dict[str, list[int]] = {"read": [], "decide": []}
    real_read, real_decide = inspect_module.read_stored_step, decide_module.decide

    def read(*args: object, **kwargs: object) -> object:
        counts["read"].append(gc.get_freeze_count())
        return real_read(*args, **kwargs)  # type: ignore[arg-type]

    def decide(*args: object, **kwargs: object) -> object:
        counts["decide"].append(gc.get_freeze_count())
        return real_decide(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(inspect_module, "read_stored_step", read)
    monkeypatch.setattr(decide_module, "decide", decide)
    plan = plan_run(Graph.of([_step("planned").lower()]), open_prefix(_prefix()), RunOptions())
    assert len(plan.decisions) == 1
    assert counts["read"] and all(count > 0 for count in counts["read"])
    assert counts["decide"] and all(count > 0 for count in counts["decide"])
    assert gc.get_freeze_count() == 0
