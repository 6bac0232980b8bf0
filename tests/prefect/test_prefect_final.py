"""A remote step whose job ``marin cancel`` stopped fails its Prefect task run without
Prefect's retries (the core's ``is_final``, asked by ``retry_condition_fn``), as the run loop
spends none on it: one attempt, one job, under ``retries=2``."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin_prefect import to_prefect_flow
from tests.prefect.prefect_helpers import flow_run_id, task_runs
from tests.reliability import cancel_pipelines
from tests.reliability.test_gang_cancel import cli, starts
from tests.reliability.test_remote import setup

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
STEP = "cancel/retried@v1"


def _cancel_once_started(tmp_path: Path, prefix: str, env: dict[str, str]) -> str:
    """``marin cancel`` once the job's ``fn`` runs; then the gate opens, so a wrongly retried
    attempt's new job would finish (and the flow succeed) instead of hanging the test."""
    starts(tmp_path, 1)
    done: subprocess.CompletedProcess[str] = cli("cancel", STEP, "--prefix", prefix, env=env)
    (tmp_path / "gate").touch()
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_cancelled_job_is_not_retried_by_prefect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, env = setup(tmp_path)
    for name in ("MARIN_TEST_CALLS", "MARIN_TEST_GATE", "MARIN_REMOTE_POLL_MAX_S",
                 "MARIN_LOCAL_JOBS", "PYTHONPATH"):  # fmt: skip
        monkeypatch.setenv(name, env[name])  # the flow runs here; its job inherits these
    flow = to_prefect_flow(cancel_pipelines.retried, prefix=prefix)
    with ThreadPoolExecutor(1) as pool:
        cancelled = pool.submit(_cancel_once_started, tmp_path, prefix, env)
        state = flow(return_state=True)
        said = cancelled.result(timeout=120)
    assert "stopped local job marin-" in said, said
    assert state.is_failed(), state
    run = task_runs(flow_run_id(state), expected=1)[STEP]
    assert run.state is not None and run.state.is_failed(), run.state
    assert "was stopped (cancelled" in (run.state.message or ""), run.state.message
    assert run.run_count == 1  # Prefect did not retry it (retries=2)
    assert len((tmp_path / "calls").read_text().splitlines()) == 1  # one job, never resubmitted
    assert read_record(open_prefix(prefix), "cancel/retried/v1") is None
