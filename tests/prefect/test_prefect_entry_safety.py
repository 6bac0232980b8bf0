"""Issue 11 items 6 and 7: a trigger cannot choose the code a deployment runs, nor where it writes.

Real Prefect: the session's test harness (a real API server on loopback) stores the deployment
and creates the flow runs from it, exactly as ``run_deployment`` does for a trigger; the entry
flow then runs each flow run in this process with Prefect's own flow engine, as a worker's
``python -m prefect.engine`` would. ``evil_target.py`` leaves a marker file if it is imported.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.flow_engine import run_flow
from prefect.states import State

from marin_prefect.flows import ALLOWED_TARGETS_ENV, marin_pipeline
from tests.prefect.prefect_helpers import HERE, TOY_TARGET

pytestmark = pytest.mark.usefixtures("prefect_harness", "calls")

EVIL = f"{HERE / 'evil_target.py'}:pipeline"
ENTRYPOINT = "marin_prefect.flows:marin_pipeline"


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "evil-imported"
    monkeypatch.setenv("MARIN_TEST_EVIL_MARKER", str(path))
    monkeypatch.delenv(ALLOWED_TARGETS_ENV, raising=False)
    monkeypatch.delenv("MARIN_ALLOWED_PREFIXES", raising=False)
    return path


def _deployment(parameters: dict[str, Any]) -> Any:
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(marin_pipeline)
        return client.create_deployment(
            flow_id=flow_id,
            name=f"safety-{uuid.uuid4().hex[:8]}",
            entrypoint=ENTRYPOINT,
            parameters=parameters,
        )


def _trigger(deployment_id: Any, **run: Any) -> State[Any]:
    """What a trigger can do: create a run of the deployment with its own parameters and job
    variables; then execute it as a worker would."""
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run_from_deployment(deployment_id, **run)
    state = run_flow(
        marin_pipeline, flow_run=flow_run, parameters=flow_run.parameters, return_type="state"
    )
    assert isinstance(state, State)
    return state


def test_a_run_cannot_change_the_pinned_target(tmp_path: Path, marker: Path) -> None:
    deployment = _deployment({"target": TOY_TARGET, "prefix": str(tmp_path / "p")})
    for hostile in (EVIL, "os:getpid", "http.server:test"):
        state = _trigger(deployment, parameters={"target": hostile})
        assert state.is_failed(), state
        assert "pinned" in str(state.message) and hostile in str(state.message)
    assert not marker.exists(), marker.read_text()
    assert not (tmp_path / "p").exists()  # refused before touching storage

    state = _trigger(deployment)  # the pinned target itself runs
    assert state.is_completed(), state
    assert (tmp_path / "p" / "toy").is_dir()


def test_an_allow_list_on_the_worker_lets_runs_choose(
    tmp_path: Path, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = f"{HERE / 'prefect_pipelines.py'}:fail_fast_graph"
    deployment = _deployment({"target": TOY_TARGET, "prefix": str(tmp_path / "p")})
    monkeypatch.setenv(ALLOWED_TARGETS_ENV, f"{other}, pkg.not_this:one")
    state = _trigger(deployment, parameters={"target": other})
    assert not (state.is_failed() and "pinned" in str(state.message)), state.message
    state = _trigger(deployment, parameters={"target": EVIL})
    assert state.is_failed() and "pinned" in str(state.message)
    assert not marker.exists()


def test_an_unpinned_deployment_runs_only_allowed_targets(
    tmp_path: Path, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = _deployment({"prefix": str(tmp_path / "p")})
    state = _trigger(deployment, parameters={"target": EVIL})
    assert state.is_failed() and ALLOWED_TARGETS_ENV in str(state.message)
    assert not marker.exists()
    monkeypatch.setenv(ALLOWED_TARGETS_ENV, TOY_TARGET)
    assert _trigger(deployment, parameters={"target": TOY_TARGET}).is_completed()


def test_a_run_cannot_widen_the_worker_settings(tmp_path: Path, marker: Path) -> None:
    deployment = _deployment({"target": TOY_TARGET, "prefix": str(tmp_path / "p")})
    for name in (ALLOWED_TARGETS_ENV, "MARIN_ALLOWED_PREFIXES", "MARIN_PREFECT_DASK_ADDRESS"):
        for job_variables in ({"env": {name: f"{EVIL},/"}}, {f"env.{name}": f"{EVIL},/"}):
            state = _trigger(deployment, parameters={"target": EVIL}, job_variables=job_variables)
            assert state.is_failed() and name in str(state.message), state.message
    assert not marker.exists()


def test_a_prefix_outside_the_allowed_roots_fails_before_import(
    tmp_path: Path, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = tmp_path / "allowed"
    outside = tmp_path / "victim"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    monkeypatch.setenv("MARIN_ALLOWED_PREFIXES", str(allowed))
    monkeypatch.setenv(ALLOWED_TARGETS_ENV, EVIL)  # even an allowed target is not imported
    deployment = _deployment({"target": TOY_TARGET, "prefix": str(allowed / "p")})
    for prefix in (str(outside), f"{allowed}/../victim", str(tmp_path / "allowed2")):
        state = _trigger(deployment, parameters={"target": EVIL, "prefix": prefix})
        assert state.is_failed() and "MARIN_ALLOWED_PREFIXES" in str(state.message), state
    assert not marker.exists()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert not (tmp_path / "allowed2").exists()
    assert _trigger(deployment).is_completed()
    assert (allowed / "p" / "toy").is_dir()
    assert os.environ["MARIN_ALLOWED_PREFIXES"] == str(allowed)
