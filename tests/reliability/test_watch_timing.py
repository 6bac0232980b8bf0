"""A reattached build's duration is its job's, and ``marin logs`` of a job whose output holds
a huge line (issue 55 item 11; red team gang finding 4), through the CLI on ``local`` jobs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.conftest import REPO, child_env
from tests.reliability.test_remote import wait_for_text
from tests.reliability.timing_pipelines import HUGE, MIN_JOB_S

PIPELINES = "tests/reliability/timing_pipelines.py"


def env_for(tmp_path: Path) -> dict[str, str]:
    return child_env(MARIN_TEST_GATE=str(tmp_path / "gate"), MARIN_REMOTE_POLL_MAX_S="0.2",
                     MARIN_TEST_STARTED=str(tmp_path / "started"), COLUMNS="200",
                     MARIN_LOCAL_JOBS=str(tmp_path / "jobs"))  # fmt: skip


def marin(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "marin.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def start(env: dict[str, str], tmp_path: Path, target: str, name: str, *extra: str,
          ) -> subprocess.Popen[str]:  # fmt: skip
    """``marin run`` in a session of its own (a SIGKILL of it spares its job)."""
    return subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", f"{PIPELINES}:{target}", "--prefix",
         str(tmp_path / "p"), "--no-progress", *extra],
        cwd=REPO, env=env, stdout=(tmp_path / f"{name}.out").open("w"),
        stderr=(tmp_path / f"{name}.err").open("w"), text=True, start_new_session=True,
    )  # fmt: skip


def wait_until(check: Callable[[], object], what: str, timeout: float = 90) -> object:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)
    return found


@pytest.mark.parametrize(
    ("as_json", "target"),
    [(False, "timed"), (True, "timed"), (True, "timed_resumable")],
)
def test_a_reattached_build_reports_its_jobs_own_duration(
    tmp_path: Path, as_json: bool, target: str
) -> None:
    """The driver is SIGKILLed while its job runs; a second ``marin run`` reattaches and
    waits only for the job's end: its row (or ``--json``), ``show``, ``show --json`` and
    ``ls --json`` give the job's duration (>= ``MIN_JOB_S``), with this run's share beside.
    A resumable step's second attempt that reattaches resumed nothing: the one job ran from
    start to end, and it is never said to be resumed (red team gang 2, F5)."""
    env, prefix = env_for(tmp_path), str(tmp_path / "p")
    first = start(env, tmp_path, target, "first")
    try:
        wait_until((tmp_path / "started").exists, "the job started")  # the job wrote it
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        second = start(env, tmp_path, target, "second", *(["--json"] if as_json else []))
        wait_for_text(tmp_path / "second.err", "reattach timed/train@v1: local job")
    finally:
        (tmp_path / "gate").touch()
    assert second.wait(timeout=120) == 0, (tmp_path / "second.err").read_text()
    out = (tmp_path / "second.out").read_text()
    if as_json:
        (step,) = json.loads(out)["steps"]
        assert step["action"] == "built" and step["duration_s"] >= MIN_JOB_S, step
        assert step["duration_here_s"] < step["duration_s"], step
        assert step["duration_note"].startswith("reattached: the job's time; "), step
        assert "resumed" not in step["duration_note"] and not step.get("resumed"), step
    else:
        row = re.search(r"timed/train@v1 +built +(\S+)s +reattached: the job's time; (\S+)s "
                        r"waited here$", out, re.M)  # fmt: skip
        assert row is not None, out
        # This run's share is less than the job's time (a faster reattach leaves it near it).
        assert float(row.group(1)) >= MIN_JOB_S and float(row.group(2)) < float(row.group(1)), out
    shown = marin(env, "show", "timed/train@v1", "--prefix", prefix).stdout
    found = re.search(r"duration +(\S+)s \(reattached: the job's time; \S+s waited here\)", shown)
    assert found is not None and float(found.group(1)) >= MIN_JOB_S, shown
    raw = json.loads(marin(env, "show", "timed/train@v1", "--prefix", prefix, "--json").stdout)
    assert raw["timing"]["duration_s"] >= MIN_JOB_S > raw["duration_s"], raw["timing"]
    assert raw["timing"]["duration_here_s"] == raw["duration_s"]
    assert raw["provenance"]["job"]["ended_at"] <= raw["finished_at"]
    assert raw["provenance"].get("attempt", {}).get("resumed") in (None, False), raw["provenance"]
    (listed,) = json.loads(marin(env, "ls", "--prefix", prefix, "--json").stdout)["artifacts"]
    assert listed["duration_s"] == raw["timing"]["duration_s"], listed
    assert listed["duration_note"] == raw["timing"]["duration_note"], listed


def _logs(env: dict[str, str], prefix: str, step: str, *extra: str, waiting: bool = False,
          ) -> list[str]:  # fmt: skip
    """``marin logs STEP``'s lines; ``waiting``: none before the step has a log."""
    done = marin(env, "logs", step, "--prefix", prefix, *extra)
    assert done.returncode == 0 or (waiting and "no log" in done.stderr), done.stderr
    return done.stdout.splitlines()


CUT = f"{'A' * 16 * 1024} ... ({HUGE} bytes)"
"""A 3 MB line as ``marin logs`` shows it: cut, with its length."""


def test_logs_of_a_running_job_with_a_huge_line_show_every_line(tmp_path: Path) -> None:
    """Red team gang finding 4: a running job's log holding a 3 MB line (then a partial line)
    shows its earlier lines and the cut one (``marin logs``, ``-n 3``, ``--rank 0``); once
    the gang ended, ``--rank 0`` shows rank 0's partial last line, on a line of its own."""
    env, prefix = env_for(tmp_path), str(tmp_path / "p")
    driver = start(env, tmp_path, "logs", "run", "--max-concurrent", "2")
    try:
        plain = wait_until(lambda: (lines := _logs(env, prefix, "logs/plain@v1", waiting=True))
                           and lines[-1] == "rank 0: epoch 2 (no newline yet)" and lines,
                           "the plain job's partial line")  # fmt: skip
        assert plain == ["rank 0: epoch 1 loss=0.5", CUT, "rank 0: epoch 2 (no newline yet)"]
        last = _logs(env, prefix, "logs/plain@v1", "-n", "3")
        assert last == plain
        assert _logs(env, prefix, "logs/plain@v1", "-n", "1") == [plain[-1]]
        cut = f"{CUT[: -len(f' ... ({HUGE} bytes)')][: 16 * 1024 - 9]}"  # after "[rank K] "
        gang = wait_until(lambda: (lines := _logs(env, prefix, "logs/gang@v1", waiting=True))
                          and sum(CUT[:100] in line for line in lines) == 2 and lines,
                          "both ranks' huge lines")  # fmt: skip
        for rank in (0, 1):
            assert f"[rank {rank}] rank {rank}: epoch 1 loss=0.5" in gang, gang
            assert f"[rank {rank}] {cut} ... ({HUGE + 9} bytes)" in gang, [g[-30:] for g in gang]
        ranked = _logs(env, prefix, "logs/gang@v1", "--rank", "0")
        assert ranked == ["rank 0: epoch 1 loss=0.5", f"{cut} ... ({HUGE + 9} bytes)"], ranked
    finally:
        (tmp_path / "gate").touch()
    assert driver.wait(timeout=120) == 0, (tmp_path / "run.err").read_text()
    for rank in (0, 1):
        ranked = _logs(env, prefix, "logs/gang@v1", "--rank", str(rank), "-n", "1")
        assert ranked == [f"rank {rank}: epoch 2 (no newline yet)"], ranked
    ended = _logs(env, prefix, "logs/plain@v1", "-n", "3")
    assert ended[-1] == "rank 0: epoch 2 (no newline yet)", ended
