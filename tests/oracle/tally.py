"""Run many fixed-seed histories and count what they find, per violation kind.

``python -m tests.oracle.tally --seeds 0:200`` prints, per kind, how many histories found it,
the first seeds, and the trust finding it is an instance of; ``--script KIND`` prints the
first such history's repro script (``--shrink`` shrinks it first); ``--pinned DIR`` writes the
script of every pinned history (``pinned.py``) as ``DIR/<name>.repro``, which
``python DIR/<name>.repro`` runs. The fast subset's tests read the same tally
(``tests/oracle/test_histories.py``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.oracle.checks import FINDINGS
from tests.oracle.executor import Outcome, run_history
from tests.oracle.history import ADOPT, FAST, GANG, SOAK, Profile, seeded

PROFILES = {"fast": FAST, "soak": SOAK, "gang": GANG, "adopt": ADOPT}


@dataclass
class Tally:
    """Per-kind findings of a batch of histories."""

    seeds: dict[str, list[int]] = field(default_factory=dict)
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    seconds: float = 0.0
    count: int = 0

    def add(self, seed: int, outcome: Outcome) -> None:
        self.count += 1
        self.outcomes[seed] = outcome
        for kind in sorted(outcome.kinds):
            self.seeds.setdefault(kind, []).append(seed)

    def failed(self) -> int:
        return sum(1 for o in self.outcomes.values() if o.violations)

    def table(self) -> str:
        lines = [f"{self.count} histories in {self.seconds:.1f}s, {self.failed()} failed"]
        for kind, seeds in sorted(self.seeds.items()):
            lines.append(
                f"  {kind:40} {len(seeds):4} histories (seeds {seeds[:8]}) "
                f"finding {FINDINGS.get(kind, '?')}"
            )
        return "\n".join(lines)


WORKERS_ENV = "ORACLE_WORKERS"
"""How many processes run histories at once (default 1: on a loaded machine two make runs
exceed their timeouts, which the checker reports as `run-hung`)."""
PROGRESS_ENV = "ORACLE_PROGRESS"
"""A file to append one line per history to (seed, seconds, kinds): a long run's progress."""


def _one(job: tuple[int, Profile, bool]) -> tuple[int, Outcome]:
    seed, profile, keep = job
    outcome, _ = run_history(seeded(seed, profile))
    if not keep and not outcome.violations:
        outcome.script = ""  # a failing history's is kept: a rerun may not fail again
    return seed, outcome


def run_seeds(
    seeds: Iterable[int], profile: Profile = FAST, keep: bool = False, workers: int | None = None
) -> Tally:
    """Run each seed's history (on ``workers`` processes, each history in a sandbox of its
    own; spawned, not forked: a fork would copy marin's threads' locks) and count what they
    find, in seed order."""
    workers = workers or int(os.environ.get(WORKERS_ENV, "1"))
    progress = os.environ.get(PROGRESS_ENV)
    tally = Tally()
    start = time.monotonic()
    jobs = [(seed, profile, keep) for seed in seeds]
    pool = None
    if workers > 1 and len(jobs) > 1:
        pool = multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=100)
    try:
        results = pool.imap(_one, jobs) if pool is not None else map(_one, jobs)
        for seed, outcome in results:
            tally.add(seed, outcome)
            if progress:
                with open(progress, "a") as f:
                    f.write(f"{seed} {outcome.seconds:.1f}s {sorted(outcome.kinds)}\n")
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    if pool is not None:
        pool.close()  # not terminate(): a worker's SIGTERM handler would print a traceback
        pool.join()
    tally.seconds = time.monotonic() - start
    return tally


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.oracle.tally")
    parser.add_argument("--seeds", default="0:200", help="A:B, the seeds A..B-1")
    parser.add_argument("--script", metavar="KIND", help="print the first history of KIND")
    parser.add_argument("--shrink", action="store_true", help="shrink it first")
    parser.add_argument("--pinned", metavar="DIR", help="write each pinned history's script")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="fast")
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    if args.pinned:
        return write_pinned(args.pinned)
    a, b = (int(x) for x in args.seeds.split(":"))
    tally = run_seeds(range(a, b), profile, keep=True)
    print(tally.table())
    if args.script and args.script in tally.seeds:
        seed = tally.seeds[args.script][0]
        history = seeded(seed, profile)
        if args.shrink:
            from tests.oracle.shrink import shrink

            history = shrink(history, args.script)
        print(history.describe())
        _, ex = run_history(history)
        print(ex.report(args.script))
    return 0


def write_pinned(folder: str) -> int:
    """Run every pinned history; write its script to ``folder/<name>.repro``; say what it
    found."""
    import os

    from tests.oracle.pinned import PINNED

    os.makedirs(folder, exist_ok=True)
    for name, case in sorted(PINNED.items()):
        outcome, ex = run_history(case.history)
        with open(os.path.join(folder, f"{name}.repro"), "w") as f:  # ruff skips it
            f.write(ex.report(case.kind))
        print(f"{name}: {case.kind} {'found' if case.kind in outcome.kinds else 'NOT found'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
