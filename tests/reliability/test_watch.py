"""Watching and steering a long remote job from the command line (issue 55), on ``local`` jobs:
its output while it runs, ``marin logs``/``show``/``cancel``, statuses after a crash, a version
bumped under a running job, and what an interrupted run reports."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from marin.execution.remote.procs import start_time
from tests.reliability.conftest import REPO, child_env
from tests.reliability.test_remote import wait_for_text
from tests.ux.helpers import strip_ansi

PIPELINE = "tests/reliability/watch_pipelines.py:pipeline"
TRAIN = "watch/train@v1"


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return child_env(MARIN_TEST_GATE=str(tmp_path / "gate"), MARIN_REMOTE_POLL_MAX_S="0.2",
                     MARIN_LOCAL_JOBS=str(tmp_path / "jobs"), COLUMNS="200", **extra)  # fmt: skip


def marin(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "marin.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def start(
    env: dict[str, str], prefix: Path, err: Path, *extra: str, target: str = PIPELINE
) -> subprocess.Popen[str]:
    """``marin run`` of ``target`` in a session of its own (a SIGKILL of it spares the job):
    its stderr into ``err``, its stdout (the steps' labelled lines) beside it (``out``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", target, "--prefix", str(prefix), *extra],
        cwd=REPO, env=env, stdout=out(err).open("w"), stderr=err.open("w"), text=True,
        start_new_session=True,
    )  # fmt: skip


def out(err: Path) -> Path:
    return err.with_suffix(".out")


def step_log(prefix: Path, version: str = "v1") -> Path:
    return prefix / f"watch/train/{version}.marin/log.txt"


def job_pid(tmp_path: Path) -> int:
    (folder,) = (tmp_path / "jobs").iterdir()
    return int(json.loads((folder / "pid.json").read_text())["pid"])


def spawn(env: dict[str, str], *args: str) -> pexpect.spawn:
    return pexpect.spawn(sys.executable, ["-m", "marin.cli", *args], cwd=str(REPO),
                         env={**env, "TERM": "xterm-256color"}, dimensions=(40, 160),
                         encoding="utf-8", timeout=60)  # fmt: skip


def test_a_running_jobs_output_is_shown_followed_and_logged_once(tmp_path: Path) -> None:
    """On a terminal: the job's lines appear labelled while it runs (escaped), the live display
    names the job, its state and last line; ``logs`` and ``show`` read the running job;
    ``logs -f`` follows it to its end; ``log.txt`` holds each line once."""
    env, prefix = env_for(tmp_path), tmp_path / "p"
    child = spawn(env, "run", PIPELINE, "--prefix", str(prefix))
    try:
        child.expect(re.escape(f"{TRAIN} | tick 0"))
        child.expect(re.escape(f"{TRAIN} | colour \\x1b[31mred\\x1b[0m and a bell \\x07"))
        child.expect(r"local job marin-[0-9a-f]{20} running: tick \d+")  # the live display
        assert "tick 0" in step_log(prefix).read_text()  # in log.txt while the job runs
        logs = marin(env, "logs", TRAIN, "--prefix", str(prefix), "-n", "3")
        assert logs.returncode == 0 and re.search(r"^tick \d+$", logs.stdout, re.M), logs
        assert "running" in logs.stderr and "\x1b" not in logs.stdout
        shown = marin(env, "show", TRAIN, "--prefix", str(prefix)).stdout
        assert re.search(r"job +local job marin-[0-9a-f]{20}, running", shown), shown
        assert f"job log      {tmp_path / 'jobs'}/marin-" in shown, shown
        assert f"marin logs {TRAIN} -f" in shown and f"marin cancel {TRAIN}" in shown
        follow = subprocess.Popen(
            [sys.executable, "-m", "marin.cli", "logs", TRAIN, "--prefix", str(prefix), "-f"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert follow.stdout is not None and follow.stdout.readline() == "tick 0\n"
        (tmp_path / "gate").touch()
        child.expect(re.escape(f"{TRAIN} | done ticking"))
        child.expect(pexpect.EOF)
    finally:
        (tmp_path / "gate").touch()
        child.close()
    assert child.exitstatus == 0, child.before
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    assert "done ticking\n" in out, out
    assert re.search(r"ended \((succeeded|lost)\)", err), err
    text = step_log(prefix).read_text()
    assert text.count("tick 0\n") == 1 and text.count("done ticking") == 1, text
    assert "colour \x1b[31mred" in text  # the log keeps what the job printed, as it was


def running(tmp_path: Path) -> tuple[dict[str, str], Path, Path, subprocess.Popen[str]]:
    """A driver whose job has printed its first line: its env, prefix, stderr file, process."""
    env, prefix = env_for(tmp_path), tmp_path / "p"
    err = tmp_path / "run.err"
    driver = start(env, prefix, err)
    wait_for_text(out(err), f"{TRAIN} | tick 0")
    return env, prefix, err, driver


def test_cancel_stops_the_job_and_its_waiting_driver_fails_the_step(tmp_path: Path) -> None:
    env, prefix, err, driver = running(tmp_path)
    try:
        pid = job_pid(tmp_path)
        done = marin(env, "cancel", TRAIN, "--prefix", str(prefix))
        assert done.returncode == 0, done.stderr
        assert re.match(rf"cancelled {TRAIN}: stopped local job marin-\w+, running", done.stdout)
        assert "sees the job stopped, fails the step" in done.stdout, done.stdout
        assert start_time(pid) is None  # the job's process is gone
        assert driver.wait(timeout=60) == 1
    finally:
        (tmp_path / "gate").touch()
        driver.kill()
    assert re.search(r"local job marin-\w+ was stopped \(cancelled\)", err.read_text())
    listed = marin(env, "ls", "--prefix", str(prefix)).stdout
    assert f"not built: {TRAIN} (FAILED: RemoteJobError" in listed, listed
    again = marin(env, "run", PIPELINE, "--prefix", str(prefix))
    assert again.returncode == 0, again.stderr  # a new job builds it


def test_a_killed_driver_is_no_longer_running_and_its_jobs_are_named_and_cancelled(
    tmp_path: Path,
) -> None:
    """``kill -9`` of the driver: ``ls``/``show`` say UNFINISHED (holder gone), not RUNNING;
    after a version bump ``plan`` and ``unlock`` name the old version's job; ``cancel`` of
    the bare name stops it and releases the step."""
    env, prefix, _, driver = running(tmp_path)
    try:
        pid = job_pid(tmp_path)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        listed = marin(env, "ls", "--prefix", str(prefix)).stdout
        assert f"{TRAIN} (UNFINISHED: holder pid {driver.pid} gone" in listed, listed
        assert "RUNNING" not in listed
        shown = marin(env, "show", TRAIN, "--prefix", str(prefix))
        assert "not built (UNFINISHED)" in shown.stdout and "RUNNING" not in shown.stdout
        assert re.search(r"job +local job marin-\w+, running", shown.stdout), shown.stdout
        tail = marin(env, "logs", TRAIN, "--prefix", str(prefix), "-n", "2").stdout
        assert len(tail.splitlines()) == 2 and tail.startswith("tick"), tail
        bumped = {**env, "MARIN_TEST_VERSION": "v2"}
        plan = marin(bumped, "plan", PIPELINE, "--prefix", str(prefix)).stdout
        assert re.search(r"local job marin-\w+ of version v1 still\s+runs", plan), plan
        assert re.search(rf"`marin cancel {TRAIN}`\s+stops it", plan), plan
        unlocked = marin(env, "unlock", TRAIN, "--prefix", str(prefix))
        assert unlocked.returncode == 0, unlocked.stderr
        assert f"still runs: `marin cancel {TRAIN}` stops it" in unlocked.stdout
        assert start_time(pid) is not None  # unlock names the job, never stops it
        done = marin(env, "cancel", "watch/train", "--prefix", str(prefix))
        assert done.returncode == 0, done.stderr
        assert "removed its job record" in done.stdout, done.stdout
        assert start_time(pid) is None
    finally:
        (tmp_path / "gate").touch()
    listed = marin(env, "ls", "--prefix", str(prefix)).stdout
    assert f"{TRAIN} (FAILED: cancelled by `marin cancel`: local job marin-" in listed, listed
    nothing = marin(env, "cancel", TRAIN, "--prefix", str(prefix))
    assert nothing.returncode == 1 and "has no remote job recorded" in nothing.stderr
    # The cancel's mark names the job (no driver held the lease); a new run waits for no job
    # of it, so it builds the step with a new job, and the stale mark goes.
    stopped = re.search(r"stopped local job (marin-\w+)", done.stdout)
    mark = prefix / "watch/train/v1.marin/cancel.json"
    assert stopped is not None and stopped.group(1) in mark.read_text()
    again = marin(env, "run", PIPELINE, "--prefix", str(prefix))
    assert again.returncode == 0, again.stderr
    assert re.search(rf"submit {TRAIN}: local job marin-\w+", again.stderr), again.stderr
    assert stopped.group(1) not in again.stderr and not mark.exists()


def test_a_version_bumped_under_a_live_drivers_job_is_named_and_cancelled(
    tmp_path: Path,
) -> None:
    """Issue 55.5 with the old driver alive: driver A runs ``watch/train@v1`` (``version=None``,
    ``--version v1``); the pipeline is bumped to v2. ``plan`` names A's v1 job and how to stop
    it; ``unlock`` of v1 refuses A's live lease and names the job; ``cancel`` of v1 stops it and
    A fails the step ``stopped (cancelled)``; nothing of v2 is touched."""
    env, prefix, err = env_for(tmp_path), tmp_path / "p", tmp_path / "a.err"
    target = PIPELINE.replace(":pipeline", ":deferred")
    driver = start(env, prefix, err, "--version", "v1", target=target)
    try:
        wait_for_text(out(err), f"{TRAIN} | tick 0")
        pid, (job,) = job_pid(tmp_path), [p.name for p in (tmp_path / "jobs").iterdir()]
        plan = marin(env, "plan", target, "--version", "v2", "--prefix", str(prefix)).stdout
        assert re.search(rf"local job {job} of version v1 still\s+runs", plan), plan
        assert re.search(rf"`marin cancel {TRAIN}`\s+stops it", plan), plan
        assert re.search(r"build\s+run\s+watch/train@v2", plan), plan
        unlocked = marin(env, "unlock", TRAIN, "--prefix", str(prefix))
        assert unlocked.returncode == 1 and "refusing to unlock" in unlocked.stderr
        assert re.search(rf"{job}, running \w+ still runs: `marin cancel {TRAIN}` "
                         "stops it", unlocked.stderr), unlocked.stderr  # fmt: skip
        assert start_time(pid) is not None and driver.poll() is None  # nothing stranded
        done = marin(env, "cancel", TRAIN, "--prefix", str(prefix))
        assert done.returncode == 0, done.stderr
        assert f"stopped local job {job}" in done.stdout, done.stdout
        assert "sees the job stopped, fails the step" in done.stdout, done.stdout
        assert start_time(pid) is None
        assert driver.wait(timeout=60) == 1
    finally:
        (tmp_path / "gate").touch()
        driver.kill()
    text = err.read_text()
    assert f"local job {job} was stopped (cancelled) (step {TRAIN})" in text, text
    assert f"submit {TRAIN}: local job {job}" in text  # its resolved version
    assert "@?" not in text and "v2" not in text
    assert sorted(p.name for p in (prefix / "watch/train").iterdir()) == ["v1.marin"]
    listed = marin(env, "ls", "--prefix", str(prefix)).stdout
    assert f"not built: {TRAIN} (FAILED: RemoteJobError" in listed and "@v2" not in listed


def test_ctrl_c_keeps_served_steps_and_the_json_report_says_interrupted(tmp_path: Path) -> None:
    env, prefix = env_for(tmp_path), tmp_path / "p"
    (tmp_path / "gate").touch()
    assert marin(env, "run", PIPELINE, "--prefix", str(prefix)).returncode == 0
    (tmp_path / "gate").unlink()
    bumped = {**env, "MARIN_TEST_VERSION": "v2"}
    child = spawn(bumped, "run", PIPELINE, "--prefix", str(prefix))
    try:
        child.expect(re.escape("watch/train@v2 | tick 0"))
        child.sendintr()
        child.expect(pexpect.EOF)
        screen = strip_ansi(child.before)
        child.close()
        assert child.exitstatus == 130, screen
        assert re.search(r"watch/prep@v1\s+skipped\s+-\s+built earlier", screen), screen
        assert re.search(r"watch/train@v2\s+interrupted\s+-\s+interrupted while its job ran",
                         screen), screen  # fmt: skip
        assert f"`marin cancel watch/train@v2 --prefix {prefix}` stops it" in screen
        err = tmp_path / "json.err"
        driver = start(bumped, prefix, err, "--json")
        wait_for_text(err, "reattach watch/train@v2")  # to the job the first run left running
        wait_for_text(step_log(prefix, "v2"), "tick 0")
        driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=60) == 130
        report = json.loads(out(err).read_text())
        assert report["interrupted"] is True and report["ok"] is False
        steps = {s["step"]: (s["action"], s["reason"]) for s in report["steps"]}
        assert steps["watch/prep@v1"][0] == "skipped"
        assert steps["watch/train@v2"][0] == "blocked" and "its job ran" in steps["watch/train@v2"][1]
        assert "interrupted" in steps["watch/report@v2"][1]
    finally:
        (tmp_path / "gate").touch()


def test_a_job_printing_a_huge_line_is_followed_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 55.1: a job's log is streamed bounded in memory. A ``local`` job's log holding one
    64 MiB line (no newline for 64 MiB) is read through the backend's own cursor: the line is
    cut at ``LINE_MOST``, the next line still arrives, and the follower never holds more than a
    few reads' worth (``READ_MOST``) at once."""
    import tracemalloc

    from marin.execution.remote.follow import LINE_MOST, READ_MOST, JobLog, LiveJob
    from marin.execution.remote.local import LocalBackend
    from marin.execution.remote.protocol import JobHandle
    from marin.execution.store.step_folder import JobRecord

    monkeypatch.setenv("MARIN_LOCAL_JOBS", str(tmp_path / "jobs"))
    job_id = "marin-" + "ab" * 10
    folder = tmp_path / "jobs" / job_id
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "jobs").chmod(0o700)
    with (folder / "log.txt").open("wb") as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20))
        f.write(b"\nafter the long line\n")
    got: list[str] = []
    record = JobRecord("local", job_id, "b", "2026-12-06T00:00:00+00:00", {})
    cursor = LocalBackend().follow(JobHandle("local", job_id, {}))
    follower = JobLog(cursor, got.extend, LiveJob(record, str(tmp_path)))
    tracemalloc.start()
    try:
        follower.finish()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == ["x" * LINE_MOST + " [line cut]", "after the long line"]
    assert peak < 8 * READ_MOST, f"{peak / (1 << 20):.1f} MiB held for a 64 MiB line"


_LOG_PARTS = st.sampled_from([b"", b"a", b"\r", b"xyz" * 7000, "é".encode() * 9000])


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    parts=st.lists(_LOG_PARTS, max_size=8),
    end=st.sampled_from([b"", b"\n", b"\n\n"]),
    cuts=st.lists(st.integers(1, 70_000), max_size=20),
    count=st.integers(0, 5),
)
@example(parts=[b"a", b"xyz" * 7000, b"a"], end=b"", cuts=[5, 100], count=3)
def test_a_streamed_logs_last_lines_are_a_files(
    parts: list[bytes], end: bytes, cuts: list[int], count: int
) -> None:
    """``LastLines`` (Ray's log as its API streams it, in chunks of any size) gives the lines
    ``tail_lines`` gives of the same log as a file (``local``): a huge line cut, not hiding
    the lines before it."""
    from marin.execution.remote.log_tail import LastLines, tail_lines

    log = b"\n".join(parts) + end
    chunks, at = [], 0
    for size in [*cuts, len(log)]:
        chunks.append(log[at : at + size])
        at += size
    streamed = LastLines(count)
    streamed.feed(chunks)
    assert streamed.result() == tail_lines(io.BytesIO(log), count)
