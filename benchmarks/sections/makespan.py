"""Section ``makespan``: how close the runner gets to the critical path.

Random DAGs of sleeping steps at 2, 8 and 32 threads: the run's wall time over its ideal
(efficiency, 1 is perfect), longest-path-first beside FIFO order."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import graphs
from common import clear_memory_store
from harness import Harness

from marin.execution.lazy import lower
from marin.execution.pipeline.graph import collect_steps


def bench(h: Harness) -> None:
    """(5) Makespan efficiency on random DAGs of sleeping steps; FIFO vs longest-path."""
    concurrency = [2, 8, 32]
    if h.quick:
        args: dict[str, Any] = dict(n=30, seeds=[1], low=0.01, high=0.05)
    else:
        args = dict(n=80, seeds=[1, 2], low=0.04, high=0.2)
    r = h.worker("makespan", 240, orders=["longest-path", "fifo"], concurrency=concurrency, **args)
    if not r:
        return
    for mc in concurrency:
        eff = {
            order: statistics.median(
                x["efficiency"]
                for x in r["runs"]
                if x["max_concurrent"] == mc and x["order"] == order
            )
            for order in ("longest-path", "fifo")
        }
        h.judge(
            "makespan",
            f"efficiency max_concurrent={mc} longest-path",
            eff["longest-path"],
            "x",
            f"makespan.mc{mc}",
            1.05,
        )
        h.add(
            "makespan",
            f"efficiency max_concurrent={mc} fifo",
            eff["fifo"],
            "x",
            note=f"fifo/longest-path = {eff['fifo'] / eff['longest-path']:.3f}",
        )


def _durations(n: int, seed: int, low: float, high: float) -> list[float]:
    rng = random.Random(seed * 7919 + 1)
    return [round(rng.uniform(low, high), 4) for _ in range(n)]


def makespan(
    n: int,
    seeds: Sequence[int],
    concurrency: Sequence[int],
    orders: Sequence[str],
    low: float,
    high: float,
) -> dict[str, Any]:
    """Random DAGs of sleeping steps: makespan / max(critical path, work / max_concurrent)."""
    from marin.execution.plan.options import RunOptions
    from marin.execution.step_runner import StepRunner

    results: list[dict[str, Any]] = []
    for seed in seeds:
        durations = _durations(n, seed, low, high)
        _, handles = graphs.random_dag(
            n, seed=seed, durations=durations.__getitem__, tag=f"mk{seed}"
        )
        targets = lower(handles, memo={})
        steps = collect_steps(targets)
        seconds = {s.output_path: durations[int(s.name.rsplit("/s", 1)[1])] for s in steps}
        finish: dict[str, float] = {}
        for s in steps:  # deps first
            start = max((finish[d.output_path] for d in s.deps), default=0.0)
            finish[s.output_path] = start + seconds[s.output_path]
        critical = max(finish.values())
        work = sum(seconds.values())
        for mc in concurrency:
            bound = max(critical, work / mc)
            for order in orders:
                clear_memory_store()
                runner = StepRunner(RunOptions(max_concurrent=mc), prefix=f"memory://mk{seed}-{mc}-{order}")
                runner.ready_order = order
                t0 = time.perf_counter()
                runner.run(targets)
                wall = time.perf_counter() - t0
                results.append(
                    {
                        "seed": seed,
                        "max_concurrent": mc,
                        "order": order,
                        "makespan_s": wall,
                        "lower_bound_s": bound,
                        "critical_path_s": critical,
                        "work_s": work,
                        "efficiency": wall / bound,
                    }
                )
    clear_memory_store()
    return {"n": n, "runs": results}


WORKERS: dict[str, str] = {
    "makespan": "sections.makespan:makespan",
}
