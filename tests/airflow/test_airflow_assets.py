"""Airflow Assets and OpenLineage from exported DAGs, on a real scheduler on loopback."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from marin.execution.builder.lineage.names import names_for_url
from marin_airflow.export import build_export, write_export
from tests.airflow.airflow_pipelines import CALLS_ENV
from tests.airflow.conftest import HERE, ROOT

PIPELINES = str(HERE / "airflow_pipelines.py")
STEP = "af/root@v1"

CONSUMER = '''
"""A DAG of a user's own, scheduled on a Marin artifact's asset."""
import datetime

from airflow.sdk import DAG, Asset
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(
    dag_id="marin_consumer",
    schedule=[Asset(uri={uri!r}, name={name!r})],
    start_date=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
):
    EmptyOperator(task_id="consume")
'''


def _runs(services: Any, dag_id: str) -> int:
    return len(services.sandbox.query("SELECT run_id FROM dag_run WHERE dag_id = ?", (dag_id,)))


def _wait_runs(services: Any, dag_id: str, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while _runs(services, dag_id) < count:
        services._check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dag_id} has {_runs(services, dag_id)} runs, not {count}")
        time.sleep(0.5)


def _rest(services: Any, path: str) -> Any:
    """GET from the REST API (the harness makes every caller an admin: no login)."""
    url = f"http://127.0.0.1:{services.port}{path}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_a_consumer_dag_runs_after_real_builds_only(tmp_path: Path, calls: Path) -> None:
    """The producer's first run builds ``af/root``: its asset event triggers the consumer. A
    fully cached second run emits no asset event; a third run forcing the step does again.
    The REST API lists the asset and its events with the artifact URL; the tasks' OpenLineage
    events name the DAG run as their parent."""
    pytest.importorskip("airflow.sdk")
    from marin_testing.airflow import AirflowSandbox, AirflowServices

    root = tmp_path / "services"
    box = AirflowSandbox(str(root), pythonpath=[str(ROOT)])
    dags, prefix = root / "dags", tmp_path / "prefix"
    result = build_export(f"{PIPELINES}:toy", str(dags))
    write_export(result)
    names = names_for_url(str(prefix / "af" / "root" / "v1"))
    (dags / "marin_consumer.py").write_text(CONSUMER.format(uri=names.asset_uri, name=STEP))
    events = tmp_path / "openlineage.jsonl"
    config = tmp_path / "openlineage.yml"
    config.write_text(f"transport:\n  type: file\n  log_file_path: {events}\n  append: true\n")
    services = AirflowServices(
        box,
        str(dags),
        env={CALLS_ENV: str(calls), "MARIN_PREFIX": str(prefix), "OPENLINEAGE_CONFIG": str(config)},
    )
    producer = result.dag_id
    with services:
        services.wait_for_dags([producer, "marin_consumer"])
        first = services.trigger(producer)
        assert services.wait_for_run(producer, first) == "success", services.log_tail(6000)
        _wait_runs(services, "marin_consumer", 1)
        cached = services.trigger(producer)
        assert services.wait_for_run(producer, cached) == "success", services.log_tail(6000)
        forced = services.trigger(producer, conf={"force": ["af/root"], "cascade": False})
        assert services.wait_for_run(producer, forced) == "success", services.log_tail(6000)
        _wait_runs(services, "marin_consumer", 2)
        # Two builds of af/root, so two events: the cached run added none (else a third run).
        assets = _rest(services, "/api/v2/assets?limit=100")["assets"]
        ours = [a for a in assets if a["uri"] == names.asset_uri]
        assert len(ours) == 1 and ours[0]["name"] == STEP
        found = _rest(services, f"/api/v2/assets/events?asset_id={ours[0]['id']}&limit=100")
        asset_events = found["asset_events"]
        assert len(asset_events) == 2
        assert {e["extra"]["url"] for e in asset_events} == {str(prefix / "af" / "root" / "v1")}
        assert {e["source_run_id"] for e in asset_events} == {first, forced}
        assert _runs(services, "marin_consumer") == 2
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    root_runs = [e for e in lines if e["job"]["name"] == STEP]
    assert [e["eventType"] for e in root_runs] == ["START", "COMPLETE", "START", "COMPLETE"]
    parent = root_runs[1]["run"]["facets"]["parent"]["job"]["name"]
    assert parent == producer
    assert root_runs[1]["run"]["facets"]["marin"]["runner"] == "airflow"
