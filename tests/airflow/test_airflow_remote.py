"""Remote steps on a real Airflow (LocalExecutor, SQLite) with ``airflow triggerer``: a task
whose job runs defers, giving its pool slot back, and resumes to commit (docs/remote.md); and
Airflow's own retry of a task process killed mid-step, within one DAG run (``retried``): a
resumable step resumes, a remote step reattaches. One Airflow for the module (its start is most
of a test's time), with every DAG."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.step_folder import read_job
from tests.reliability.pipelines import wait_for_file
from tests.reliability.resumable_pipeline import COUNTER_ENV, KILL_ENV, KILL_ONCE_ENV

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "tests" / "reliability" / "remote_pipelines.py"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """Running services with the ``pooled``, ``chain`` and ``retried`` DAGs; the folder of the
    controls (``remote_pipelines.py``) and the prefix."""
    from marin_airflow.export import build_export, write_export
    from marin_testing.airflow import AirflowSandbox, AirflowServices

    tmp = tmp_path_factory.mktemp("airflow-remote")
    root = tmp / "services"
    for folder in ("barrier", "started"):
        (tmp / folder).mkdir()
    env = {
        "MARIN_PREFIX": str(tmp / "prefix"),
        "MARIN_TEST_BARRIER": str(tmp / "barrier"),
        "MARIN_TEST_BARRIER_STEPS": "fan_a,fan_b",
        "MARIN_TEST_CALLS": str(tmp / "calls"),
        "MARIN_TEST_STARTED": str(tmp / "started"),
        "MARIN_TEST_GATE": str(tmp / "gate"),
        # A killed triggerer's triggers go to a new one once it is seen dead.
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "4",
        # ``retried``: each step's first task process is SIGKILLed mid-step; Airflow retries
        # it after 1 s, and the retry takes the dead attempt's lease once its TTL has passed
        # (the PID check off: a retry on another worker could not use it).
        "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "1",
        "MARIN_LEASE_TTL": "6",  # as in test_celery_runs.py: no live holder loses its lease
        "MARIN_LEASE_CHECK_PID": "0",
        "MARIN_FAULT_CRASH": "after-submit@remote/retried",
        KILL_ENV: "55",
        KILL_ONCE_ENV: str(tmp / "killed"),
        COUNTER_ENV: str(tmp / "counter"),
    }
    box = AirflowSandbox(str(root), pythonpath=[str(ROOT)])
    box.migrate()
    dags = root / "dags"
    for target in ("pooled", "chain", "retried"):
        write_export(build_export(f"{PIPELINES}:{target}", str(dags), dag_id=target))
    pools = box.airflow("pools", "set", "one", "1", "one slot", timeout=120)
    assert pools.returncode == 0, pools.stderr[-2000:]
    with AirflowServices(box, str(dags), env=env, triggerer=True) as services:
        services.wait_for_dags(["pooled", "chain", "retried"])
        yield tmp, services


def _calls(tmp: Path, step: str) -> list[str]:
    path = tmp / "calls"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if line.startswith(f"{step} ")]


def test_two_remote_steps_overlap_in_a_one_slot_pool(airflow: tuple[Path, Any]) -> None:
    """Each job waits until both jobs have started: the run succeeds only if the first task
    gave its slot back while its job ran (deferred), so the second could start its own."""
    tmp, services = airflow
    (tmp / "gate").touch()  # the fan steps do not wait for it
    run_id = services.trigger("pooled")
    assert services.wait_for_run("pooled", run_id) == "success", services.log_tail(8000)
    assert sorted(os.listdir(tmp / "barrier")) == ["fan_a", "fan_b"]
    location = open_prefix(str(tmp / "prefix"))
    for name in ("fan/a", "fan/b"):
        record = read_record(location, f"{name}/v1")
        assert record is not None and record.provenance["job"]["backend"] == "local"
        # One job per build: each fn ran once, although each task ran twice (defer, resume).
        assert len(_calls(tmp, name)) == 1


def test_killed_scheduler_and_triggerer_while_deferred_the_task_reattaches(
    airflow: tuple[Path, Any],
) -> None:
    """SIGKILL the scheduler (with its LocalExecutor workers) and the triggerer while the
    remote step's task is deferred; started again, the task resumes and collects the same job:
    fn ran once, one job submitted (the record names the job recorded before the kill)."""
    tmp, services = airflow
    (tmp / "gate").unlink(missing_ok=True)  # the job waits for it
    run_id = services.trigger("chain")
    wait_for_file(str(tmp / "started" / "remote_train"), timeout=240)
    location = open_prefix(str(tmp / "prefix"))
    job = read_job(location, "remote/train/v1")
    assert job is not None
    _wait_for_state(services.sandbox, "chain", run_id, "train", "deferred")
    services.kill("scheduler", "triggerer")
    services.restart("scheduler", "triggerer")
    (tmp / "gate").touch()
    assert services.wait_for_run("chain", run_id) == "success", services.log_tail(8000)
    assert len(_calls(tmp, "remote/train")) == 1  # fn ran once
    record = read_record(location, "remote/train/v1")
    assert record is not None and record.provenance["job"]["job_id"] == job.job_id  # one job
    assert read_record(location, "remote/eval/v1") is not None


@pytest.fixture(scope="module")
def retried(airflow: tuple[Path, Any]) -> tuple[Path, Any, str, str]:
    """One run of ``retried``: both step tasks' first processes die mid-step (the counting step
    at iteration 55, the remote step right after its submit); Airflow retries each once. The
    job waits for the gate until the remote step's retry has deferred on it. The folder, the
    services, the run id and the job id that ``job.json`` named while the retry waited."""
    tmp, services = airflow
    (tmp / "gate").unlink(missing_ok=True)  # the job waits for it
    run_id = services.trigger("retried")
    _wait_for_state(services.sandbox, "retried", run_id, "remote", "deferred", try_number=2)
    job = read_job(open_prefix(str(tmp / "prefix")), "remote/retried/v1")
    assert job is not None
    (tmp / "gate").touch()
    assert services.wait_for_run("retried", run_id) == "success", services.log_tail(8000)
    return tmp, services, run_id, job.job_id


def test_a_killed_task_of_a_resumable_step_resumes_in_its_airflow_retry(
    retried: tuple[Path, Any, str, str],
) -> None:
    """The task process dies at iteration 55; its retry in the same DAG run resumes from the
    checkpoint at 50: 106 iterations, not 156, one record, attempt 2 resumed in try 2."""
    tmp, _, run_id, _ = retried
    done = [int(line.split()[1]) for line in (tmp / "counter").read_text().splitlines()]
    assert done == list(range(55)) + list(range(50, 101))
    record = read_record(open_prefix(str(tmp / "prefix")), "count/v1")
    assert record is not None
    attempt = record.provenance["attempt"]
    assert (attempt["number"], attempt["resumed"]) == (2, True), attempt
    engine = record.provenance["engine"]
    assert (engine["run_id"], engine["try_number"]) == (run_id, 2), engine


def test_a_task_killed_after_its_submit_reattaches_in_its_airflow_retry(
    retried: tuple[Path, Any, str, str],
) -> None:
    """The task process dies right after submitting its job; its retry reattaches to that job
    (deferred on it), and commits it: one submission, fn ran once, the record names the job."""
    tmp, _, run_id, job_id = retried
    assert len(_calls(tmp, "remote/retried")) == 1
    record = read_record(open_prefix(str(tmp / "prefix")), "remote/retried/v1")
    assert record is not None and record.provenance["job"]["job_id"] == job_id
    engine = record.provenance["engine"]
    assert (engine["run_id"], engine["try_number"]) == (run_id, 2), engine


def _wait_for_state(
    box: Any, dag_id: str, run_id: str, part: str, state: str, try_number: int = 1
) -> None:
    """Until the task whose id contains ``part`` is in ``state``, in try ``try_number`` or a
    later one (polled: Airflow's database)."""
    sql = "SELECT task_id, state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ?"
    deadline = time.monotonic() + 240
    while True:
        rows: list[tuple[Any, ...]] = []
        with contextlib.suppress(sqlite3.OperationalError):  # the database is busy
            rows = box.query(sql, (dag_id, run_id))
        if any(part in t and found == state and n >= try_number for t, found, n in rows):
            return
        assert time.monotonic() < deadline, rows
        time.sleep(0.2)
