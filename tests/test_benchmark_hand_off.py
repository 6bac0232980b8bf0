"""The hand-off benchmark (``benchmarks/hand_off.py``) measures what its rows say it does.

Its rows put the builds' own Python apart from the runner's thread hand-offs, so each half must
be what it claims: every build made once, dependencies first, with the upstream records a run
passes; on the calling thread, or on exactly one other thread.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import hand_off


@pytest.mark.parametrize("handed", [False, True])
def test_the_builds_alone_build_every_step_once_with_the_run_upstream(
    handed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, int, list[Any], str]] = []
    real = hand_off.build_step

    def counted(request: Any) -> Any:
        outcome = real(request)
        calls.append((request.spec, threading.get_ident(), request.upstream,
                      outcome.record.build_id))  # fmt: skip
        return outcome

    monkeypatch.setattr(hand_off, "build_step", counted)
    result = hand_off.builds_alone_worker("memory", 40, handed)

    assert result["n"] == 40 == len(calls) == len({call[0].output_path for call in calls})
    threads = {call[1] for call in calls}
    assert len(threads) == 1
    assert (threads == {threading.get_ident()}) is not handed
    built: dict[str, str] = {}  # step id -> the build id its record holds
    for spec, _, upstream, build_id in calls:  # dependencies first, as this run committed them
        assert sorted(u.step_id for u in upstream) == sorted({d.step_id for d in spec.deps})
        for u in upstream:
            assert u.rebuilt and u.committed
            assert u.record.build_id == built[u.step_id]
        built[spec.step_id] = build_id
    assert any(upstream for _, _, upstream, _ in calls)  # the graph has dependencies to pass


def test_a_round_trip_runs_each_thread_on_the_cpu_asked_and_gives_the_cpus_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = os.sched_getaffinity(0)
    pinned: list[tuple[str, set[int]]] = []
    real = os.sched_setaffinity

    def recorded(pid: int, cpus: set[int]) -> None:
        pinned.append((threading.current_thread().name, set(cpus)))
        real(pid, cpus)

    monkeypatch.setattr(os, "sched_setaffinity", recorded)
    result = hand_off.round_trip_worker(200, 1)

    first = min(before)
    assert result["same"] > 0
    assert ("MainThread", {first}) in pinned
    assert pinned[-1] == ("MainThread", before)  # the caller's CPUs are given back
    echoed = {frozenset(cpus) for name, cpus in pinned if name != "MainThread"}
    if len(before) > 1:
        second = sorted(before)[1]
        assert result["across"] > 0
        assert echoed == {frozenset({second}), frozenset({first})}  # across, then the same
    else:
        assert result["across"] is None  # one CPU: there is no other to hand over to
        assert echoed == {frozenset({first})}
    assert os.sched_getaffinity(0) == before
