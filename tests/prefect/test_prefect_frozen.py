"""A registered build is frozen on Prefect too (one commit path): a forced flow run fails its
task with the core's refusal, without Prefect's retries (``is_final``, asked by
``retry_condition_fn``), ``fn`` never runs, and the registered build is untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin.execution.lazy import run
from marin.execution.plan.options import RunOptions
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.registry import RegistryId, register
from marin_prefect import to_prefect_flow
from tests.prefect.prefect_helpers import flow_run_id, task_runs
from tests.registry.frozen_pipelines import pipeline

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
STEP, OUTPUT = "frozen/model@v1", "frozen/model/v1"


def test_a_forced_registered_build_fails_its_task_without_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, calls = str(tmp_path / "p"), tmp_path / "calls"
    monkeypatch.setenv("MARIN_TEST_FROZEN_CALLS", str(calls))
    run(pipeline(), prefix=prefix)
    location = open_prefix(prefix)
    register(location, OUTPUT, RegistryId.parse("models/m/v1"), "me@h")
    before = read_record(location, OUTPUT)
    flow = to_prefect_flow(pipeline(), prefix=prefix, options=RunOptions(force=["frozen/model"]))
    state = flow(return_state=True)
    assert state.is_failed(), state
    runs = task_runs(flow_run_id(state), expected=1)
    task = runs[STEP]
    assert task.state is not None and task.state.is_failed(), task.state
    assert "is registered as models/m/v1" in (task.state.message or ""), task.state.message
    assert task.run_count == 1  # Prefect did not retry it (retries=2)
    assert calls.read_text().splitlines() == ["model 0.1"]  # fn never ran again
    assert read_record(location, OUTPUT) == before
