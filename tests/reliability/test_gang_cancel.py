"""``marin cancel`` between a job's loss and its resubmission (red team finding 6), a resume
across world sizes (finding 5), and a gang's placement timeout kept out of ``retries``: real
drivers and real ``local`` jobs (``cancel_pipelines.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marin.execution.errors import RemoteJobError, SymlinkError
from marin.execution.remote.gang_rules import placement_failure, unplaced_outcome
from marin.execution.remote.procs import start_time
from marin.execution.store.location import open_prefix
from marin.execution.store.records import metadata_files, read_record
from marin.execution.store.step_folder import (
    CancelMark,
    read_attempt_record,
    read_cancel_mark,
)
from tests.reliability.conftest import REPO
from tests.reliability.test_remote import setup

PIPELINES = "tests/reliability/cancel_pipelines.py"


def cli(command: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", command, *args], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def start_run(target: str, prefix: str, env: dict[str, str], err: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", f"{PIPELINES}:{target}", "--prefix", prefix,
         "--json"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err.open("w"), text=True,
        start_new_session=True,
    )  # fmt: skip


def starts(tmp_path: Path, count: int, timeout: float = 120) -> list[int]:
    """The pids of the first ``count`` rank starts, once there are that many."""
    path, deadline = tmp_path / "calls", time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return [int(line.split()[-1]) for line in lines[:count]]
        assert time.monotonic() < deadline, f"{len(lines)} of {count} starts"
        time.sleep(0.02)


def wait_gone(pids: list[int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while any(start_time(pid) is not None for pid in pids):
        assert time.monotonic() < deadline, "a rank outlived its job"
        time.sleep(0.02)


def wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.parametrize(("target", "ranks"), [("gang", 2), ("single", 1)])
def test_cancel_between_a_preemption_and_its_resubmission_stops_the_build(
    tmp_path: Path, target: str, ranks: int
) -> None:
    """A rank (or a plain job) is SIGKILLed; the driver is held right before it would submit
    the job again, and ``marin cancel`` runs then: it records the cancel for the live driver
    (exit 0, saying the driver stops the step), the driver stops the build as cancelled
    instead of resubmitting (``retries=1`` does not resubmit either), and a later run builds
    normally: the mark was that build's alone."""
    hold = tmp_path / "hold"
    hold.mkdir()
    prefix, env = setup(tmp_path)
    step = f"cancel/{target}@v1"
    output = f"cancel/{target}/v1"
    run = start_run(target, prefix, {**env, "MARIN_FAULT_HOLD": f"before-resubmit:{hold}"},
                    tmp_path / "a.err")  # fmt: skip
    first = starts(tmp_path, ranks)
    os.kill(first[-1], signal.SIGKILL)  # a preemption: an out-of-memory kill
    wait_for(hold / "held")  # the driver saw the job lost, and has not resubmitted it
    done = cli("cancel", step, "--prefix", prefix, env=env)
    assert done.returncode == 0, done.stderr
    assert "is not running; the driver holding its lease" in done.stdout, done.stdout
    assert "stops the step instead of submitting it again" in done.stdout
    mark = read_cancel_mark(open_prefix(prefix), output)
    assert mark is not None and mark.job_id.startswith("marin-")
    (hold / "go").touch()
    out, _ = run.communicate(timeout=120)
    err = (tmp_path / "a.err").read_text()
    assert run.returncode == 1, err
    assert "was stopped (cancelled" in err and "no new job is submitted" in err, err
    assert "retry " not in err  # a cancel is not fn's error: retries do not resubmit it
    assert json.loads(out)["ok"] is False
    wait_gone(first)
    assert len(starts(tmp_path, ranks)) == ranks
    assert len((tmp_path / "calls").read_text().splitlines()) == ranks  # never resubmitted
    assert read_record(open_prefix(prefix), output) is None
    assert read_cancel_mark(open_prefix(prefix), output) is None  # honoured, then removed
    # A stale mark of that build (planted back) does not stop the next one, nor does a torn one.
    (Path(prefix) / f"{output}.marin/cancel.json").write_bytes(mark.to_json())
    (tmp_path / "gate").touch()
    again = start_run(target, prefix, env, tmp_path / "b.err")
    again.communicate(timeout=180)
    assert again.returncode == 0, (tmp_path / "b.err").read_text()
    record = read_record(open_prefix(prefix), output)
    assert record is not None and record.result == {"rank": 0, "world_size": ranks}
    assert len((tmp_path / "calls").read_text().splitlines()) == 2 * ranks


def test_a_torn_or_planted_cancel_mark_names_no_build() -> None:
    """The mark is untrusted: anything but a lease token (and a Marin job id) is no mark."""
    good = CancelMark("0" * 32, "marin-" + "a" * 20, "now", "alice")
    assert CancelMark.parse(good.to_json()) == good
    for raw in (good.to_json()[:20], b"[]", b'{"lease": "../../x"}', b'{"lease": 7}',
                b'{"lease": "' + b"a" * 32 + b'", "job_id": "rm -rf"}', b"\xff",
                b'{"lease": ""}', b'{"lease": "", "job_id": ""}'):  # fmt: skip
        assert CancelMark.parse(raw) is None, raw


def _plant(folder: Path, kind: str, target: Path) -> None:
    """A ``cancel.json`` in ``folder`` that is no file ``marin cancel`` writes."""
    mark = folder / "cancel.json"
    if kind == "link":  # to a mark that would stop the build, were it followed
        os.symlink(target, mark)
    elif kind == "dangling":
        os.symlink(folder / "nowhere", mark)
    elif kind == "fifo":
        os.mkfifo(mark)
    else:
        mark.mkdir()


@pytest.mark.parametrize("kind", ["link", "dangling", "fifo", "folder"])
def test_a_cancel_mark_that_is_no_regular_file_is_no_mark(tmp_path: Path, kind: str) -> None:
    """Red team gang2 F4: a link is never followed, a FIFO never opened (``lstat`` first):
    neither is a mark, and the step folder's other checks do not refuse it either."""
    location = open_prefix(str(tmp_path / "p"))
    folder = tmp_path / "p/s/v1.marin"
    folder.mkdir(parents=True)
    target = tmp_path / "mark.json"
    target.write_bytes(CancelMark("0" * 32, "marin-" + "a" * 20, "now", "eve").to_json())
    _plant(folder, kind, target)
    assert read_cancel_mark(location, "s/v1") is None
    assert metadata_files(location, "s/v1") == set()  # no SymlinkError for this one name
    os.symlink(target, folder / "other.json")
    with pytest.raises(SymlinkError):  # any other link in the folder is still refused
        metadata_files(location, "s/v1")


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_planted_cancel_mark_link_or_fifo_stops_no_build(tmp_path: Path, kind: str) -> None:
    """Planted before the run, a link or a FIFO at ``cancel.json`` is ignored: the step builds."""
    prefix, env = setup(tmp_path)
    folder = Path(prefix) / "cancel/single/v1.marin"
    folder.mkdir(parents=True)
    target = tmp_path / "mark.json"
    target.write_bytes(b"{}")
    _plant(folder, kind, target)
    (tmp_path / "gate").touch()
    run = start_run("single", prefix, env, tmp_path / "err")
    run.communicate(timeout=180)
    err = (tmp_path / "err").read_text()
    assert run.returncode == 0, err
    assert "cancel.json: not a regular file, so not a cancel mark" in err, err
    assert read_record(open_prefix(prefix), "cancel/single/v1") is not None


def test_a_mark_made_while_no_lease_was_held_stops_only_a_build_waiting_for_its_job() -> None:
    """Made for no lease (a task deferred on the job), a mark names the job: only a build that
    waits for that job is stopped, never a new build (which waits for none) or another lease's."""
    job = "marin-" + "b" * 20
    mark = CancelMark.parse(CancelMark("", job, "now", "bob").to_json())
    assert mark is not None and mark.lease == "" and mark.job_id == job
    assert mark.stops("f" * 32, job)
    assert not mark.stops("f" * 32, "") and not mark.stops("f" * 32, "marin-" + "c" * 20)
    leased = CancelMark("0" * 32, job)
    assert leased.stops("0" * 32, "") and leased.stops("f" * 32, job)
    assert not leased.stops("f" * 32, "")


def test_cancel_before_the_submit_is_recorded_and_exits_0(tmp_path: Path) -> None:
    """Red team gang2 F6: the driver holds the lease and has submitted nothing yet: `cancel`
    records the mark for it and exits 0 (as --help says), without "error:"; the driver then
    stops the build before any job is submitted."""
    hold = tmp_path / "hold"
    hold.mkdir()
    prefix, env = setup(tmp_path)
    run = start_run("gang", prefix, {**env, "MARIN_FAULT_HOLD": f"before-submit:{hold}"},
                    tmp_path / "a.err")  # fmt: skip
    wait_for(hold / "held")
    done = cli("cancel", "cancel/gang@v1", "--prefix", prefix, env=env)
    assert done.returncode == 0 and "error" not in done.stderr, done
    assert "cancel recorded for cancel/gang@v1: no job is submitted yet" in done.stdout, done
    (hold / "go").touch()
    run.communicate(timeout=120)
    err = (tmp_path / "a.err").read_text()
    assert run.returncode == 1 and "before its job was submitted" in err, err
    assert not (tmp_path / "calls").exists()  # no rank ever ran
    assert read_record(open_prefix(prefix), "cancel/gang/v1") is None


def test_cancel_with_no_driver_and_no_job_records_nothing(tmp_path: Path) -> None:
    """With no live lease there is no build to stop later: cancel refuses, and writes no mark."""
    prefix, env = setup(tmp_path)
    (Path(prefix) / "cancel/gang/v1.marin").mkdir(parents=True)
    done = cli("cancel", "cancel/gang@v1", "--prefix", prefix, env=env)
    assert done.returncode == 1 and "no remote job recorded" in done.stderr, done.stderr
    assert done.stderr.startswith("error: cancel/gang@v1 has no"), done.stderr  # one "error:"
    assert read_cancel_mark(open_prefix(prefix), "cancel/gang/v1") is None


def test_a_gang_resumed_at_another_world_size_says_so(tmp_path: Path) -> None:
    """A resumable gang lost at ranks=2 (driver and job SIGKILLed) and run at ranks=3: it
    resumes (ranks is placement), and ``plan`` (text and --json) and the run's log say the
    partial output was written by 2 ranks."""
    prefix, env = setup(tmp_path)
    first = start_run("resumable", prefix, env, tmp_path / "a.err")
    ranks = starts(tmp_path, 2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    attempt = read_attempt_record(open_prefix(prefix), "cancel/resume/v1")
    assert attempt is not None and attempt.ranks == 2
    three = {**env, "MARIN_TEST_RANKS": "3"}
    job = attempt.job
    assert job is not None
    cli("cancel", "cancel/resume@v1", "--prefix", prefix, env=env)  # the orphaned gang
    wait_gone(ranks)
    said = "written by 2 ranks, now 3"
    plan = cli("plan", f"{PIPELINES}:resumable", "--prefix", prefix, env=three)
    assert plan.returncode == 0 and "resume: partial output from attempt 1" in plan.stdout
    assert said in plan.stdout, plan.stdout
    planned = cli("plan", f"{PIPELINES}:resumable", "--prefix", prefix, "--json", env=three)
    assert said in json.dumps(json.loads(planned.stdout)["steps"][0]), planned.stdout
    (tmp_path / "gate").touch()
    second = start_run("resumable", prefix, three, tmp_path / "b.err")
    second.communicate(timeout=180)
    err = (tmp_path / "b.err").read_text()
    assert second.returncode == 0, err
    assert "resume cancel/resume@v1: partial output from attempt 1" in err and said in err, err
    record = read_record(open_prefix(prefix), "cancel/resume/v1")
    assert record is not None and record.result == {"rank": 0, "world_size": 3}


def test_a_placement_timeout_is_final_and_only_marin_says_it() -> None:
    """The decision: a gang's outcome saying its placement timed out fails the step at once
    (a ``final`` error: the run loop spends no ``retries`` on it); an outcome ``fn`` wrote,
    with the same words, is an ordinary failure (fn's outcome cannot carry the marker)."""
    outcome = unplaced_outcome("ranks=3 ... within placement_timeout=8s ...")
    assert placement_failure(outcome) == "ranks=3 ... within placement_timeout=8s ..."
    by_fn = {"ok": False, "type": "TimeoutError", "message": "within placement_timeout=8s",
             "traceback": "", "errno": None}  # fmt: skip
    assert placement_failure(json.dumps(by_fn).encode()) is None
    assert placement_failure(b"not json") is None
    assert RemoteJobError.final is False  # fn's errors are retried
