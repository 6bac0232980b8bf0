"""Marin's backoffs leave the ``random`` module's global state alone: a step's ``fn`` that seeds it
for a reproducible experiment draws the same numbers whatever another build's retries did."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from marin.execution import storage
from marin.execution.build import build_step
from marin.execution.lazy import OUT, apply
from marin.execution.lease import Lease
from marin.execution.storage import open_prefix, with_retries

WAIT_S = 30.0


def _noop(out_path: str) -> str:
    return "built"


@pytest.fixture
def seeded() -> Iterator[object]:
    """The global state after ``random.seed(0)``, as a step's ``fn`` would leave it; restored
    after the test."""
    before = random.getstate()
    random.seed(0)
    yield random.getstate()
    random.setstate(before)


def test_a_storage_retry_leaves_the_global_random_state_alone(
    seeded: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "RETRY_BASE_DELAY", 0.001)
    failures = iter([OSError("transient"), OSError("transient")])

    def flaky() -> str:
        error = next(failures, None)
        if error is not None:
            raise error
        return "read"

    assert with_retries(flaky, "read a file") == "read"
    assert next(failures, None) is None, "both transient errors were retried"
    assert random.getstate() == seeded


def test_waiting_for_a_held_lease_leaves_the_global_random_state_alone(
    seeded: object, tmp_path: Path, log_event: Callable[[str], threading.Event]
) -> None:
    step = apply("g/s", _noop, version="v0", out_path=OUT).lower()
    location = open_prefix(str(tmp_path / "prefix"))
    location.check_writable()
    held = Lease(location, step.output_path, ttl=60)
    assert held.try_acquire() is None
    waiting = log_event("wait g/s@v0: lease held by")
    outcome: list[str] = []
    waiter = threading.Thread(
        target=lambda: outcome.append(build_step(step, location).action), daemon=True
    )
    try:
        waiter.start()
        # The wait logs first, then sleeps a jittered delay: the draw has been made by the time
        # the lease is released and the waiter takes it.
        assert waiting.wait(WAIT_S), "the build did not wait for the held lease"
    finally:
        held.release()
        waiter.join(WAIT_S)
    assert outcome == ["built"]
    assert random.getstate() == seeded
