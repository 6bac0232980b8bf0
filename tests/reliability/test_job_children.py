"""What a ``local`` job prints is untrusted (issue 53, red-team round 1: finding 11): echoed
job output shows its escapes off a terminal too, and a full disk is decided by the errno, never
by printed words. Real ``marin`` drivers and real jobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.conftest import REPO, child_env
from tests.reliability.job_trust_pipelines import ESCAPES

PIPELINES = REPO / "tests/reliability/job_trust_pipelines.py"


def marin(
    target: str, prefix: Path, env: dict[str, str], *extra: str, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """``marin run`` of a pipeline of ``job_trust_pipelines.py`` (output piped: no terminal).
    ``-P``: the driver itself never imports from ``cwd`` (as the ``marin`` console script)."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "marin.cli", "run", f"{PIPELINES}:{target}",
         "--prefix", str(prefix), *extra],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def env_for(tmp_path: Path) -> dict[str, str]:
    return child_env(MARIN_LOCAL_JOBS=str(tmp_path / "jobs"), MARIN_REMOTE_POLL_MAX_S="0.2")


@pytest.mark.parametrize("display", ["piped", "--no-progress", "--json"])
def test_echoed_job_output_shows_escapes_off_a_terminal(tmp_path: Path, display: str) -> None:
    """Finding 11: a job prints a window title, a screen clear and a bidi override; off a
    terminal (a CI log) the echoed line shows them as text, on stdout and stderr alike, and
    the step's own log keeps what it printed."""
    extra = [] if display == "piped" else [display]
    done = marin("noisy_job", tmp_path / "p", env_for(tmp_path), *extra)
    assert done.returncode == 1, done.stderr[-3000:]
    both = done.stdout + done.stderr
    assert "\x1b" not in both and "\x07" not in both and "\u202e" not in both, repr(both[-2000:])
    echoed = [line for line in both.splitlines() if line.startswith("trust/noisy@v1 | ")]
    assert any("\\x1b]0;pwned-title\\x07\\x1b[2J" in line for line in echoed), echoed
    assert ESCAPES in (tmp_path / "p/trust/noisy/v1.marin/log.txt").read_text()


def test_printed_disk_full_words_never_decide_enospc(tmp_path: Path) -> None:
    """Finding 11: a job prints ``No space left on device`` and then fails with a plain bug:
    the step's error is that bug, never "the disk was full" (a real ENOSPC still is:
    ``test_remote_trust.py``'s full-disk tests)."""
    done = marin("noisy_job", tmp_path / "p", env_for(tmp_path), "--no-progress")
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "failed: ValueError: a plain bug, not a full disk" in last, last
    assert "the disk was full" not in done.stderr and "free space" not in done.stderr
