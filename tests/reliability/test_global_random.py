"""Marin's backoffs never draw from the ``random`` module's global state: a step's ``fn`` that
seeds it for a reproducible experiment draws the same numbers whatever another build's retries
did."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marin.execution.builder.commit import build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.lazy import OUT, apply
from marin.execution.store import location as storage
from marin.execution.store.lease import Lease
from marin.execution.store.location import open_prefix, with_retries

WAIT_S = 30.0


def _noop(out_path: str) -> str:
    return "built"


_GLOBAL_DRAWS = [
    "random",
    "uniform",
    "randint",
    "randrange",
    "choice",
    "choices",
    "shuffle",
    "sample",
    "getrandbits",
    "gauss",
    "expovariate",
    "triangular",
    "seed",
    "setstate",
]
"""The ``random`` module's functions over its global state."""


@pytest.fixture
def global_draws(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread id of every call of the ``random`` module's global functions during the test.

    Calls are told apart by thread, not read off ``random.getstate()``: another library's
    background thread (one left by an earlier test) may draw from the global state meanwhile.
    """
    calls: list[int] = []
    for name in _GLOBAL_DRAWS:
        original = getattr(random, name)

        def recorded(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(threading.get_ident())
            return _original(*args, **kwargs)

        monkeypatch.setattr(random, name, recorded)
    return calls


def test_a_storage_retry_leaves_the_global_random_state_alone(
    global_draws: list[int], monkeypatch: pytest.MonkeyPatch
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
    assert threading.get_ident() not in global_draws


def test_waiting_for_a_held_lease_leaves_the_global_random_state_alone(
    global_draws: list[int], tmp_path: Path, log_event: Callable[[str], threading.Event]
) -> None:
    step = apply("g/s", _noop, version="v0", out_path=OUT).lower()
    location = open_prefix(str(tmp_path / "prefix"))
    location.check_writable()
    held = Lease(location, step.output_path, ttl=60)
    assert held.try_acquire() is None
    waiting = log_event("wait g/s@v0: lease held by")
    outcome: list[str] = []
    waiter = threading.Thread(
        target=lambda: outcome.append(build_step(BuildRequest(step, location)).action), daemon=True
    )
    ours = {threading.get_ident()}
    try:
        waiter.start()
        ours.add(waiter.ident or 0)
        # The wait logs first, then sleeps a jittered delay: the draw has been made by the time
        # the lease is released and the waiter takes it.
        assert waiting.wait(WAIT_S), "the build did not wait for the held lease"
    finally:
        held.release()
        waiter.join(WAIT_S)
    assert outcome == ["built"]
    assert not ours & set(global_draws)
