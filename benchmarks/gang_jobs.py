"""The gang steps of ``gang_preemption.py``: importable by name from a job's ranks, loadable by
``marin run benchmarks/gang_jobs.py:resumable`` (it imports nothing from the harness).

``units_step`` runs ``units`` units of ``$MARIN_BENCH_UNIT_S`` seconds on every rank; each rank
appends ``<rank> <unit> <time>`` to ``$MARIN_BENCH_UNITS`` after a unit, and rank 0 then
publishes the next unit as its checkpoint (when the step is resumable). Each rank appends
``<gang start> <rank> <pid> <time>`` to ``$MARIN_BENCH_STARTS`` when it starts.
"""

from __future__ import annotations

import os
import time

from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.context import current_context

RANKS = int(os.environ.get("MARIN_BENCH_RANKS", "3"))
UNITS = int(os.environ.get("MARIN_BENCH_UNITS_N", "60"))


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def units_step(units: int, out_path: str) -> dict[str, int]:
    ctx, env = current_context(), os.environ
    _append(env["MARIN_BENCH_STARTS"], f"{ctx.rank} {os.getpid()} {time.time():.3f}")
    state = os.path.join(ctx.checkpoint_path, "next_unit") if ctx.checkpoint_path else None
    start = 0
    if state is not None and os.path.exists(state):
        with open(state) as f:
            start = int(f.read() or 0)
    for unit in range(start, units):
        time.sleep(float(env.get("MARIN_BENCH_UNIT_S", "1")))
        _append(env["MARIN_BENCH_UNITS"], f"{ctx.rank} {unit} {time.time():.3f}")
        if state is not None and ctx.rank == 0 and ctx.still_holds_lease():
            os.makedirs(os.path.dirname(state), exist_ok=True)
            with open(state + ".tmp", "w") as f:
                f.write(str(unit + 1))
            os.replace(state + ".tmp", state)
    return {"started_at": start}


def _gang(name: str, resumable: bool, remote: str = "local") -> list:
    step = apply(name, units_step, version="v1", units=UNITS, out_path=OUT)
    return [step.with_options(remote=remote, ranks=RANKS, resumable=resumable,
                              max_preemptions=1000)]  # fmt: skip


resumable = _gang("gang/resumable", True)
restart = _gang("gang/restart", False)
on_ray = _gang("gang/ray", False, "ray")
