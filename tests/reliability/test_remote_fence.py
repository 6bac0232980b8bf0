"""The fence of a remote step: a driver that stalled past its lease (SIGSTOP) wakes after another
driver took the step over, and touches nothing of it (``_RemoteCall._fence``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.pipelines import wait_for_file
from tests.reliability.test_remote import (
    TRAIN,
    calls,
    job_folders,
    marin_run,
    setup,
    wait_for_text,
)


def _stalled_driver(tmp_path: Path) -> tuple[str, dict[str, str], subprocess.Popen[str]]:
    """Driver A runs ``chain`` with its heartbeat paused (its lease runs out) and is SIGSTOPped
    once its job runs: the prefix, the environment, A's process."""
    prefix, env = setup(tmp_path, MARIN_LEASE_TTL="2")
    a_env = {**env, "MARIN_FAULT_PAUSE_HEARTBEAT": f"until:{tmp_path / 'never'}"}
    a = marin_run("chain", prefix, a_env, tmp_path / "a.err")
    wait_for_file(str(tmp_path / "started" / "remote_train"))
    os.kill(a.pid, signal.SIGSTOP)
    return prefix, env, a


def test_a_stalled_driver_never_clears_what_the_new_holder_committed(tmp_path: Path) -> None:
    """B takes over, collects A's finished job and commits; A wakes to a job whose folder is
    gone: it calls nothing lost, clears nothing, submits nothing, and serves B's build."""
    prefix, env, a = _stalled_driver(tmp_path)
    b = marin_run("chain", prefix, env, tmp_path / "b.err")
    wait_for_text(tmp_path / "b.err", "reattach remote/train@v1")
    (tmp_path / "gate").touch()
    assert b.wait(timeout=60) == 0, (tmp_path / "b.err").read_text()
    os.kill(a.pid, signal.SIGCONT)
    a.wait(timeout=60)
    a_err = (tmp_path / "a.err").read_text()
    assert "preempted" not in a_err and a_err.count("submit remote/train@v1") == 1, a_err
    assert (Path(prefix) / TRAIN / "model.txt").exists()  # B's committed output is there
    assert "lost the lease to another driver" in a_err, a_err
    assert read_record(open_prefix(prefix), TRAIN) is not None
    assert len(calls(tmp_path)) == 1 and job_folders(prefix) == []


def test_a_stalled_driver_leaves_the_new_holders_job_status_and_log(tmp_path: Path) -> None:
    """A's job is killed while A is stalled; B takes over and submits its own. A wakes while
    B's job runs: no resubmit, no FAILED status, no traceback in the log, no advice to kill
    B's job; B commits."""
    prefix, env, a = _stalled_driver(tmp_path)
    started = tmp_path / "started" / "remote_train"
    wait_for_text(started, "\n")
    os.kill(int(started.read_text().split()[0]), signal.SIGKILL)  # a rank dies (preempted)
    b = marin_run("chain", prefix, env, tmp_path / "b.err")
    wait_for_text(tmp_path / "b.err", "submit remote/train@v1")
    os.kill(a.pid, signal.SIGCONT)
    wait_for_text(tmp_path / "a.err", "discard remote/train@v1")  # A waits for B's lease
    (tmp_path / "gate").touch()
    assert b.wait(timeout=60) == 0, (tmp_path / "b.err").read_text()
    a.wait(timeout=60)
    a_err = (tmp_path / "a.err").read_text()
    assert "lost the lease to another driver" in a_err, a_err
    assert "preempted" not in a_err and "pgrep" not in a_err, a_err
    assert a_err.count("submit remote/train@v1") == 1, a_err
    meta = Path(prefix) / f"{TRAIN}.marin"
    log_txt = (meta / "log.txt").read_text() if (meta / "log.txt").exists() else ""
    assert "Traceback" not in log_txt and "LeaseLostError" not in log_txt, log_txt
    status = meta / "status.json"
    assert not status.exists() or json.loads(status.read_text()).get("status") != "FAILED"
    assert read_record(open_prefix(prefix), TRAIN) is not None
    assert len(calls(tmp_path)) == 2  # A's killed job and B's: never a third
