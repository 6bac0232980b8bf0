"""A 3-rank ``local`` gang step on a real Airflow (LocalExecutor, SQLite, ``airflow
triggerer``): its task defers while the gang runs; a rank SIGKILLed meanwhile is a preemption
(the resumed task submits one new gang, counted in the record), and with ``max_preemptions=0``
the step fails and so does the DAG run: a run whose step failed never reports success."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record, read_status
from tests.airflow.test_airflow_remote import _wait_for_state
from tests.reliability.test_gang import rank_starts, wait_gone

pytest.importorskip("airflow.sdk")
ROOT = Path(__file__).resolve().parents[2]
GANGS = ROOT / "tests" / "reliability" / "gang_pipelines.py"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """Running services (with a triggerer) and the ``gang`` and ``fragile`` DAGs; the folder
    of the controls (``gang_pipelines.py``) and the prefix."""
    from marin_airflow.export import build_export, write_export
    from marin_testing.airflow import AirflowSandbox, AirflowServices

    tmp = tmp_path_factory.mktemp("airflow-gang")
    env = {
        "MARIN_PREFIX": str(tmp / "prefix"),
        "MARIN_TEST_CALLS": str(tmp / "calls"),
        "MARIN_TEST_GATE": str(tmp / "gate"),
        "MARIN_LOCAL_JOBS": str(tmp / "jobs"),
        "MARIN_REMOTE_POLL_MAX_S": "0.2",
    }
    box = AirflowSandbox(str(tmp / "services"), pythonpath=[str(ROOT)])
    box.migrate()
    dags = tmp / "services" / "dags"
    for target, dag_id in (("tcp_gang", "gang"), ("fragile_gang", "fragile")):
        write_export(build_export(f"{GANGS}:{target}", str(dags), dag_id=dag_id))
    with AirflowServices(box, str(dags), env=env, triggerer=True) as services:
        services.wait_for_dags(["gang", "fragile"])
        yield tmp, services


def _kill_a_rank_while_deferred(tmp: Path, services: Any, dag_id: str, seen: int) -> str:
    """Trigger ``dag_id``; once its gang met and its task deferred, SIGKILL one rank and wait
    until all three ranks are gone. The run id."""
    (tmp / "gate").unlink(missing_ok=True)  # the ranks wait for it once they met
    run_id = services.trigger(dag_id)
    first = rank_starts(tmp, seen + 3, timeout=300)[seen:]
    _wait_for_state(services.sandbox, dag_id, run_id, "gang", "deferred")
    os.kill(first[1], signal.SIGKILL)
    wait_gone(first, timeout=60)
    return run_id


def test_a_rank_killed_while_its_task_is_deferred_is_a_preemption(
    airflow: tuple[Path, Any],
) -> None:
    """The resumed task sees the gang lost, submits one new gang (no Airflow retry: the
    export has none) and defers again; the record counts one preemption."""
    tmp, services = airflow
    run_id = _kill_a_rank_while_deferred(tmp, services, "gang", 0)
    rank_starts(tmp, 6, timeout=300)  # the new gang met
    (tmp / "gate").touch()
    assert services.wait_for_run("gang", run_id) == "success", services.log_tail(8000)
    record = read_record(open_prefix(str(tmp / "prefix")), "gang/tcp/v1")
    assert record is not None and record.result["sum"] == 6.0
    assert record.provenance["job"]["preemptions"] == 1
    assert record.provenance["engine"]["run_id"] == run_id
    assert len((tmp / "calls").read_text().splitlines()) == 6  # two gangs, never three


def test_a_gang_lost_beyond_its_budget_fails_the_dag_run(airflow: tuple[Path, Any]) -> None:
    """``max_preemptions=0``: the lost gang fails the step, its task and the DAG run; no
    record, and its status names the lost rank."""
    tmp, services = airflow
    seen = len((tmp / "calls").read_text().splitlines()) if (tmp / "calls").exists() else 0
    run_id = _kill_a_rank_while_deferred(tmp, services, "fragile", seen)
    assert services.wait_for_run("fragile", run_id) == "failed", services.log_tail(8000)
    states = services.sandbox.task_states("fragile", run_id)
    assert any("gang" in task and state == "failed" for task, state in states.items()), states
    location = open_prefix(str(tmp / "prefix"))
    assert read_record(location, "gang/fragile/v1") is None
    status = read_status(location, "gang/fragile/v1")
    error = str((status or {}).get("error"))
    assert "ended lost (rank " in error and "was killed by SIGKILL" in error, status
    assert "after 0 preemptions (max_preemptions=0)" in error, status
    assert len((tmp / "calls").read_text().splitlines()) == seen + 3  # never resubmitted
