"""The steps and pipelines of the ``remote`` benchmark section (``sections/remote.py``).

A module of its own, importable by name from a job (``fn`` travels by reference) and loadable
by ``marin run benchmarks/remote_jobs.py:restart`` (it imports nothing from the harness).
"""

from __future__ import annotations

import os
import time
from typing import Any

from marin.execution.lazy import OUT, apply

GATE_ENV = "MARIN_BENCH_GATE"
"""A file: ``gated`` waits for it (the restart measurement holds its job open)."""


def sleep_step(seconds: float, out_path: str) -> float:
    """A job of ``seconds``: what a driver waits on."""
    time.sleep(seconds)
    return seconds


def noop_step(i: int, out_path: str, prev: Any = None) -> int:
    """Nothing: the hop itself is what is timed."""
    return i


def gated(out_path: str) -> int:
    """Started, then waits for ``$MARIN_BENCH_GATE`` (polled: a benchmark, not a test)."""
    while not os.path.exists(os.environ[GATE_ENV]):
        time.sleep(0.01)
    return os.getpid()


def sleepers(n: int, seconds: float) -> list[Any]:
    """``n`` independent ``local`` jobs of ``seconds`` each."""
    return [
        apply(f"wait/s{i}", sleep_step, version="v1", seconds=seconds, out_path=OUT).with_options(
            remote="local"
        )
        for i in range(n)
    ]


def chain(n: int, remote: str | None) -> list[Any]:
    """``n`` no-op steps, each after the previous: per-step wall time is one hop."""
    step: Any = None
    for i in range(n):
        step = apply(f"hop/s{i}", noop_step, version="v1", i=i, out_path=OUT, prev=step)
        if remote is not None:
            step = step.with_options(remote=remote)
    return [step]


restart = [apply("restart/job", gated, version="v1", out_path=OUT).with_options(remote="local")]
