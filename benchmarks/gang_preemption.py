"""Work kept under preemption: a 3-rank ``local`` gang of N one-second units whose ranks are
SIGKILLed on a seeded schedule, resumable against restarting from zero.

    .venv/bin/python benchmarks/gang_preemption.py              # 60 units of 1 s, a kill ~10
    .venv/bin/python benchmarks/gang_preemption.py --quick      # 12 units of 0.3 s, a kill ~3

Both gangs run once each through ``marin run`` (no human action) on the same kill schedule:
after ``gap`` units of the running gang (rank 0's, seeded around ``--every``), one rank (seeded)
gets SIGKILL. ``resumable`` is ``with_options(resumable=True)``: each resubmission resumes from
rank 0's checkpoint. ``restart`` starts from zero each time, as a retried Airflow or Prefect
task does (it is measured here as a Marin gang without ``resumable``, not on those engines).
Printed as JSON: units executed / needed (rank 0's), preemptions the build survived (from
``run --json``), records committed, wall time, and each gang's start spread (its first rank's
start to its last's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


class Killer(threading.Thread):
    """SIGKILLs one rank of the running gang once it ran its scheduled number of units."""

    def __init__(self, tmp: Path, gaps: list[int], ranks: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.tmp, self.gaps, self.ranks = tmp, list(gaps), ranks
        self.rng = random.Random(seed + 1)
        self.done = threading.Event()
        self.kills = 0

    def run(self) -> None:
        gang = 0
        while self.gaps and not self.done.is_set():
            starts = _lines(self.tmp / "starts")
            if len(starts) < (gang + 1) * self.ranks:
                time.sleep(0.02)
                continue
            mine = starts[gang * self.ranks : (gang + 1) * self.ranks]
            began = max(float(t) for _, _, t in mine)
            units = [u for u in _lines(self.tmp / "units") if u[0] == "0" and float(u[2]) > began]
            if len(units) < self.gaps[0]:
                time.sleep(0.02)
                continue
            victim = int(mine[self.rng.randrange(self.ranks)][1])
            os.kill(victim, signal.SIGKILL)
            self.kills += 1
            self.gaps.pop(0)
            gang += 1


def run_one(
    target: str, units: int, unit_s: float, gaps: list[int], seed: int, **extra: str
) -> dict[str, Any]:
    """One ``marin run`` of ``benchmarks/gang_jobs.py:target`` under the kill schedule."""
    with tempfile.TemporaryDirectory(prefix="marin-gang-bench-") as name:
        tmp = Path(name)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
            "MARIN_LOCAL_JOBS": str(tmp / "jobs"),
            "MARIN_REMOTE_POLL_MAX_S": "0.2",
            "MARIN_BENCH_UNITS": str(tmp / "units"),
            "MARIN_BENCH_STARTS": str(tmp / "starts"),
            "MARIN_BENCH_UNIT_S": str(unit_s),
            "MARIN_BENCH_UNITS_N": str(units),
            **extra,
        }
        units_file, starts_file = Path(env["MARIN_BENCH_UNITS"]), Path(env["MARIN_BENCH_STARTS"])
        killer = Killer(tmp, gaps, 3, seed)
        killer.start()
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "marin.cli", "run", f"benchmarks/gang_jobs.py:{target}",
             "--prefix", str(tmp / "prefix"), "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
        wall = time.monotonic() - began
        killer.done.set()
        if done.returncode != 0:
            raise RuntimeError(f"marin run {target} failed: {done.stderr[-2000:]}")
        step = json.loads(done.stdout)["steps"][0]
        executed = sum(1 for u in _lines(units_file) if u[0] == "0")
        starts = _lines(starts_file)
        times = [[float(s[2]) for s in starts[i : i + 3]] for i in range(0, len(starts) - 2, 3)]
        spreads = [max(gang) - min(gang) for gang in times]
        records = list((tmp / "prefix").rglob("*.marin/record.json"))
        log = next((tmp / "prefix").rglob("*.marin/log.txt")).read_text()
        placed = re.search(r"placement group reserved in ([0-9.]+)s", log)
        return {
            **({"placement_s": float(placed.group(1))} if placed else {}),
            "units_needed": units,
            "units_executed": executed,
            "executed_over_needed": round(executed / units, 3),
            "kills": killer.kills,
            "preemptions": step["job"]["preemptions"],
            "records": len(records),
            "wall_s": round(wall, 2),
            "start_spread_ms_median": round(statistics.median(spreads) * 1000, 1),
        }


def _on_ray(unit_s: float, seed: int) -> dict[str, Any]:
    """One gang of one unit in a placement group on a head and two workers (a CPU each)."""
    sys.path.insert(0, str(ROOT / "adapters"))
    from marin_testing.ray import RayCluster

    with tempfile.TemporaryDirectory(prefix="marin-gang-ray-") as tmp:
        files = {"MARIN_BENCH_UNITS": f"{tmp}/units", "MARIN_BENCH_STARTS": f"{tmp}/starts"}
        env = {**os.environ, **files, "MARIN_BENCH_UNIT_S": str(unit_s)}
        with RayCluster(env, num_cpus=1, workers=2) as ray:
            return run_one("on_ray", 1, unit_s, [], seed, RAY_ADDRESS=ray.address, **files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="12 units of 0.3 s, a kill ~3")
    parser.add_argument("--seed", type=int, default=56)
    parser.add_argument("--ray", action="store_true",
                        help="also a gang of 1 unit on a 3-node loopback Ray cluster: its "
                        "placement time and start spread")  # fmt: skip
    args = parser.parse_args(argv)
    units, unit_s, every = (12, 0.3, 3) if args.quick else (60, 1.0, 10)
    rng = random.Random(args.seed)
    gaps = [rng.randint(every - every // 3, every + every // 3) for _ in range(units // every - 1)]
    results = {"seed": args.seed, "kill_after_units": gaps}
    for target in ("resumable", "restart"):
        results[target] = run_one(target, units, unit_s, gaps, args.seed)
    if args.ray:
        results["ray"] = _on_ray(unit_s, args.seed)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
