"""Airflow's own OpenLineage provider reports Marin's datasets for each step task.

The committed example DAG under ``airflow dags test``, with the provider's file transport and
Marin's own events (another file) both on: each step task's COMPLETE from the provider names
exactly the datasets Marin's COMPLETE for that step names (``artifact_names``, under the run's
real prefix), and validates against the OpenLineage schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from marin.execution.builder.lineage.names import step_datasets
from marin_airflow.runtime import PLAN_TASK_ID
from tests.airflow.conftest import ROOT
from tests.lineage.helpers import EXAMPLE, check_event, read_events

pytest.importorskip("airflow.providers.openlineage")
pytest.importorskip("openlineage.client")

DAG_ID = "ngram_pipeline"


def _pairs(datasets: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in datasets}


def _by_task(events: list[dict[str, Any]], state: str) -> dict[str, dict[str, Any]]:
    """The provider's events of one type, by Airflow task id (its job is ``<dag>.<task>``)."""
    prefix = DAG_ID + "."
    return {
        e["job"]["name"].removeprefix(prefix): e
        for e in events
        if e["eventType"] == state and e["job"]["name"].startswith(prefix)
    }


@pytest.mark.slow
def test_the_provider_reports_marins_datasets_for_each_step_task(
    tmp_path: Path, sandbox: Any
) -> None:
    from marin.execution.store.location import open_prefix
    from marin_airflow.export import assign_task_ids, lower_target

    provider_log, marin_log = tmp_path / "provider.jsonl", tmp_path / "marin.jsonl"
    config = tmp_path / "openlineage.yml"
    config.write_text(f"transport:\n  type: file\n  log_file_path: {marin_log}\n  append: true\n")
    transport = {"type": "file", "log_file_path": str(provider_log), "append": True}
    env = {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "airflow",
        "OPENLINEAGE_CONFIG": str(config),  # Marin's own events, to compare with
    }
    prefix = tmp_path / "art"
    conf = {"prefix": str(prefix)}
    proc = sandbox.dags_test(DAG_ID, str(ROOT / "dags"), conf=conf, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]

    specs = lower_target(EXAMPLE)
    task_ids = assign_task_ids(s.step_id for s in specs)
    location = open_prefix(str(prefix))
    provider = read_events(provider_log)
    for event in provider:
        check_event(event)
    marin_done = {
        e["job"]["name"]: e for e in read_events(marin_log) if e["eventType"] == "COMPLETE"
    }
    starts, done = _by_task(provider, "START"), _by_task(provider, "COMPLETE")
    for spec in specs:
        task = task_ids[spec.step_id]
        inputs, output = step_datasets(location, spec)
        expected_in = {(n.dataset_namespace, n.dataset_name) for n in inputs.values()}
        expected_out = {(output.dataset_namespace, output.dataset_name)}
        assert _pairs(done[task]["inputs"]) == expected_in, spec.step_id
        assert _pairs(done[task]["outputs"]) == expected_out, spec.step_id
        ours = marin_done[spec.step_id]
        assert _pairs(ours["inputs"]) == expected_in and _pairs(ours["outputs"]) == expected_out
        assert output.dataset_name == str(prefix / spec.output_path)  # the run's real prefix
        assert starts[task]["outputs"] == []  # no output is claimed before the build

    # A fully cached run launches no step task (marin-plan skips them): the provider reports
    # the plan task, no step task, and no event claims an output.
    provider_log.unlink()
    again = sandbox.dags_test(DAG_ID, str(ROOT / "dags"), conf=conf, env=env)
    assert again.returncode == 0, again.stderr[-4000:]
    events = read_events(provider_log)
    for event in events:
        check_event(event)
    completed = _by_task(events, "COMPLETE")
    assert PLAN_TASK_ID in completed
    assert not set(completed) & set(task_ids.values()), sorted(completed)
    assert [e["job"]["name"] for e in events if e.get("outputs")] == []
