"""The examples do what their docstrings say (issue 55): each is slow enough to interrupt, and
the next run resumes (``resumable.py``) or reattaches to its job (``remote_train.py``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.step_folder import read_job
from tests.ux.helpers import ROOT, marin


def _start(target: str, prefix: str, err: Path, **env: str) -> subprocess.Popen[bytes]:
    """``marin run`` as a user starts it: its own session, so only it gets the Ctrl-C."""
    return subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", target, "--prefix", prefix, "--no-progress"],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=err.open("w"),
        start_new_session=True,
    )  # fmt: skip


def _wait_until(ready: object, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


def test_resumable_example_is_interrupted_half_way_and_resumes(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    err = tmp_path / "first.err"
    first = _start("examples/resumable.py:pipeline", prefix, err)  # the default pace
    checkpoint = Path(prefix, "train/levanter-style/v1/checkpoints/latest.json")
    _wait_until(checkpoint.exists, "a first checkpoint")
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=60) == 130, err.read_text()
    reached = json.loads(checkpoint.read_text())["step"]
    assert reached < 1000, "it was not interrupted half-way: it had trained to the end"
    assert read_record(open_prefix(prefix), "train/levanter-style/v1") is None

    plan = marin("plan", "examples/resumable.py:pipeline", "--prefix", prefix)
    assert "resume: partial output from attempt 1" in " ".join(plan.stdout.split()), plan.stdout

    again = marin(
        "run", "examples/resumable.py:pipeline", "--prefix", prefix, "--no-progress",
        env={"MARIN_EXAMPLE_PACE": "0"},
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    record = read_record(open_prefix(prefix), "train/levanter-style/v1")
    assert record is not None and record.provenance["attempt"] == {"number": 2, "resumed": True}
    assert record.provenance["earlier_attempts_s"] > 0  # attempt 1 began before this one
    # Its duration is this attempt's alone: the summary says it resumed, and when attempt 1
    # began (issue 55).
    resumed = r"resumed attempt 2 \(attempt 1 began \S+ earlier\)$"
    assert re.search(rf"train/levanter-style@v1 +built +\S+ +{resumed}", again.stdout, re.M)


def test_remote_example_is_interrupted_while_it_trains_and_reattached(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    err = tmp_path / "first.err"
    first = _start("examples/remote_train.py:pipeline", prefix, err, MARIN_EXAMPLE_PACE="0.004")
    _wait_until(lambda: "submit linear/train@v1: local job" in err.read_text(), "a job")
    location = open_prefix(prefix)
    job = read_job(location, "linear/train/v1")
    assert job is not None
    first.send_signal(signal.SIGINT)  # while it trains: 2000 epochs of 4 ms
    assert first.wait(timeout=60) == 130, err.read_text()
    plan = marin("plan", "examples/remote_train.py:pipeline", "--prefix", prefix)
    assert f"reattach: local job {job.job_id}, running" in plan.stdout, plan.stdout

    again = marin("run", "examples/remote_train.py:pipeline", "--prefix", prefix, "--no-progress")
    assert again.returncode == 0, again.stderr
    assert f"reattach linear/train@v1: local job {job.job_id}" in again.stderr
    record = read_record(location, "linear/train/v1")
    assert record is not None and record.provenance["job"]["job_id"] == job.job_id
    # This driver's part of the build is short; the summary, the log and `show` give the job's
    # own time, and this run's wait beside it (issue 55: 25 s shown as 0.2 s).
    ran = datetime.fromisoformat(record.finished_at) - datetime.fromisoformat(job.submitted_at)
    assert record.duration_s < ran.total_seconds()
    note = r"reattached: the job's time; \S+ waited here"
    assert re.search(rf"linear/train@v1 +built +\S+ +{note}$", again.stdout, re.M), again.stdout
    finish = re.search(rf"finish linear/train@v1 in (\S+)s \({note}\)", again.stderr)
    assert finish and float(finish.group(1)) > record.duration_s, again.stderr
    shown = marin("show", "linear/train@v1", "--prefix", prefix).stdout
    assert re.search(rf"duration +\S+s \({note}\)", shown), shown


def test_a_changed_config_clears_the_partial_output_naming_the_field(tmp_path: Path) -> None:
    """Issue 55: a resumable step's "clear" named two fingerprints; it names the field."""
    prefix = str(tmp_path / "p")
    err = tmp_path / "first.err"
    first = _start("examples/resumable.py:pipeline", prefix, err)
    checkpoint = Path(prefix, "train/levanter-style/v1/checkpoints/latest.json")
    _wait_until(checkpoint.exists, "a first checkpoint")
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=60) == 130, err.read_text()
    edited = tmp_path / "resumable.py"
    source = (ROOT / "examples" / "resumable.py").read_text()
    edited.write_text(source.replace("steps=1000, lr=0.01", "steps=1000, lr=0.02", 1))
    plan = marin("plan", f"{edited}:pipeline", "--prefix", prefix)
    flat = " ".join(plan.stdout.split())
    assert "has another fingerprint: the config or version changed (config.lr: 0.01 -> 0.02)" in (
        flat
    ), plan.stdout
    again = marin(
        "run", f"{edited}:pipeline", "--prefix", prefix, "--no-progress",
        env={"MARIN_EXAMPLE_PACE": "0"},
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "clear train/levanter-style@v1: partial output from attempt 1" in again.stderr
    assert "(config.lr: 0.01 -> 0.02); it is cleared" in again.stderr
