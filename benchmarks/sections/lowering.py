"""Section ``lowering``: ``lower()`` time and traced memory per step.

Random DAGs and deep chains at two sizes: microseconds per step, KiB per step, and how the memory
per step grows (linearity); a deep chain must not hit a ``RecursionError``."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import graphs
from harness import Harness

from marin.execution.lazy import lower


def bench(h: Harness) -> None:
    """(3) lower() on random DAGs and deep chains: time per step, memory per step."""
    sizes = [2000, 10000] if h.quick else [10000, 100000]
    for kind in ("random", "chain"):
        per_step: dict[int, tuple[float, float]] = {}
        for n in sizes:
            reps = (2 if n == sizes[-1] else 1) if h.quick else 3
            r = h.worker("lowering", 240, kind=kind, n=n, reps=reps)
            if r is None:
                h.add("lowering", f"{kind} n={n}", None, "us/step", note="failed (see errors)")
                continue
            us = r["lower_median_s"] / n * 1e6
            kb = r["traced_peak_bytes"] / n / 1024
            per_step[n] = (us, kb)
            note = f"traced peak {kb:.2f} KiB/step; no RecursionError"
            if n == sizes[-1]:
                h.judge(
                    "lowering", f"{kind} n={n}", us, "us/step", f"lowering.{kind}", 30, "<=", note
                )
            else:
                h.add("lowering", f"{kind} n={n}", us, "us/step", note=note)
        if len(per_step) == 2:
            (a, b) = sorted(per_step)
            h.judge(
                "lowering",
                f"{kind} memory linearity: KiB/step n={b} / n={a}",
                per_step[b][1] / per_step[a][1],
                "x",
                f"lowering.{kind}.memory",
                1.3,
                note="~1 is linear",
            )


def lowering(kind: str, n: int, reps: int, trace: bool = True) -> dict[str, Any]:
    """``lower()`` time per step (fresh memo each repetition) and traced peak bytes per step."""
    import tracemalloc

    _, targets = graphs.make(kind, n, seed=0)
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        specs = lower(targets, memo={})
        times.append(time.perf_counter() - t0)
        del specs
    out: dict[str, Any] = {"n": n, "lower_s": times, "lower_median_s": statistics.median(times)}
    if trace:
        gc.collect()
        tracemalloc.start()
        specs = lower(targets, memo={})
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["traced_peak_bytes"] = peak
        del specs
    return out


WORKERS: dict[str, str] = {
    "lowering": "sections.lowering:lowering",
}
