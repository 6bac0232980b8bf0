"""Remote steps on the ``local`` backend: real driver processes, real detached jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from marin.execution.errors import InvalidStepError
from marin.execution.lazy import OUT, apply, lower
from marin.execution.pipeline.remote.job_record import JobRecord, create_job, read_job
from marin.execution.pipeline.remote.local_job import start_time
from marin.execution.run.remote_slots import Slots
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability import remote_pipelines
from tests.reliability.conftest import REPO, child_env
from tests.reliability.pipelines import wait_for_file

TRAIN = "remote/train/v1"


def marin_run(
    target: str, prefix: str, env: dict[str, str], err: Path, *extra: str
) -> subprocess.Popen[str]:
    cli = [
        sys.executable,
        "-m",
        "marin.cli",
        "run",
        f"tests/reliability/remote_pipelines.py:{target}",
    ]
    return subprocess.Popen(
        [*cli, "--prefix", prefix, *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err.open("w"),
        text=True,
        start_new_session=True,
    )


def wait_for_text(path: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert time.monotonic() < deadline, (
            f"{text!r} never appeared in {path}:\n{path.read_text()}"
        )
        time.sleep(0.01)


def setup(tmp_path: Path, **extra: str) -> tuple[str, dict[str, str]]:
    (tmp_path / "started").mkdir()
    env = child_env(
        MARIN_TEST_CALLS=str(tmp_path / "calls"),
        MARIN_TEST_STARTED=str(tmp_path / "started"),
        MARIN_TEST_GATE=str(tmp_path / "gate"),
        MARIN_REMOTE_POLL_MAX_S="0.2",
        **extra,
    )
    return str(tmp_path / "prefix"), env


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def job_folders(prefix: str) -> list[str]:
    return sorted(p for p in os.listdir(f"{prefix}/{TRAIN}.marin") if p.startswith("marin-"))


def test_sigkilled_driver_reattaches_one_job(tmp_path: Path) -> None:
    """SIGKILL ``marin run`` while the job runs: the next run reattaches; fn ran once."""
    prefix, env = setup(tmp_path)
    first = marin_run("chain", prefix, env, tmp_path / "first.err")
    started = tmp_path / "started" / "remote_train"
    wait_for_file(str(started), timeout=60)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    job_pid = int(started.read_text().split()[0])
    assert start_time(job_pid) is not None  # the job outlived its driver
    second = marin_run("chain", prefix, env, tmp_path / "second.err")
    wait_for_text(tmp_path / "second.err", "reattach remote/train@v1")
    (tmp_path / "gate").touch()
    assert second.wait(timeout=60) == 0, (tmp_path / "second.err").read_text()
    assert calls(tmp_path) == [f"remote/train {job_pid}"]  # fn ran once
    location = open_prefix(prefix)
    record = read_record(location, TRAIN)
    job = read_job(location, TRAIN)
    assert record is not None and job is not None
    assert record.provenance["job"]["job_id"] == job.job_id and len(job_folders(prefix)) == 1
    assert record.result == {"pid": job_pid}
    assert read_record(location, "remote/eval/v1") is not None  # downstream built from it
    assert "submit remote/train" not in (tmp_path / "second.err").read_text()


def test_waiting_remote_steps_hold_no_slot(tmp_path: Path) -> None:
    """max_concurrent=1, three remote steps that each wait for all three: they can only finish
    if all three jobs run at once (a barrier, not a stopwatch)."""
    (tmp_path / "barrier").mkdir()
    prefix, env = setup(tmp_path, MARIN_TEST_BARRIER=str(tmp_path / "barrier"))
    del env["MARIN_TEST_GATE"]
    proc = marin_run("fan", prefix, env, tmp_path / "err", "--max-concurrent", "1")
    assert proc.wait(timeout=90) == 0, (tmp_path / "err").read_text()
    assert sorted(os.listdir(tmp_path / "barrier")) == ["fan_a", "fan_b", "fan_c"]


def test_max_remote_bounds_jobs_and_not_local_steps() -> None:
    """The loop's two bounds: remote jobs count against max_remote only, local steps against
    max_concurrent only."""
    slots = Slots(1, 2, lambda path: path.startswith("r"))
    assert slots.free({"r1", "l1"}) == 1  # one job slot left, no local slot
    assert not slots.admit("l2") and slots.admit("r2") and not slots.admit("r3")
    assert slots.free(set()) == 3
    assert slots.admit("l1") and slots.admit("r1") and slots.admit("r2") and not slots.admit("l2")
