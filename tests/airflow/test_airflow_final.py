"""A step whose attempt ends in a final error (the core's ``is_final``: a cancelled job) fails
its Airflow task without Airflow's retries (``AirflowFailException``), as the run loop spends
none on it: one try under ``retries=2``, through ``airflow dags test``.

The error is raised by ``fn`` (``cancel_pipelines.stopped``), as the core's remote call raises
it: the same ``_build`` path. A remote job stopped while its task is deferred never reaches it
(the resumed task resubmits a stopped job it finds), so it is not the path tested here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "tests" / "reliability" / "cancel_pipelines.py"
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
