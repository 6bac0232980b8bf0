"""A ``local`` job's whole process group ends before the job is called lost or failed: a
helper a rank started (a data loader: same process group, no session of its own) never runs
beside the job that replaces it, nor after the run ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marin.execution.remote.procs import start_time
from tests.reliability.conftest import REPO
from tests.reliability.test_remote import setup

PIPELINES = "tests/reliability/group_pipelines.py"


def _lines(path: Path, count: int, proc: subprocess.Popen[str]) -> list[str]:
    """``path``'s lines once it has ``count`` (the run must not end first)."""
    deadline = time.monotonic() + 120
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return lines
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{len(lines)} of {count} lines in {path}"
        time.sleep(0.02)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _helpers(folder: Path) -> list[int]:
    return [int(p.name.split("-")[1]) for p in folder.glob("helper-*")]


@pytest.mark.parametrize(
    "target,ranks,how",
    [("plain", 1, "killed"), ("gang", 2, "killed"), ("plain", 1, "raised"),
     ("gang", 2, "raised"), ("gang", 2, "supervisor")],
)  # fmt: skip
def test_a_lost_or_failed_job_ends_what_its_ranks_started(
    tmp_path: Path, target: str, ranks: int, how: str
) -> None:
    """The last rank is SIGKILLed (an out-of-memory kill: the job is lost and submitted
    again), or a gang's supervisor is, or the last rank raises (the step fails): either way every helper of the first job is gone
    before the next job starts and when the run ends."""
    folder = tmp_path / "leak"
    folder.mkdir()
    leak = "raise" if how == "raised" else "kill"
    prefix, env = setup(tmp_path, MARIN_TEST_LEAK_DIR=str(folder), MARIN_TEST_LEAK=leak)
    proc = subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", f"{PIPELINES}:{target}", "--prefix", prefix,
         "--no-progress"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        ready = _lines(folder / "ready", ranks, proc)
        helpers = _helpers(folder)
        assert len(helpers) == ranks
        if how == "supervisor":  # the ranks die with it; what they started is left alone
            os.kill(_parent(int(ready[0].split()[1])), signal.SIGKILL)
        if how == "killed":
            last = next(int(line.split()[1]) for line in ready if line.startswith(f"{ranks - 1} "))
            os.kill(last, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
        assert [start_time(pid) for pid in helpers] == [None] * ranks, out  # none outlived it
        if how != "raised":
            assert proc.returncode == 0, out
            assert (folder / "seen").read_text().splitlines() == ["none"] * ranks, out
        else:
            assert proc.returncode == 1, out
            assert not (folder / "seen").exists(), out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _helpers(folder):  # a helper that outlived its job (the bug): this test's
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_looking_at_a_dead_gang_never_kills_what_it_left_and_cancel_stops_it(
    tmp_path: Path,
) -> None:
    """The driver, then the gang's supervisor, are SIGKILLed: the ranks die, their helpers
    write on. ``marin show`` and ``marin plan`` only look (red team gang 2, F2): the job counts
    as running while its group does, and nothing is signalled; ``marin cancel`` stops it (exit
    0), and every helper is gone."""
    folder = tmp_path / "leak"
    folder.mkdir()
    prefix, env = setup(tmp_path, MARIN_TEST_LEAK_DIR=str(folder), MARIN_TEST_LEAK="kill")
    proc = subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", f"{PIPELINES}:gang", "--prefix", prefix,
         "--no-progress"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip

    def marin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "marin.cli", *args, "--prefix", prefix],
                              cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    try:
        ready = _lines(folder / "ready", 2, proc)
        helpers = _helpers(folder)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        supervisor = _parent(int(ready[0].split()[1]))
        os.kill(supervisor, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while any(start_time(int(line.split()[1])) for line in ready):
            assert time.monotonic() < deadline, "the ranks outlived their supervisor"
            time.sleep(0.02)
        shown = marin("show", "leak/gang@v1")
        assert "running" in shown.stdout and "lost" not in shown.stdout, shown.stdout
        planned = marin("plan", f"{PIPELINES}:gang")
        assert planned.returncode == 0, planned.stderr
        alive = [pid for pid in helpers if start_time(pid) is not None]
        assert alive == helpers, "a command that only looks killed a process"
        cancelled = marin("cancel", "leak/gang@v1")
        assert cancelled.returncode == 0, cancelled.stderr
        assert [start_time(pid) for pid in helpers] == [None, None], cancelled.stderr
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _helpers(folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
