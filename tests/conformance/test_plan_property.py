"""Property: ``plan`` predicts ``run`` exactly, on every runner, from any store state.

Hypothesis draws a DAG (up to 12 steps), a store state per step (``plan_cases.STATES``) and a
policy (on_drift, a forced subset, cascade); ``plan_cases.run_case`` sets the store up, predicts
with ``plan_run``, runs, and checks the call log and the records against the prediction.
Examples are derandomized (the same on every run); a failure prints the drawn ``Case``.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from marin.execution.errors import DriftError
from tests.conformance.plan_cases import STATES, Case, needed_by, run_case
from tests.conformance.runner_local import LocalRunner

MAX_STEPS = 12
ANY_DRIFT_POLICY = st.sampled_from(("warn", "rebuild", "error"))


@st.composite
def cases(
    draw: st.DrawFn,
    max_steps: int = MAX_STEPS,
    on_drift: st.SearchStrategy[str] = ANY_DRIFT_POLICY,
) -> Case:
    n = draw(st.integers(1, max_steps))
    names = [f"s{i}" for i in range(n)]
    deps: dict[str, list[str]] = {}
    for i, name in enumerate(names):
        earlier = names[:i]
        picked = (
            draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True)) if earlier else []
        )
        deps[name] = sorted(picked, key=names.index)
    has_dependents = {d for ds in deps.values() for d in ds}
    sinks = [n for n in names if n not in has_dependents]
    targets = draw(
        st.one_of(
            st.just(sinks),
            st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True),
        )
    )
    targets = sorted(targets, key=names.index)
    graph = needed_by(deps, targets)
    states = {name: draw(st.sampled_from(STATES)) for name in names}
    return Case(
        deps=deps,
        targets=targets,
        states=states,
        on_drift=draw(on_drift),
        force=sorted(draw(st.sets(st.sampled_from(graph), max_size=2)), key=names.index),
        cascade=draw(st.booleans()),
    )


def check_case(runner: Any, case: Case) -> None:
    with tempfile.TemporaryDirectory(prefix="marin-prop-") as root:
        outcome = run_case(runner, case, root)
    if isinstance(outcome.plan, DriftError):
        event("plan: DriftError")
    else:
        for action in sorted(set(outcome.actions().values())):
            event(f"plan has a {action}")


LOCAL = LocalRunner()


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_plan_predicts_local_run(case: Case) -> None:
    check_case(LOCAL, case)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases(on_drift=st.just("error")))
def test_plan_predicts_local_run_under_on_drift_error(case: Case) -> None:
    """Drift anywhere in the graph fails the run before anything builds (else it runs as planned)."""
    check_case(LOCAL, case)


@pytest.fixture(scope="module")
def prefect_runner() -> Any:
    pytest.importorskip("prefect")
    from tests.conformance.runner_prefect import PrefectRunner

    return PrefectRunner()


@pytest.mark.slow
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=cases(max_steps=8))
def test_plan_predicts_prefect_run(prefect_runner: Any, case: Case) -> None:
    check_case(prefect_runner, case)
