"""Who a process is, from the kernel (``/proc``): a pid alone may name anyone's process.

A ``local`` job's pid is signalled only while the process behind it is provably that job: its
kernel start time is the one recorded when it started (a reused pid has another) and its command
line names the job's folder (which holds the job id). Kept apart from ``local_job`` so that the
package never imports the module that ``python -m`` runs (runpy warns when it is imported first).
"""

from __future__ import annotations

import os
import signal
import time

JOB_ENV = "MARIN_LOCAL_JOB"
"""Set to the job's folder in a ``local`` job's environment: its processes inherit it, and a
member of the job's process group is killed only while its environment says so (``end_group``)."""
GROUP_WAIT_S = 5.0
"""How long a job's watcher or supervisor waits for the job's process group to empty."""


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (``/proc/PID/stat`` field 22), or None if it is gone
    or a zombie (it ran, and ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def command_line(pid: int) -> list[str]:
    """``pid``'s arguments (``/proc/PID/cmdline``), or none if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(1 << 16)
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def runs_in(pid: int, started: object, folder: str) -> bool:
    """Whether ``pid`` is the process started at ``started`` whose command line names a file
    of ``folder`` (or ``folder`` itself): a reused pid, or a pid some file names, is not."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or not started:
        return False
    if start_time(pid) != started:
        return False
    inside = folder.rstrip("/") + "/"
    return any(arg == folder or arg.startswith(inside) for arg in command_line(pid))


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9: the name of the signal that ended a process."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _group_and_state(pid: int) -> tuple[int, str] | None:
    """``pid``'s process group id and state (``/proc/PID/stat``), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        fields = stat[stat.rfind(")") + 2 :].split()
        return int(fields[2]), fields[0]
    except (OSError, ValueError, IndexError):
        return None


def _of_job(pid: int, pgid: int, folder: str) -> bool:
    """``pid`` is a live member of group ``pgid`` whose environment names the job's folder
    (not this process): a reused group id, or a process of someone else's, is not."""
    found = _group_and_state(pid)
    if found is None or found[0] != pgid or found[1] in ("Z", "X") or pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read(1 << 20).split(b"\0")
    except OSError:
        return False
    return f"{JOB_ENV}={folder}".encode() in environ


def group_members(pgid: int, folder: str) -> list[int]:
    """The live processes of the job's process group ``pgid`` (``_of_job``), this one aside."""
    if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1:
        return []
    pids = (int(name) for name in os.listdir("/proc") if name.isdigit())
    return [pid for pid in pids if _of_job(pid, pgid, folder)]


def end_group(pgid: int, folder: str, wait_s: float) -> bool:
    """SIGKILL every member of the job's process group ``pgid`` (a rank's data loader, a
    helper: whatever the job started without a session of its own) until none is left, for at
    most ``wait_s``; whether the group is empty. Each kill goes through a pidfd opened before
    the last look at the process, so a pid reused in between is never signalled."""
    deadline = time.monotonic() + wait_s
    while True:
        members = group_members(pgid, folder)
        if not members:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in members:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            try:
                if _of_job(pid, pgid, folder):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)
        time.sleep(0.01)  # a killed process is gone in milliseconds
