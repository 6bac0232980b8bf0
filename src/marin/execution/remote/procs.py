"""Who a process is, from the kernel (``/proc``): a pid alone may name anyone's process.

A ``local`` job's pid is signalled only while the process behind it is provably that job: its
kernel start time is the one recorded when it started (a reused pid has another) and its command
line names the job's folder (which holds the job id). Kept apart from ``local_job`` so that the
package never imports the module that ``python -m`` runs (runpy warns when it is imported first).
"""

from __future__ import annotations


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
