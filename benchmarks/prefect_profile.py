"""Where the compiled Prefect flow's time goes, against the hand-written one (the ``prefect`` rows).

Runs the ``prefect`` section's flows (``sections.prefect.prefect_variants``) once each after a
warm-up, under ``yappi`` with the wall clock on every thread (cProfile sees only the calling
thread, and a flow's tasks run on the task runner's threads), and prints, per flow, the
functions with the most time of their own, then the Prefect calls that only some flows make.
yappi is not a dependency::

    .venv/bin/pip install yappi
    .venv/bin/python benchmarks/prefect_profile.py --n 200 --top 25

Under a profiler every time is inflated (the compiled flow most, having the most Python per
task); read the shares and the call counts, not the seconds.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import fresh_prefix
from sections.prefect import prefect_variants

FLOWS = ("compiled", "plain", "plain-tagged")
"""The flows profiled (the local StepRunner is not a Prefect flow)."""

WATCHED = {
    "aacquire_concurrency_slots_with_lease": "tag-limit slots asked of the server per task run",
    "AssetContext.emit_events": "asset materialization events (compiled flow: building steps)",
    "SyncTaskRunEngine._wait_for_dependencies": "wait_for resolved in the task's thread",
    "MaterializingTask.__init__": "task objects made (materializing)",
    "Task.__init__": "task objects made (plain)",
}
"""Functions whose call counts and times tell the flows apart, and what each one is."""


def profile(n: int, top: int) -> None:
    from prefect_server import section_server, without_flow_heartbeat

    from marin_testing.prefect import isolate_prefect_home

    isolate_prefect_home()
    with section_server(), without_flow_heartbeat():  # as the section runs its flows
        _profile_flows(n, top)


def _profile_flows(n: int, top: int) -> None:
    import yappi

    # Prefect configures its run loggers' levels itself: quiet each, not only their parent.
    for logger in ("prefect", "prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(logger).setLevel(logging.WARNING)
    _, variants = prefect_variants(n)
    for name in FLOWS:  # untimed warm-up, as the benchmark does
        with fresh_prefix("local", f"prof-warm-{name}") as prefix:
            variants[name](prefix)
    watched: dict[str, dict[str, tuple[int, float]]] = {}
    for name in FLOWS:
        time.sleep(2.0)  # the idle gap of the benchmark: the server catches up first
        yappi.clear_stats()
        yappi.set_clock_type("wall")
        yappi.start()
        with fresh_prefix("local", f"prof-{name}") as prefix:
            t0 = time.perf_counter()
            variants[name](prefix)
            wall = time.perf_counter() - t0
        yappi.stop()
        stats: Any = yappi.get_func_stats()
        print(f"\n== {name}: {wall:.2f} s under the profiler; top {top} by own time")
        stats.sort("tsub")
        for row in list(stats)[:top]:
            own, total = f"{row.tsub:9.3f} s own", f"{row.ttot:9.3f} s total"
            print(f"{own} {total} {row.ncall:7d} calls  {row.full_name}")
        watched[name] = {}
        for row in stats:
            for key in WATCHED:
                if row.full_name.endswith(f" {key}"):
                    watched[name][key] = (row.ncall, row.ttot)
    print("\n== the calls that tell the flows apart (calls, total wall time across threads)")
    for key, meaning in WATCHED.items():
        cells = []
        for name in FLOWS:
            calls, seconds = watched[name].get(key, (0, 0.0))
            cells.append(f"{name} {calls} / {seconds:.2f} s")
        print(f"{key} ({meaning}): " + ", ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="steps of the random graph")
    parser.add_argument("--top", type=int, default=25, help="functions shown per flow")
    args = parser.parse_args()
    profile(args.n, args.top)


if __name__ == "__main__":
    main()
