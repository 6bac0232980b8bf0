"""A step whose attempt ends in a final error (the core's ``is_final``: a cancelled job) fails
its Airflow task without Airflow's retries (``AirflowFailException``), as the run loop spends
none on it: one try under ``retries=2``, through ``airflow dags test``.

Two paths: the error raised by ``fn`` (``cancel_pipelines.stopped``), as the core's remote call
raises it; and a remote step's real job stopped while its task is deferred on it (holding no
lease), by ``marin cancel`` or by its backend: the resumed task waits for that job
(``awaited_job``), so it fails as cancelled instead of submitting a new one, and a later
``marin run`` builds the step anew."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from marin.execution.remote.fence import stop_job
from marin.execution.remote.registry import get_backend
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.step_folder import read_job
from tests.reliability.test_gang_cancel import starts
from tests.reliability.test_remote import setup

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "tests" / "reliability" / "cancel_pipelines.py"
STEP, OUTPUT = "cancel/retried@v1", "cancel/retried/v1"
pytestmark = pytest.mark.slow


def test_a_final_error_fails_its_task_without_airflow_retries(tmp_path: Path, sandbox: Any) -> None:
    from marin_airflow.export import build_export, write_export

    dags, prefix, calls = tmp_path / "dags", str(tmp_path / "prefix"), tmp_path / "calls"
    result = build_export(f"{PIPELINES}:final", str(dags), dag_id="final_error")
    write_export(result)
    (task,) = [t for t in result.tasks if t.step_id == "cancel/final@v1"]
    assert task.retries == 2
    env = {
        "MARIN_TEST_CALLS": str(calls),
        "MARIN_PREFIX": prefix,
        "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "1",  # a wrong retry shows at once
    }
    proc = sandbox.dags_test(result.dag_id, str(dags), env=env)
    out = proc.stdout + proc.stderr
    assert "AirflowFailException" in out and "was stopped (cancelled)" in out, out[-4000:]
    run_id = sandbox.latest_run_id(result.dag_id)
    runs = sandbox.query("SELECT state FROM dag_run WHERE run_id = ?", (run_id,))
    assert runs == [("failed",)], runs  # the run failed
    rows = sandbox.query(
        "SELECT state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ? "
        "AND task_id = ?",
        (result.dag_id, run_id, task.task_id),
    )
    assert rows == [("failed", 1)], rows  # one try: Airflow did not retry it
    assert len(calls.read_text().splitlines()) == 1  # fn ran once
    assert read_record(open_prefix(prefix), "cancel/final/v1") is None


def _marin(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "marin.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _deferred(sandbox: Any, dag_id: str, task_id: str) -> None:
    """Until the step's task has deferred, as the metadata database says (polled): the method
    it resumes in is recorded (``dags test`` runs the trigger in-process, the task's state
    shown as queued meanwhile)."""
    sql = "SELECT next_method FROM task_instance WHERE dag_id = ? AND task_id = ?"
    deadline = time.monotonic() + 120
    while True:
        rows: list[tuple[Any, ...]] = []
        with contextlib.suppress(sqlite3.OperationalError):  # the database is busy
            rows = sandbox.query(sql, (dag_id, task_id))
        if ("execute_complete",) in rows:
            return
        assert time.monotonic() < deadline, rows
        time.sleep(0.1)


def _stop_while_deferred(
    tmp_path: Path, sandbox: Any, how: str, env: dict[str, str], ids: tuple[str, str]
) -> str:
    """Once the job runs ``fn`` (it wrote its line) and the task deferred on it, stop the job
    (``marin cancel`` through the CLI, or its backend); then open the gate, so that a wrongly
    submitted second job would finish (the run succeed) instead of hanging. The job id."""
    starts(tmp_path, 1)
    _deferred(sandbox, *ids)
    prefix = env["MARIN_PREFIX"]
    job = read_job(open_prefix(prefix), OUTPUT)
    assert job is not None
    if how == "cancel":
        done = _marin(env, "cancel", STEP, "--prefix", prefix)
        assert done.returncode == 0, done.stderr
        assert f"stopped local job {job.job_id}, running" in done.stdout, done.stdout
        assert "removed its job record" in done.stdout, done.stdout  # no driver held it
    else:
        stop_job(get_backend(job.backend), job, STEP)
    (tmp_path / "gate").touch()
    return job.job_id


@pytest.mark.parametrize("how", ["cancel", "backend"])
def test_a_job_stopped_while_its_task_is_deferred_fails_the_run_and_is_never_resubmitted(
    tmp_path: Path, sandbox: Any, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    from marin_airflow.export import build_export, write_export

    prefix, env = setup(tmp_path)
    env["MARIN_PREFIX"] = prefix
    monkeypatch.setenv("MARIN_LOCAL_JOBS", env["MARIN_LOCAL_JOBS"])  # the backend finds its job
    dags = tmp_path / "dags"
    result = build_export(f"{PIPELINES}:retried", str(dags), dag_id=f"deferred_{how}")
    write_export(result)
    (task,) = [t for t in result.tasks if t.step_id == STEP]
    assert task.retries == 2
    keys = ("MARIN_TEST_CALLS", "MARIN_TEST_GATE", "MARIN_REMOTE_POLL_MAX_S", "MARIN_LOCAL_JOBS")
    run_env = {k: env[k] for k in keys} | {
        "MARIN_PREFIX": prefix,
        "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "1",  # a wrong retry shows at once
    }
    with ThreadPoolExecutor(1) as pool:
        ids = (result.dag_id, task.task_id)
        stopped = pool.submit(_stop_while_deferred, tmp_path, sandbox, how, env, ids)
        proc = sandbox.dags_test(result.dag_id, str(dags), env=run_env)
        job_id = stopped.result(timeout=120)
    out = proc.stdout + proc.stderr
    assert f"local job {job_id} was stopped (cancelled" in out, out[-4000:]
    assert "AirflowFailException" in out, out[-4000:]
    run_id = sandbox.latest_run_id(result.dag_id)
    runs = sandbox.query("SELECT state FROM dag_run WHERE run_id = ?", (run_id,))
    assert runs == [("failed",)], runs
    rows = sandbox.query(
        "SELECT state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ? "
        "AND task_id = ?",
        (result.dag_id, run_id, task.task_id),
    )
    assert rows == [("failed", 1)], rows  # one try: Airflow did not retry it (retries=2)
    assert len((tmp_path / "calls").read_text().splitlines()) == 1  # one job, never resubmitted
    location = open_prefix(prefix)
    assert read_record(location, OUTPUT) is None and read_job(location, OUTPUT) is None
    # A new run waits for no job: the cancel is not its, and it builds the step with a new job.
    again = _marin(env, "run", f"{PIPELINES}:retried", "--prefix", prefix)
    assert again.returncode == 0, again.stderr[-4000:]
    record = read_record(location, OUTPUT)
    assert record is not None and record.provenance["job"]["job_id"] != job_id
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    assert not (Path(prefix) / f"{OUTPUT}.marin" / "cancel.json").exists()
