"""The same 3-rank gang step (``tcp_gang``: ranks that meet over TCP) on Prefect (a compiled
flow) and on Airflow (the exported DAG, ``airflow dags test``): each builds it once, one job, and
records the sum ``marin run`` does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.test_gang import GANG, TCP
from tests.reliability.test_remote import job_folders, setup, setup_prefect

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
FLOW = """
from marin_prefect import to_prefect_flow
to_prefect_flow({target!r}, prefix={prefix!r})()
"""


def _built_once(tmp_path: Path, prefix: str) -> None:
    record = read_record(open_prefix(prefix), TCP)
    assert record is not None and record.result["sum"] == 6.0 and record.result["rank"] == 0
    assert record.provenance["job"]["preemptions"] == 0
    assert len((tmp_path / "calls").read_text().splitlines()) == 3  # one gang of three
    assert job_folders(prefix) == []


def test_a_gang_on_prefect_builds_once(tmp_path: Path) -> None:
    pytest.importorskip("prefect")
    prefix, env = setup_prefect(tmp_path)
    (tmp_path / "gate").touch()
    flow = FLOW.format(target=f"{GANG}:tcp_gang", prefix=prefix)
    done = subprocess.run([sys.executable, "-c", flow], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    _built_once(tmp_path, prefix)


def test_a_gang_on_airflow_dags_test_builds_once(tmp_path: Path) -> None:
    pytest.importorskip("airflow.sdk")
    from marin_airflow.export import build_export, write_export
    from marin_testing.airflow import AirflowSandbox

    prefix, env = setup(tmp_path)
    (tmp_path / "gate").touch()
    dags = tmp_path / "dags"
    write_export(build_export(f"{ROOT / GANG}:tcp_gang", str(dags), dag_id="gang"))
    box = AirflowSandbox(str(tmp_path / "airflow"), pythonpath=[str(ROOT)])
    env["MARIN_PREFIX"] = prefix
    done = box.dags_test("gang", str(dags), env=env, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert set(box.task_states("gang").values()) == {"success"}
    _built_once(tmp_path, prefix)
