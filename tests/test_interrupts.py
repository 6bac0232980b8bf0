"""Ctrl-C during ``run()`` in library mode (a notebook): the process lives on, and so does fn.

The first interrupt starts nothing new and waits for the running steps; a second abandons them:
their leases stay held until their threads end, and they never commit. A lease is never
released while this process's ``fn`` still runs (issue: an abandoned thread overwrote an output
after a re-run had committed a new build).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from marin.execution.lazy import OUT, apply, lower
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import lease_path, read_record, read_status

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

STARTED = threading.Event()
RELEASE = threading.Event()
FINISHED = threading.Event()
CALLS: list[str] = []


def slow(tag: str, out_path: str) -> str:
    CALLS.append(tag)
    STARTED.set()
    assert RELEASE.wait(60), "the test never released the step"
    Path(out_path).write_text(tag)
    FINISHED.set()
    return tag


def quick(tag: str, out_path: str) -> str:
    CALLS.append(tag)
    Path(out_path).write_text(tag)
    return tag


class Waiter(logging.Handler):
    """Sets an event when the runner logs a line containing ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


@pytest.fixture(autouse=True)
def _reset() -> Any:
    for event in (STARTED, RELEASE, FINISHED):
        event.clear()
    CALLS.clear()
    logger = logging.getLogger("marin")
    level = logger.level
    logger.setLevel(logging.INFO)  # the runner's "waiting" warning is what the tests wait on
    yield
    logger.setLevel(level)
    RELEASE.set()  # never leave a step thread blocked


def _pipeline() -> list[Any]:
    a = apply("intr/a", slow, version="v1", tag="a", out_path=OUT)
    b = apply("intr/b", quick, version="v1", tag="b", out_path=OUT)
    return list(lower([a, b]))


def _interrupt_when(*events: threading.Event, then: Any = None) -> threading.Thread:
    def go() -> None:
        for event in events:
            assert event.wait(30)
            os.kill(os.getpid(), signal.SIGINT)
        if then is not None:
            then()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def test_first_interrupt_waits_for_running_steps_and_starts_nothing_new(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    waiting = Waiter("waiting for 1 running step(s) to finish")
    logging.getLogger("marin").addHandler(waiting)
    try:
        # One slot: b can only start after a, so the interrupt must stop it from starting.
        runner = StepRunner(RunOptions(max_concurrent=1), prefix=prefix)
        runner.ready_order = "fifo"

        def release_once_waiting() -> None:
            assert waiting.seen.wait(30)
            RELEASE.set()

        _interrupt_when(STARTED, then=release_once_waiting)
        with pytest.raises(KeyboardInterrupt):
            runner.run(_pipeline())
    finally:
        logging.getLogger("marin").removeHandler(waiting)
    assert CALLS == ["a"], "a step started after the interrupt"
    location = open_prefix(prefix)
    record = read_record(location, "intr/a/v1")
    assert record is not None and record.result == "a", "the running step was not let finish"
    assert not location.fs.exists(location.path(lease_path("intr/a/v1")))


def test_second_interrupt_abandons_but_keeps_the_lease_until_fn_ends(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    waiting = Waiter("waiting for 1 running step(s) to finish")
    logging.getLogger("marin").addHandler(waiting)
    try:
        runner = StepRunner(RunOptions(max_concurrent=1), prefix=prefix)
        runner.ready_order = "fifo"
        _interrupt_when(STARTED, waiting.seen)
        with pytest.raises(KeyboardInterrupt):
            runner.run(_pipeline())
    finally:
        logging.getLogger("marin").removeHandler(waiting)
    location = open_prefix(prefix)
    # fn is still running in this process: its lease must still be held, the step RUNNING.
    assert not FINISHED.is_set()
    assert location.fs.exists(location.path(lease_path("intr/a/v1")))
    assert (read_status(location, "intr/a/v1") or {}).get("state") == "RUNNING"
    steps = [t for t in threading.enumerate() if t.name.startswith("marin-step")]
    RELEASE.set()
    assert FINISHED.wait(30)
    for thread in steps:
        thread.join(30)
    # It finished, but was abandoned: nothing committed, the lease released, the status says so.
    assert read_record(location, "intr/a/v1") is None
    assert not location.fs.exists(location.path(lease_path("intr/a/v1")))
    status = read_status(location, "intr/a/v1") or {}
    assert status.get("state") == "FAILED" and "AbandonedError" in status.get("error", "")
    assert CALLS == ["a"]


class _PressOnStart:
    """A progress listener that presses Ctrl-C ``times`` times while the run loop hands a step
    out, and notes whether the loop's own code went on past the presses."""

    def __init__(self, times: int) -> None:
        self.times, self.went_on = times, False

    def on_plan(self, total: int, skipped: int) -> None:
        pass

    def on_start(self, spec: Any) -> None:
        for _ in range(self.times):
            os.kill(os.getpid(), signal.SIGINT)  # delivered here, on the run loop's own thread
        self.went_on = True

    def on_finish(self, outcome: Any) -> None:
        pass

    def on_fail(self, spec: Any, error: BaseException) -> None:
        pass


def test_a_first_interrupt_while_a_step_is_being_started_is_still_the_first(
    tmp_path: Path,
) -> None:
    # CI caught this race: Ctrl-C landing while the loop was starting a step was taken for the
    # second one, which abandoned a step the user meant to let finish.
    prefix = str(tmp_path / "p")
    runner = StepRunner(RunOptions(max_concurrent=1), prefix=prefix, listener=_PressOnStart(1))
    runner.ready_order = "fifo"
    a = apply("intr/a", quick, version="v1", tag="a", out_path=OUT)
    b = apply("intr/b", quick, version="v1", tag="b", out_path=OUT)
    with pytest.raises(KeyboardInterrupt):
        runner.run(list(lower([a, b])))
    assert CALLS == ["a"], "a step started after the interrupt"
    location = open_prefix(prefix)
    record = read_record(location, "intr/a/v1")
    assert record is not None and record.result == "a", "the step being started was abandoned"
    assert read_record(location, "intr/b/v1") is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "handler not restored"


def test_a_second_interrupt_is_handled_between_two_items_never_where_it_lands(
    tmp_path: Path,
) -> None:
    # CI caught this race: a second Ctrl-C raised just after the loop took a build pending on
    # its job from its inbox, before it was waiting; that build then kept its lease.
    presses = _PressOnStart(2)
    runner = StepRunner(RunOptions(max_concurrent=1), prefix=str(tmp_path / "p"), listener=presses)
    a = apply("intr/a", quick, version="v1", tag="a", out_path=OUT)
    with pytest.raises(KeyboardInterrupt):
        runner.run(list(lower([a])))
    assert presses.went_on, "the second interrupt cut the loop's bookkeeping in half"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "handler not restored"


def test_a_third_interrupt_raises_where_it_lands(tmp_path: Path) -> None:
    """The way out of a loop that hangs."""
    presses = _PressOnStart(3)
    runner = StepRunner(RunOptions(max_concurrent=1), prefix=str(tmp_path / "p"), listener=presses)
    a = apply("intr/a", quick, version="v1", tag="a", out_path=OUT)
    with pytest.raises(KeyboardInterrupt):
        runner.run(list(lower([a])))
    assert not presses.went_on
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "handler not restored"
