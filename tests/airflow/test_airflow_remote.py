"""Remote steps on a real Airflow (LocalExecutor, SQLite) with ``airflow triggerer``: a task
whose job runs defers, giving its pool slot back, and resumes to commit (docs/remote.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "tests" / "reliability" / "remote_pipelines.py"


@pytest.mark.slow
def test_two_remote_steps_overlap_in_a_one_slot_pool(tmp_path: Path) -> None:
    """Each job waits until both jobs have started: the run succeeds only if the first task
    gave its slot back while its job ran (deferred), so the second could start its own."""
    from marin_airflow.export import build_export, write_export
    from marin_testing.airflow import AirflowSandbox, AirflowServices

    root, prefix = tmp_path / "services", tmp_path / "prefix"
    (tmp_path / "barrier").mkdir()
    env = {
        "MARIN_PREFIX": str(prefix),
        "MARIN_TEST_BARRIER": str(tmp_path / "barrier"),
        "MARIN_TEST_BARRIER_STEPS": "fan_a,fan_b",
        "MARIN_TEST_CALLS": str(tmp_path / "calls"),
    }
    box = AirflowSandbox(str(root), pythonpath=[str(ROOT)])
    box.migrate()
    dags = root / "dags"
    write_export(build_export(f"{PIPELINES}:pooled", str(dags), dag_id="pooled"))
    pools = box.airflow("pools", "set", "one", "1", "one slot", timeout=120)
    assert pools.returncode == 0, pools.stderr[-2000:]
    with AirflowServices(box, str(dags), env=env, triggerer=True) as services:
        services.wait_for_dags(["pooled"])
        run_id = services.trigger("pooled")
        assert services.wait_for_run("pooled", run_id) == "success", services.log_tail(8000)
    assert sorted(os.listdir(tmp_path / "barrier")) == ["fan_a", "fan_b"]
    location = open_prefix(str(prefix))
    for name in ("fan/a", "fan/b"):
        record = read_record(location, f"{name}/v1")
        assert record is not None and record.provenance["job"]["backend"] == "local"
    # One job per build: each fn ran once, although each task ran twice (defer, resume).
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    shutil.rmtree(prefix, ignore_errors=True)
