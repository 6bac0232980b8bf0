"""Section ``dispatch``: how fast a finished step releases the next.

A chain of no-op steps on ``memory://`` (each step's commit included), and the same chain with
``build_step`` stubbed out: the scheduler's own hand-off latency."""

from __future__ import annotations

from typing import Any

from harness import Harness

from sections.overhead import overhead


def bench(h: Harness) -> None:
    """(2) A 2,000-step chain on memory://: how fast a finished step releases the next."""
    n = 500 if h.quick else 2000
    r = h.worker("dispatch", 120, n=n, reps=1 if h.quick else 3)
    if r:
        wall = r["run_median_s"]
        h.judge(
            "dispatch",
            f"chain n={n} memory://, scaled to n=2000" if n != 2000 else f"chain n={n} memory://",
            wall * 2000 / n,
            "s",
            "dispatch.chain",
            1.0,
            note="the whole chain, incl. each step's commit",
        )
    n = 2000
    r = h.worker("dispatch", 60, n=n, reps=3, stub=True)
    if r:
        h.add(
            "dispatch",
            f"chain n={n}, build_step stubbed",
            r["run_median_s"],
            "s",
            note="the scheduler's own hand-off latency",
        )


def dispatch(n: int, reps: int, stub: bool = False) -> dict[str, Any]:
    """A chain of ``n`` no-op steps on ``memory://``: each waits for the previous one."""
    return overhead("memory", n, reps, kind="chain", stub=stub, max_concurrent=8)


WORKERS: dict[str, str] = {
    "dispatch": "sections.dispatch:dispatch",
}
