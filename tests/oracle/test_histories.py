"""The random-history checker's tests (issue 52; the package docstring says how it works).

- Fast subset: 120 fixed-seed histories run once (``fast_tally``; a tenth of them with an
  adoption), then one test per kind of
  violation, so a failure names the broken promise, its count and the first history's script.
  Kinds today's main still shows are strict xfails naming the trust finding (issue 53): a fix
  makes the test pass, and the strict xfail then fails until its mark is removed.
- The pinned histories (``pinned.py``): the shrunk history of every bug found, one test each.
  Red team round 16's finding 1 (a config dict's key lost its type in the fingerprint: the
  ``EditConfig`` of a key's type, ``retype``) is found on 61aa72e by fast seeds 47, 78, 83
  (and 132, 183, past the fast subset's 120) (``wrong-artifact:other``), and by the pinned
  ``a-config-whose-key-changed-type-is-served-the-other-keys-build``. Red team round 17's
  finding 2 (a user's data beside a metadata folder no attempt left, cleared as debris: the
  ``PutUserData`` operation) is found on f438e3d by fast seeds 0, 49, 52, 64, 69, 119
  (``user-data-touched``), and by the pinned
  ``a-users-data-beside-an-empty-metadata-folder-is-cleared-as-debris``.
- The oracle itself: its clean build is what ``marin run`` builds on an empty prefix; and a
  history without a broken promise replays as its script, which exits 0.
- ``slow``: fixed-seed histories on the compiled Prefect flow and ``airflow dags test``.
- ``soak`` (deselected unless ``-m soak``): 5,000 histories; hypothesis's own histories, shrunk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from tests.oracle import pinned
from tests.oracle.checks import FINDINGS
from tests.oracle.executor import run_history
from tests.oracle.history import ADOPT, ENGINE, FAST, GANG, SOAK, History, histories, seeded
from tests.oracle.oracle import ORACLE
from tests.oracle.pipeline import KEY_EDITS, Adoption, PipelineModel, StepModel
from tests.oracle.tally import Tally, run_seeds

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


def _kind_param(kind: str) -> object:
    if kind in TODAY:
        return pytest.param(kind, marks=pytest.mark.xfail(strict=True, reason=TODAY[kind]))
    return kind


@pytest.fixture(scope="module")
def fast_tally() -> Tally:
    return run_seeds(FAST_SEEDS, FAST)


def _failure(tally: Tally, kind: str, profile: object = FAST) -> str:
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


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", [_kind_param(k) for k in sorted(FINDINGS)])
def test_fixed_seed_histories_never(fast_tally: Tally, kind: str) -> None:
    """No history of the 200 breaks this promise (kinds: ``checks.FINDINGS``)."""
    assert fast_tally.count == len(FAST_SEEDS)
    assert kind not in fast_tally.seeds, _failure(fast_tally, kind)


def test_fixed_seed_histories_find_no_other_kind(fast_tally: Tally) -> None:
    unknown = sorted(set(fast_tally.seeds) - set(FINDINGS))
    assert not unknown, _failure(fast_tally, unknown[0])


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


@pytest.mark.parametrize("seed", [0, 7, 23])
def test_the_oracle_is_what_marin_builds_on_an_empty_prefix(seed: int, tmp_path) -> None:
    from marin.execution.lazy import run
    from marin.execution.pipeline.targets import load_target
    from tests.oracle.oracle import canonical, read_tree
    from tests.oracle.pipeline import render

    model = dataclasses.replace(seeded(seed, FAST).model, adoption=None)  # (below)
    keys = list(KEY_EDITS)  # every key type: the oracle's config keeps it as the file does
    for s in model.steps:
        model = model.replace(s.idx, key=keys[(s.idx + seed) % len(keys)])
    path = tmp_path / f"clean_{seed}.py"
    path.write_text(render(model, placement=False))
    run(*load_target(f"{path}:pipeline"), prefix=str(tmp_path / "p"))
    expected = ORACLE.expected(model)
    for s in model.steps:
        out = tmp_path / "p" / s.name / "v1"
        files, folders = read_tree(str(out))
        assert (files, folders) == (expected[s.idx].files, expected[s.idx].folders), s.name
        record = json.loads((tmp_path / "p" / s.name / "v1.marin" / "record.json").read_text())
        assert canonical(record["result"]) == expected[s.idx].result, s.name
    sys.modules.pop(f"marin_target_clean_{seed}", None)


@pytest.mark.parametrize(
    "adopted",
    [Adoption(0, "outside"), Adoption(0, "in-place"), Adoption(0, "in-build", "/data.txt")],
)
def test_the_oracle_of_an_adoption_is_what_marin_builds(adopted: Adoption) -> None:
    """With the user's data (or the feeder's build) in place, what ``marin run`` builds from
    the adoption is the oracle's clean build, and the adoption records that data."""
    from tests.oracle.checks import matches, stored
    from tests.oracle.world import World

    model = PipelineModel(
        (StepModel(0, (), 2), StepModel(1, (0,), 1), StepModel(2, (0, 1), 3)), adopted
    )
    world = World(model)
    try:
        for target in ([world.feeder] if adopted.shape == "in-build" else []) + [world.target]:
            call = world.marin(["run", target, "--json"], "alice")
            assert call.rc == 0, call.err[-2000:]
        expected = ORACLE.expected(model)
        for s in model.steps:
            got = stored(os.path.join(world.prefix, s.name, "v1"))
            assert matches(got, expected[s.idx]), (s.name, got, expected[s.idx])
        assert expected[0].adopted and not expected[1].adopted
    finally:
        world.close()


def test_a_history_that_keeps_every_promise_replays_as_its_script(tmp_path) -> None:
    """Its script runs the same commands (by hand, in subprocesses) and exits 0."""
    outcome, ex = run_history(pinned.CLEAN)
    assert not outcome.violations, [str(v) for v in outcome.violations]
    script = tmp_path / "repro.py"
    script.write_text(ex.report())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARIN_", "ORACLE_"))}
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("$ MARIN_USER=") == sum(
        1 for op in pinned.CLEAN.ops if type(op).__name__ in ("Run", "FailRun", "Gc")
    )


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


@pytest.mark.soak
@pytest.mark.timeout(6 * 3600)
def test_soak_histories() -> None:
    tally = run_seeds(SOAK_SEEDS, SOAK)
    print(tally.table())
    assert not tally.seeds, tally.table() + "\n" + _failure(tally, sorted(tally.seeds)[0], SOAK)


@pytest.mark.soak
@pytest.mark.timeout(3 * 3600)
def test_hypothesis_histories_shrunk() -> None:
    """Histories hypothesis draws from the same generator, derandomized; a failure is shrunk
    by hypothesis and reported as its script."""
    from hypothesis import HealthCheck, given, settings

    @settings(
        max_examples=300,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(histories(FAST))
    def check(history: History) -> None:
        outcome, ex = run_history(history)
        assert not outcome.violations, (
            f"{outcome.violations[0]}\n{ex.report(outcome.violations[0].kind)}"
        )

    check()
