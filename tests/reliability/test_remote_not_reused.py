"""A remote step's recorded job is never reused by a build that must start afresh (red team
round 12): a forced build (``--force``: forcing repairs the job's output), and a build over
an output that ``marin gc`` was deleting when it died (half deleted). The job is cancelled
(or, ended, forgotten), the output cleared, and a job of the build's own submitted."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from marin.execution.remote.procs import start_time
from marin.execution.store.location import open_prefix
from marin.execution.store.records import GC_DELETING, read_record, read_status_file
from marin.execution.store.step_folder import read_job
from tests.reliability.conftest import REPO
from tests.reliability.test_remote import (
    TRAIN,
    calls,
    driver_killed_while_its_job_runs,
    marin_cli,
    marin_run,
    setup,
    wait_for_text,
)


def _job_line(prefix: str, env: dict[str, str], *extra: str) -> dict[str, object]:
    plan = json.loads(marin_cli("plan", "chain", prefix, env, "--json", *extra))
    return next(s["job"] for s in plan["steps"] if s["step"] == "remote/train@v1")


def _damage(prefix: str) -> None:
    (Path(prefix) / TRAIN).mkdir(parents=True, exist_ok=True)
    (Path(prefix) / TRAIN / "model.txt").write_text("DAMAGED")


def test_a_forced_build_never_reattaches_nor_collects_an_earlier_drivers_job(
    tmp_path: Path,
) -> None:
    """The driver dies while its job runs; ``--force remote/train`` (to repair the output)
    cancels that job, clears the output and builds in a job of its own: the plan says so."""
    prefix, env = setup(tmp_path)
    old_pid = driver_killed_while_its_job_runs(tmp_path, prefix, env)
    _damage(prefix)
    shown = _job_line(prefix, env, "--force", "remote/train")
    assert shown["other_config"] and shown["differs"] == "forced", shown
    text = marin_cli("plan", "chain", prefix, env, "--force", "remote/train")
    assert "cancel (forced): local job" in text, text
    (tmp_path / "gate").touch()
    forced = marin_run("chain", prefix, env, tmp_path / "forced.err", "--force", "remote/train")
    assert forced.wait(timeout=90) == 0, (tmp_path / "forced.err").read_text()
    err = (tmp_path / "forced.err").read_text()
    assert "is not reused (forced)" in err and "reattach remote/train" not in err, err
    assert start_time(old_pid) is None
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.result["pid"] != old_pid
    assert (Path(prefix) / TRAIN / "model.txt").read_text().startswith("model from")
    assert len(calls(tmp_path)) == 2


def _job_ended(pid: int) -> None:
    deadline = time.monotonic() + 60
    while start_time(pid) is not None:
        assert time.monotonic() < deadline, f"job {pid} never ended"
        time.sleep(0.05)


def test_a_job_whose_output_gc_was_deleting_is_never_collected(tmp_path: Path) -> None:
    """The driver dies; its job succeeds, uncollected; a teammate's ``marin gc`` of another
    pipeline dies while deleting the step (its record gone, its output still there, its mark
    written): the next run neither collects the job nor serves its output, but builds anew."""
    prefix, env = setup(tmp_path)
    old_pid = driver_killed_while_its_job_runs(tmp_path, prefix, env)
    (tmp_path / "gate").touch()
    _job_ended(old_pid)
    assert _job_line(prefix, env)["state"] == "succeeded"
    crash = {**env, "MARIN_FAULT_CRASH": f"gc-after-record@{TRAIN.rsplit('/', 1)[0]}"}
    gc = subprocess.run(
        [sys.executable, "-m", "marin.cli", "gc", "tests/reliability/remote_pipelines.py:fan",
         "--prefix", prefix],
        cwd=REPO, env=crash, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert gc.returncode == -9, gc.stderr
    location = open_prefix(prefix)
    assert read_job(location, TRAIN) is not None  # the job's record is left beside...
    assert read_status_file(location, TRAIN)["error"] == GC_DELETING  # ...gc's mark
    _damage(prefix)  # what a half-deleted output holds is not the job's output any more
    shown = _job_line(prefix, env)
    assert shown["other_config"] and "gc was deleting" in str(shown["differs"]), shown
    second = marin_run("chain", prefix, env, tmp_path / "second.err")
    assert second.wait(timeout=90) == 0, (tmp_path / "second.err").read_text()
    err = (tmp_path / "second.err").read_text()
    assert "is not reused (marin gc was deleting" in err, err
    record = read_record(location, TRAIN)
    assert record is not None and record.result["pid"] != old_pid
    assert (Path(prefix) / TRAIN / "model.txt").read_text().startswith("model from")
    assert len(calls(tmp_path)) == 2


def test_a_build_that_no_longer_runs_remotely_stops_the_orphaned_job_first(
    tmp_path: Path,
) -> None:
    """Red team round 13, finding 1: the driver dies while its job runs; the step's ``remote``
    option is removed and it is built here. That build cleared the output while the old job
    still wrote, and committed the job's late files as its own: the job is cancelled and
    confirmed ended (and forgotten) before anything is cleared."""
    prefix, env = setup(tmp_path)
    old_pid = driver_killed_while_its_job_runs(tmp_path, prefix, env)
    here = {**env, "MARIN_TEST_BACKEND": ""}
    second = marin_run("chain", prefix, here, tmp_path / "second.err")
    wait_for_text(tmp_path / "started" / "remote_train", f"{second.pid}\n")  # fn runs here
    assert (
        "is not reused (the step no longer runs as a remote"
        in (tmp_path / "second.err").read_text()
    )
    assert start_time(old_pid) is None  # ended before the output was cleared
    assert read_job(open_prefix(prefix), TRAIN) is None  # forgotten: no later run collects it
    (tmp_path / "gate").touch()
    assert second.wait(timeout=90) == 0, (tmp_path / "second.err").read_text()
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.result["pid"] == second.pid
    assert len(calls(tmp_path)) == 2


def test_a_forced_run_never_serves_an_earlier_job_another_run_collected(tmp_path: Path) -> None:
    """Red team round 13, finding 3: while a plain run reattaches to an earlier driver's job,
    a ``--force`` run waits for the lease; the plain run commits the job's output, and the
    forced run served it as "built by another runner": that is not the repair it asked for."""
    prefix, env = setup(tmp_path)
    old_pid = driver_killed_while_its_job_runs(tmp_path, prefix, env)
    plain = marin_run("chain", prefix, env, tmp_path / "plain.err")
    wait_for_text(tmp_path / "plain.err", "reattach remote/train@v1")
    forced = marin_run("chain", prefix, env, tmp_path / "forced.err", "--force", "remote/train")
    wait_for_text(tmp_path / "forced.err", "wait remote/train@v1")
    (tmp_path / "gate").touch()
    assert plain.wait(timeout=90) == 0, (tmp_path / "plain.err").read_text()
    assert forced.wait(timeout=90) == 0, (tmp_path / "forced.err").read_text()
    assert "built by another runner" not in (tmp_path / "forced.err").read_text()
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.result["pid"] != old_pid
    assert len(calls(tmp_path)) == 2


def test_a_build_here_refuses_a_local_job_that_writes_its_output_unrecorded(
    tmp_path: Path,
) -> None:
    """Red team round 15, finding 1: the driver dies while its job runs; ``job.json`` is deleted
    by hand; the step is then built here (its ``remote`` option removed): that build cleared
    the output under the running job and committed its late files. It is refused, as a remote
    step's build is, naming the job; nothing is cleared."""
    prefix, env = setup(tmp_path)
    old_pid = driver_killed_while_its_job_runs(tmp_path, prefix, env)
    (Path(prefix) / f"{TRAIN}.marin" / "job.json").unlink()
    here = {**env, "MARIN_TEST_BACKEND": ""}
    refused = marin_run("chain", prefix, here, tmp_path / "here.err")
    assert refused.wait(timeout=90) != 0
    err = (tmp_path / "here.err").read_text()
    assert "still runs and writes this step's output" in err, err
    assert start_time(old_pid) is not None  # left alone: the user stops it
    assert read_record(open_prefix(prefix), TRAIN) is None
    (tmp_path / "gate").touch()
    _job_ended(old_pid)
