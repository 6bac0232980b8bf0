"""Who holds a lease: a holder id (host, pid, thread) and a process id that names this process
and no other, so a lease of a process that is gone (on this machine) is taken over at once."""

from __future__ import annotations

import os
import socket
import threading

from marin.execution.ids import current_pid
from marin.execution.store.lease.settings import CHECK_PID_ENV


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _process_start(pid: int) -> str | None:
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # Field 22 (starttime) counted after the parenthesised command name, which may hold spaces.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def _machine() -> str | None:
    """This kernel boot and PID namespace: PIDs are comparable only within one."""
    boot = _read_text("/proc/sys/kernel/random/boot_id")
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{pidns}" if boot else None


_MACHINE = _machine()


_process_ids: dict[int, str | None] = {}


def _process_id() -> str | None:
    """``<boot>/<pidns>/<pid>/<start time>``: names this process and no other, ever.

    Looked up once per process (keyed by pid, so a forked child gets its own).
    """
    if _MACHINE is None:
        return None
    pid = current_pid()
    if pid not in _process_ids:
        start = _process_start(pid)
        _process_ids[pid] = f"{_MACHINE}/{pid}/{start}" if start else None
    return _process_ids[pid]


def _holder_is_dead(process: str | None) -> bool:
    """True only when certain: same machine and PID namespace, and that process is gone."""
    if not process or _MACHINE is None or not process.startswith(_MACHINE + "/"):
        return False
    if os.environ.get(CHECK_PID_ENV, "1") in ("0", "false", "no"):
        return False
    pid, _, start = process[len(_MACHINE) + 1 :].partition("/")
    if not (pid.isascii() and pid.isdigit()):  # "²".isdigit(), but int("²") fails
        return False
    return _process_start(int(pid)) != start


_HOST = socket.gethostname()


def _holder_id() -> str:
    return f"{_HOST}:{current_pid()}:{threading.get_ident()}"
