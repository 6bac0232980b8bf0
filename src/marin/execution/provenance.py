"""Who lowered or built a step, from where.

Provenance explains a record; it never enters a fingerprint. The git and host facts are looked up
once per process, because lowering 100,000 steps must not spawn 100,000 ``git`` processes.
"""

from __future__ import annotations

import datetime
import functools
import getpass
import os
import socket
import subprocess
import sys
from typing import Any


@functools.cache
def _git_state(cwd: str) -> tuple[str | None, bool | None]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None, None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return commit.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


@functools.cache
def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def collect_provenance() -> dict[str, Any]:
    commit, dirty = _git_state(os.getcwd())
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "user": _user(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "time": now_iso(),
    }
