"""The fixed-seed subsets the oracle's tests run (``test_histories*.py``), the kinds of
violation today's main still shows, and the report of a subset's first failing history.

The tests are three files so that two pytest-xdist workers share them (each file goes to one
worker whole): the fast subset and the oracle itself (``test_histories.py``); the gang,
adoption and pinned histories (``test_histories_remote.py``); the engine subset, ``slow``
(``test_histories_engines.py``).
"""

from __future__ import annotations

from tests.oracle.checks import FINDINGS
from tests.oracle.executor import run_history
from tests.oracle.history import FAST, seeded
from tests.oracle.tally import Tally

FAST_SEEDS = range(120)
"""A budget CI can pay (about 1.2 s a history); the soak is where breadth lives."""
SOAK_SEEDS = range(1000, 6000)
ENGINE_SEEDS = {"prefect": range(6), "airflow": range(3)}
GANG_SEEDS = range(8)
ADOPT_SEEDS = range(80, 100)
"""Adoption histories whose operations do what they are for: data edited by hand, the
feeder rebuilt, records torn, a build refused over data adopted in place (seeds 86, 88, 96)."""

TODAY: dict[str, str] = {}
"""Kinds of violation the fast subset finds on today's main, with the finding."""


def failure(tally: Tally, kind: str, profile: object = FAST) -> str:
    """The first failing seed of ``kind``: what it found when it failed (a rerun under other
    load may not fail again), its history, and its script."""
    seeds = tally.seeds[kind]
    history = seeded(seeds[0], profile)  # type: ignore[arg-type]
    failed = tally.outcomes[seeds[0]]
    found = "\n".join(f"  {v}" for v in failed.violations)
    script = failed.script
    if not script:
        _, ex = run_history(history)
        script = ex.report(kind)
    return (
        f"{kind} (finding {FINDINGS.get(kind, '?')}) in {len(seeds)} of {tally.count} "
        f"histories, seeds {seeds[:10]}; the first, seed {seeds[0]}, found:\n{found}\n"
        f"{history.describe()}\nits script (shrink it: python -m tests.oracle.tally --seeds "
        f"{seeds[0]}:{seeds[0] + 1} --script {kind} --shrink):\n{script}"
    )
