"""A remote step on Prefect: kill the flow-run process mid-job, run the flow again: it
reattaches to the same job (one submission), and commits (docs/prefect.md, docs/remote.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.pipelines import wait_for_file
from tests.reliability.test_remote import TRAIN, calls, job_folders, setup_prefect

ROOT = Path(__file__).resolve().parents[2]
FLOW = """
from marin_prefect import to_prefect_flow
to_prefect_flow("tests/reliability/remote_pipelines.py:chain", prefix={prefix!r})()
"""


def flow_run(prefix: str, env: dict[str, str], err: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", FLOW.format(prefix=prefix)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err.open("w"), text=True,
        start_new_session=True,
    )  # fmt: skip


@pytest.mark.slow
def test_killed_flow_run_reattaches_to_its_job(tmp_path: Path) -> None:
    prefix, env = setup_prefect(tmp_path)
    first = flow_run(prefix, env, tmp_path / "first.err")
    wait_for_file(str(tmp_path / "started" / "remote_train"), timeout=120)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    (job,) = job_folders(prefix)
    (tmp_path / "gate").touch()
    second = flow_run(prefix, env, tmp_path / "second.err")
    assert second.wait(timeout=180) == 0, (tmp_path / "second.err").read_text()[-4000:]
    assert len(calls(tmp_path)) == 1  # fn ran once
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.provenance["job"]["job_id"] == job  # one submission
    assert job_folders(prefix) == []  # committed: its files are gone
    assert read_record(open_prefix(prefix), "remote/eval/v1") is not None
