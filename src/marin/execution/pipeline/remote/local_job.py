"""Start a ``local`` remote job, detached: ``python -m marin.execution.pipeline.remote.local_job
DIR``.

Forks once: the child starts a new session (its own process group, no controlling terminal),
sends its output to ``DIR/log.txt`` and becomes ``isolated_child`` on ``DIR/call.pkl``, which
writes ``DIR/result.pkl`` (atomically) when ``fn`` ends. The parent writes ``DIR/pid.json``
(the child's pid and its kernel start time, so a reused pid is never taken for the job) and
exits at once: the job is nobody's child then (init reaps it), and lives on whatever happens
to the driver that started it.
"""

from __future__ import annotations

import json
import os
import sys

from marin.execution.atomic_file import write_file_atomically

CHILD_MODULE = "marin.execution.pipeline.isolated_child"


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


def main(argv: list[str]) -> int:
    (folder,) = argv
    call, result = os.path.join(folder, "call.pkl"), os.path.join(folder, "result.pkl")
    pid = os.fork()
    if pid == 0:  # the job
        os.setsid()
        log_fd = os.open(os.path.join(folder, "log.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.execv(sys.executable, [sys.executable, "-m", CHILD_MODULE, call, result])
    started = start_time(pid)
    info = {"pid": pid, "start_time": started}
    write_file_atomically(os.path.join(folder, "pid.json"), json.dumps(info).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
