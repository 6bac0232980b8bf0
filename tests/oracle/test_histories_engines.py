"""The oracle's engine subset (``slow``): fixed-seed histories, and a pinned one, on the
compiled Prefect flow and ``airflow dags test`` (``engines.py``; ``subsets.py`` says why this
is a file of its own)."""

from __future__ import annotations

import pytest

from tests.oracle import pinned
from tests.oracle.executor import run_history
from tests.oracle.history import ENGINE, seeded
from tests.oracle.subsets import ENGINE_SEEDS, TODAY
from tests.oracle.tally import Tally


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("engine", sorted(ENGINE_SEEDS))
def test_fixed_seed_histories_on_an_engine(engine: str) -> None:
    """The engine subset: the same checks after each run of the compiled Prefect flow or of
    ``airflow dags test``; kinds today's main shows are listed, not failed."""
    pytest.importorskip("prefect" if engine == "prefect" else "airflow.sdk")
    from tests.oracle.engines import ENGINES

    runner = ENGINES[engine]()
    tally = Tally()
    for seed in ENGINE_SEEDS[engine]:
        outcome, _ = run_history(seeded(seed, ENGINE), runner)
        tally.add(seed, outcome)
    new = sorted(set(tally.seeds) - set(TODAY))
    assert tally.count == len(ENGINE_SEEDS[engine])
    assert not new, tally.table() + "\n" + _failure_on(tally, new[0], runner)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", sorted(ENGINE_SEEDS))
def test_pinned_history_on_an_engine(engine: str) -> None:
    pytest.importorskip("prefect" if engine == "prefect" else "airflow.sdk")
    from tests.oracle.engines import ENGINES

    case = pinned.ON_AN_ENGINE
    outcome, ex = run_history(case.history, ENGINES[engine]())
    assert case.kind not in outcome.kinds, ex.report(case.kind)


def _failure_on(tally: Tally, kind: str, runner: object) -> str:
    seed = tally.seeds[kind][0]
    _, ex = run_history(seeded(seed, ENGINE), runner)
    return f"seed {seed}:\n{ex.report(kind)}"
