"""Who lowered or built a step, from where.

Provenance explains a record; it never enters a fingerprint. The git and host facts are looked up
once per process, because lowering 100,000 steps must not spawn 100,000 ``git`` processes.

An engine adapter (Airflow, Prefect) says which of its units of work is building a step with
:func:`engine_run` around ``build_step``: the record then names that task instance or task run
beside the host and process id, so "who built what" is answered across many workers.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import getpass
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from marin.execution.ids import current_pid

_engine: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "marin_engine", default=None
)
"""The engine's own id of the work running in this context (a contextvar: each Airflow task or
Prefect task thread sees only its own)."""


@contextlib.contextmanager
def engine_run(engine: str, ids: Mapping[str, Any]) -> Iterator[None]:
    """Within this block, records built here name ``engine`` and its ``ids`` (plain data: the
    Airflow task instance's dag_id/run_id/task_id/try_number/map_index, the Prefect task run id).
    """
    token = _engine.set({"name": engine, **{str(k): v for k, v in ids.items()}})
    try:
        yield
    finally:
        _engine.reset(token)


def current_engine() -> dict[str, Any] | None:
    """What :func:`engine_run` set for this context, or None outside an engine's task."""
    value = _engine.get()
    return dict(value) if value is not None else None


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


_second: tuple[int | None, str] = (None, "")
"""The last whole second formatted (Unix seconds, its UTC text): a build reads the clock twice
and a run many times a second, so the date and time are formatted once per second."""


def now_iso() -> str:
    """Now in UTC, to the millisecond: the text of
    ``datetime.now(UTC).isoformat(timespec="milliseconds")``, at a third of its cost (``isoformat``
    with a time zone was a few microseconds per call, twice per build)."""
    global _second
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    known = _second  # one read: another thread may replace it (a tuple, swapped whole)
    if known[0] != seconds:
        known = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
        _second = known
    return f"{known[1]}.{nanos // 1_000_000:03d}+00:00"


_facts: dict[tuple[int, str], dict[str, Any]] = {}
"""(pid, directory) -> the facts that hold for it (see ``_process_facts``)."""


def _process_facts(working_dir: str | None = None) -> dict[str, Any]:
    """Git state (of ``working_dir``, else the working directory), user, host and pid: looked
    up once per process and directory, so that a forked child, or a process that changed
    directory into another checkout, looks again.

    Once, because ``gethostname`` is a system call that also hands the GIL to another thread on
    every build of a run, and the git state is two ``git`` processes (it was already looked up
    once per directory, so it never reflected edits made during a run either). The
    ``getcwd`` that keys it stays where no caller knows the directory: a record must name the
    checkout it was built from.
    """
    key = (current_pid(), os.getcwd() if working_dir is None else working_dir)
    facts = _facts.get(key)
    if facts is None:
        commit, dirty = _git_state(key[1])
        facts = {
            "git_commit": commit,
            "git_dirty": dirty,
            "user": _user(),
            "host": socket.gethostname(),
            "pid": key[0],
        }
        _facts[key] = facts  # a race only computes the same facts twice
    return facts


def collect_provenance(time: str | None = None, working_dir: str | None = None) -> dict[str, Any]:
    """Git state (of ``working_dir``'s checkout, else the working directory's), user, host,
    process id, argv and ``time`` (now, unless the caller has just read the clock); and
    ``engine`` (see :func:`engine_run`) when an engine's task runs here."""
    facts: dict[str, Any] = {
        **_process_facts(working_dir),
        "argv": list(sys.argv),
        "time": now_iso() if time is None else time,
    }
    engine = current_engine()
    if engine is not None:
        facts["engine"] = engine
    return facts
