"""``plan_graph`` decides each step as few times as it can, and still finds the one fixed point.

The solver re-decides a step only when an input that ``decide`` reads changed. These tests hold
it to a plain reference: re-decide every step, in order, until nothing changes. Hypothesis draws
the graph, what storage holds for each step (no record, a current one, a drifted one, one made
from an older upstream build, one without lineage, a failed status) and the policy; both must
give the same decisions, the same reasons, and the same ``DriftError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from marin.execution.errors import DriftError
from marin.execution.plan import decide as decide_module
from marin.execution.plan.decide import (
    Decision,
    Policy,
    Stored,
    Upstream,
    decide,
    plan_graph,
)
from marin.execution.step_spec import StepSpec
from marin.execution.store.records import FAILED, ArtifactRecord
from marin.execution.vocabulary import Action

STORED = ("nothing", "built", "drifted", "stale", "old", "failed")


def spec(name: str, deps: Sequence[StepSpec]) -> StepSpec:
    return StepSpec(
        name=f"g/{name}",
        version="v1",
        deps=tuple(deps),
        fingerprint=f"fp-{name}",
        fingerprint_payload=f'{{"name": "{name}", "value": 1}}',
        provenance={},
        run=lambda ctx: None,
        build_config=lambda ctx: {},
    )


def record(s: StepSpec, state: str) -> ArtifactRecord:
    drifted = state == "drifted"
    return ArtifactRecord(
        name=s.name,
        version=s.version,
        fingerprint="fp-old" if drifted else s.fingerprint,
        fingerprint_payload=s.fingerprint_payload.replace("1", "2") if drifted else "{}",
        config={},
        dep_paths={},
        output_path=s.output_path,
        result=None,
        provenance={},
        started_at="",
        finished_at="",
        duration_s=0.0,
        build_id=f"b-{s.name}",
        inputs={}
        if state == "old"
        else {
            d.step_id: "b-older" if state == "stale" and i == 0 else f"b-{d.name}"
            for i, d in enumerate(s.deps)
        },
    )


def stored_state(s: StepSpec, state: str) -> Stored:
    if state == "nothing":
        return Stored()
    if state == "failed":
        return Stored(None, {"state": FAILED, "error": "RuntimeError: boom"})
    return Stored(record(s, state))


def reference(
    steps: Sequence[StepSpec],
    targets: Sequence[StepSpec],
    stored: Mapping[str, Stored],
    policy: Policy,
) -> dict[str, Decision] | str:
    """Re-decide everything until nothing changes; the decisions, or the ``DriftError`` text."""
    dependents: dict[str, list[str]] = {s.output_path: [] for s in steps}
    for s in steps:
        for d in dict.fromkeys(d.output_path for d in s.deps):
            dependents[d].append(s.output_path)
    target_paths = {t.output_path for t in targets}
    by_path = {s.output_path: s for s in steps}
    building: set[str] = set()

    def current(s: StepSpec) -> Decision:
        ups = {d.step_id: _upstream(d, stored[d.output_path].record, building) for d in s.deps}
        needed = s.output_path in target_paths or any(
            p in building for p in dependents[s.output_path]
        )
        return decide(s, stored[s.output_path], list(ups.values()), policy, needed=needed)

    changed = True
    while changed:
        changed = False
        for s in steps:
            try:
                action = current(s).action
            except DriftError:
                continue
            if action == Action.BUILD and s.output_path not in building:
                building.add(s.output_path)
                changed = True
    errors: list[DriftError] = []
    out: dict[str, Decision] = {}
    for path, s in by_path.items():
        try:
            out[path] = current(s)
        except DriftError as exc:
            errors.append(exc)
    if errors:
        return str(decide_module._all_drift(errors))
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[StepSpec], list[StepSpec], dict[str, Stored], Policy]:
    n = draw(st.integers(1, 14))
    steps: list[StepSpec] = []
    for i in range(n):
        picked = draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else []
        steps.append(spec(f"s{i}", [steps[j] for j in picked]))
    sinks = [s for s in steps if not any(s in t.deps for t in steps)]
    targets = draw(st.one_of(st.just(sinks), st.lists(st.sampled_from(steps), min_size=1)))
    stored = {s.output_path: stored_state(s, draw(st.sampled_from(STORED))) for s in steps}
    force = draw(st.sets(st.sampled_from([s.step_id for s in steps]), max_size=2))
    policy = Policy(
        draw(st.sampled_from(("warn", "rebuild", "error"))), frozenset(force), draw(st.booleans())
    )
    return steps, targets, stored, policy


def _upstream(dep: StepSpec, record: Any, building: set[str]) -> Upstream:
    """A dependency as the plain solver sees it: rebuilt with another config than its record's,
    it is never cut off (``Upstream.new_config``)."""
    rebuilt = dep.output_path in building
    new_config = rebuilt and record is not None and record.fingerprint != dep.fingerprint
    return Upstream(dep.step_id, record, rebuilt, new_config=new_config)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(cases())
def test_plan_graph_matches_the_plain_fixed_point(
    case: tuple[list[StepSpec], list[StepSpec], dict[str, Stored], Policy],
) -> None:
    steps, targets, stored, policy = case
    expected = reference(steps, targets, stored, policy)
    try:
        plan = plan_graph(steps, targets, stored, policy)
    except DriftError as exc:
        assert str(exc) == expected
        return
    assert not isinstance(expected, str), expected
    assert list(plan.decisions) == [s.output_path for s in steps]  # dependencies first
    assert plan.decisions == expected


def test_a_new_prefix_decides_each_step_once(monkeypatch: Any) -> None:
    """On a new prefix (nothing stored) every step is needed and built: one decision each."""
    steps: list[StepSpec] = []
    for i in range(300):
        steps.append(spec(f"s{i}", [steps[j] for j in (i - 1, i // 2, i // 3) if 0 <= j < i]))
    calls: list[str] = []

    def counting(s: StepSpec, *args: Any, **kwargs: Any) -> Decision:
        calls.append(s.output_path)
        return decide(s, *args, **kwargs)

    monkeypatch.setattr(decide_module, "decide", counting)
    plan = plan_graph(steps, steps[-1:], {}, Policy())
    assert plan.to_build == [s.output_path for s in steps]
    assert sorted(calls) == sorted(s.output_path for s in steps)
