"""Issue 10's caching semantics, one fixed scenario per bullet, on every runner.

Each scenario goes through ``plan_cases.run_case`` (so plan, call log and records must agree, as in
the property test) and then asserts the specific outcome the issue asks for: which steps ran and
why the plan says so. Prefect and Airflow runs are ``slow``.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import pytest

from marin.execution.errors import DriftError
from marin.execution.plan.decide import LINEAGE_UNKNOWN, Plan
from marin.execution.vocabulary import Action
from tests.conformance.conftest import RUNNERS
from tests.conformance.plan_cases import Case, Outcome, chain_deps, run_case

BUILD, SKIP, PRUNE = Action.BUILD, Action.SKIP, Action.PRUNE

CHAIN = chain_deps(["a", "b", "c"])
"""a -> b -> c, target c."""
FORK = {"a": [], "b": ["a"], "c": ["b"], "d": ["c"], "e": ["a"]}
"""a -> b -> c -> d, and a -> e; targets d and e."""


def built(deps: dict[str, list[str]], **states: str) -> dict[str, str]:
    return {n: states.get(n, "built") for n in deps}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("local"),
        pytest.param("prefect", marks=pytest.mark.slow),
        pytest.param("airflow", marks=pytest.mark.slow),
    ],
)
def any_runner(request: pytest.FixtureRequest) -> Any:
    module_name, class_name, engine = RUNNERS[request.param]
    if request.param == "airflow":  # plans, not scheduling: `airflow dags test` is enough
        class_name = "AirflowDagsTestRunner"
    if engine is not None:
        pytest.importorskip(engine)
    return getattr(importlib.import_module(module_name), class_name)()


def action(outcome: Outcome, name: str) -> Any:
    assert isinstance(outcome.plan, Plan)
    return next(d for d in outcome.plan.decisions.values() if d.spec.step_id == f"graph/{name}@v1")


def test_drift_below_built_target_under_error_fails_before_building(
    any_runner: Any, tmp_path: Any
) -> None:
    case = Case(CHAIN, ["c"], built(CHAIN, b="drifted"), on_drift="error")
    outcome = run_case(any_runner, case, str(tmp_path))
    assert isinstance(outcome.plan, DriftError)
    assert "graph/b@v1" in str(outcome.plan) and "value" in str(outcome.plan)
    assert not outcome.ok and outcome.ran == []
    if any_runner.name == "local":
        error = any_runner.last_error
        assert isinstance(error, DriftError) and "value" in str(error), error
    if any_runner.name == "airflow":
        assert "config changed without a version bump" in any_runner.last_output


def test_drift_under_rebuild_rebuilds_it_and_everything_downstream(
    any_runner: Any, tmp_path: Any
) -> None:
    case = Case(CHAIN, ["c"], built(CHAIN, b="drifted"), on_drift="rebuild")
    outcome = run_case(any_runner, case, str(tmp_path))
    assert sorted(outcome.ran) == ["b", "c"]
    assert "on_drift=rebuild" in action(outcome, "b").reason
    assert "upstream graph/b@v1 is rebuilt in this run" in action(outcome, "c").reason


def test_drift_under_warn_is_served_with_the_warning(
    any_runner: Any, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    case = Case(CHAIN, ["c"], built(CHAIN, b="drifted"), on_drift="warn")
    with caplog.at_level(logging.WARNING, logger="marin"):
        outcome = run_case(any_runner, case, str(tmp_path))
    assert outcome.ran == []
    b = action(outcome, "b")
    assert b.action == SKIP and b.served_with_warning and any("value" in d for d in b.drift)
    if any_runner.name in ("local", "prefect"):  # the warning is logged in this process
        assert "drift graph/b@v1" in caplog.text
    if any_runner.name == "airflow":
        assert "drift graph/b@v1" in any_runner.last_output


def test_force_of_a_middle_step_cascades_to_what_the_targets_need(
    any_runner: Any, tmp_path: Any
) -> None:
    case = Case(FORK, ["d", "e"], built(FORK), force=["b"])
    outcome = run_case(any_runner, case, str(tmp_path))
    assert sorted(outcome.ran) == ["b", "c", "d"]
    assert action(outcome, "e").action == SKIP and action(outcome, "a").action == SKIP


def test_no_cascade_serves_the_stale_steps(any_runner: Any, tmp_path: Any) -> None:
    case = Case(FORK, ["d", "e"], built(FORK), force=["b"], cascade=False)
    outcome = run_case(any_runner, case, str(tmp_path))
    assert outcome.ran == ["b"]
    c = action(outcome, "c")
    assert c.action == SKIP and c.served_with_warning
    assert "upstream graph/b@v1 is rebuilt in this run" in c.reason


def test_missing_intermediate_below_a_built_step_is_pruned(any_runner: Any, tmp_path: Any) -> None:
    case = Case(CHAIN, ["c"], built(CHAIN, b="missing"))
    outcome = run_case(any_runner, case, str(tmp_path))
    assert outcome.ran == []
    assert action(outcome, "b").action == PRUNE and outcome.after["b"] is None


def test_record_from_an_older_upstream_build_is_rebuilt(any_runner: Any, tmp_path: Any) -> None:
    # b was built from a's previous build; a has been rebuilt since (with cascade off).
    case = Case(CHAIN, ["c"], built(CHAIN, b="stale"))
    outcome = run_case(any_runner, case, str(tmp_path))
    assert sorted(outcome.ran) == ["b", "c"]
    b = action(outcome, "b")
    assert b.action == BUILD and "upstream graph/a@v1 was rebuilt after this step" in b.reason


def test_rebuilt_with_the_same_output_serves_its_readers(any_runner: Any, tmp_path: Any) -> None:
    """Early cutoff (issue 25): a rebuilt step's new bytes equal the old ones, so what read it
    is served, and says why; the plan said it would be rebuilt unless that happened. A step
    named by ``--force`` is never cut off (issue 43: forcing repairs what read it), so the
    forced step's reader is rebuilt, and the cutoff happens below it."""
    same = {"a": "x", "b": "y", "c": "z"}
    case = Case(CHAIN, ["c"], built(CHAIN), force=["a"], setup_outputs=same, run_outputs=same)
    outcome = run_case(any_runner, case, str(tmp_path))
    assert outcome.ran == ["a", "b"]
    forced_reader = action(outcome, "b")
    assert forced_reader.action == BUILD and forced_reader.unless_unchanged == ()
    assert forced_reader.reason == "stale: upstream graph/a@v1 is rebuilt in this run"
    planned = action(outcome, "c")
    assert planned.action == BUILD and planned.unless_unchanged == ("graph/b@v1",)
    assert planned.reason == (
        "stale: upstream graph/b@v1 is rebuilt in this run "
        "(rebuilt unless the upstream output is unchanged)"
    )
    report = getattr(any_runner, "last_report", None)
    if report is not None:  # the local runner's `marin run --json` report
        c = next(s for s in report.to_json()["steps"] if s["step"] == "graph/c@v1")
        assert c["action"] == "unchanged"
        assert c["reason"].endswith("upstream graph/b@v1 rebuilt, output unchanged")


def test_rebuilt_with_one_byte_different_cascades(any_runner: Any, tmp_path: Any) -> None:
    case = Case(
        CHAIN,
        ["c"],
        built(CHAIN),
        force=["a"],
        setup_outputs={"a": "a", "b": "y", "c": "z"},
        run_outputs={"a": "b", "b": "y", "c": "z"},
    )
    outcome = run_case(any_runner, case, str(tmp_path))
    assert outcome.ran == ["a", "b"]  # b's own bytes are the same again: c is cut off
    assert action(outcome, "c").unless_unchanged == ("graph/b@v1",)


def test_record_without_lineage_loads_as_unknown_not_stale(any_runner: Any, tmp_path: Any) -> None:
    case = Case(CHAIN, ["c"], built(CHAIN, b="old", c="old"))
    outcome = run_case(any_runner, case, str(tmp_path))
    assert outcome.ran == []
    for name in ("b", "c"):
        decision = action(outcome, name)
        assert decision.action == SKIP and decision.lineage == LINEAGE_UNKNOWN
        assert "lineage unknown" in decision.reason and not decision.stale


MIXED = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"], "f": ["c"], "g": ["e", "f"]}
MIXED_CASES = {
    "every-state-warn": Case(
        MIXED,
        ["g"],
        dict(a="built", b="drifted", c="stale", d="missing", e="corrupt", f="old", g="failed"),
    ),
    "every-state-rebuild-force-no-cascade": Case(
        MIXED,
        ["g"],
        dict(a="built", b="drifted", c="stale", d="missing", e="corrupt", f="old", g="failed"),
        on_drift="rebuild",
        force=["c"],
        cascade=False,
    ),
    "pruned-middle-two-targets": Case(
        MIXED,
        ["e", "f"],
        dict(a="old", b="stale", c="missing", d="built", e="failed", f="drifted", g="built"),
        on_drift="rebuild",
    ),
}


@pytest.mark.parametrize("name", sorted(MIXED_CASES))
def test_mixed_store_states_run_as_planned(any_runner: Any, tmp_path: Any, name: str) -> None:
    """The property test's check on a few fixed graphs that hold every store state at once."""
    outcome = run_case(any_runner, MIXED_CASES[name], str(tmp_path))
    actions = outcome.actions()
    assert BUILD in actions.values() and SKIP in actions.values(), actions
