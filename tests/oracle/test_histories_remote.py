"""The oracle's histories of remote steps and adoptions (the package docstring says how it
works; ``subsets.py`` why this is a file of its own):

- 8 gang histories (remote steps, gangs of two, preempted jobs; issue 56) and 20 adoption
  histories: no broken promise beyond today's known findings, and their operations really
  happened;
- the pinned histories (``pinned.py``): the shrunk history of every bug found, one test each.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.oracle import pinned
from tests.oracle.executor import run_history
from tests.oracle.history import ADOPT, GANG, seeded
from tests.oracle.subsets import ADOPT_SEEDS, GANG_SEEDS, TODAY


def test_gang_and_preemption_histories_keep_every_promise() -> None:
    """Fixed-seed histories of remote steps, gangs of two and preempted jobs (issue 56):
    no broken promise beyond today's known findings; jobs were really preempted (once past
    their budget), a gang's rank really raised, and a gang's lease was really lost."""
    preempted, gangs, found, events = 0, 0, {}, Counter[str]()
    for seed in GANG_SEEDS:
        history = seeded(seed, GANG)
        outcome, ex = run_history(history)
        preempted += ex.preempted
        events.update(ex.gang_events)
        gangs += sum(s.ranks > 1 for s in history.model.steps)
        for kind in outcome.kinds - set(TODAY):
            found.setdefault(kind, (seed, history, ex.report(kind)))
    assert not found, "\n".join(
        f"{kind}, seed {seed}:\n{history.describe()}\n{script}"
        for kind, (seed, history, script) in found.items()
    )
    assert preempted >= 3 and gangs >= 3, (preempted, gangs)
    assert set(events) == {"rank-fail", "lease-lost", "past-budget"}, events


def test_adoption_histories_keep_every_promise() -> None:
    """Fixed-seed histories with an adoption (``adoption.py``): no broken promise beyond
    today's known findings, and the adoption operations really happened: the user's data
    edited, the feeder rebuilt, a record torn or deleted, a build refused over adopted data."""
    found, events = {}, Counter[str]()
    for seed in ADOPT_SEEDS:
        history = seeded(seed, ADOPT)
        outcome, ex = run_history(history)
        events.update(ex.adopt_events)
        for kind in outcome.kinds - set(TODAY):
            found.setdefault(kind, (seed, history, ex.report(kind)))
    assert not found, "\n".join(
        f"{kind}, seed {seed}:\n{history.describe()}\n{script}"
        for kind, (seed, history, script) in found.items()
    )
    assert {"data-edited", "feed-rebuilt", "refused"} <= set(events), events
    assert events["record-torn"] + events["record-deleted"], events


def _pinned_param(name: str) -> object:
    case = pinned.PINNED[name]
    mark = pytest.mark.xfail(strict=True, reason=case.finding) if case.open else ()
    return pytest.param(name, marks=mark, id=name)


@pytest.mark.parametrize("name", [_pinned_param(n) for n in sorted(pinned.PINNED)])
def test_pinned_history(name: str) -> None:
    """The shrunk history of a bug the checker found: found on every run until it is fixed."""
    case = pinned.PINNED[name]
    outcome, ex = run_history(case.history)
    assert case.kind not in outcome.kinds, (
        f"{name}: {case.kind}\n{case.history.describe()}\n{ex.report(case.kind)}"
    )
    if case.event:  # an operation's history: it really happened, and broke no promise
        events = {**ex.gang_events, **ex.adopt_events}
        assert events.get(case.event), (name, events)
        assert not outcome.violations, [str(v) for v in outcome.violations]
