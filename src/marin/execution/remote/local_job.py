"""Start a ``local`` remote job, detached: ``python -m marin.execution.remote.local_job
DIR [RANKS GPUS]`` (with ``RANKS``, the job is a gang's supervisor, ``gang.py``).

The job is a forked child in a new session (its own process group, no controlling terminal)
that sends its output to ``DIR/log.txt`` and becomes ``isolated_child`` on ``DIR/call.pkl``,
which writes ``DIR/result.json`` (atomically) when ``fn`` ends. Every command line names
``DIR``, which holds the job id: a pid is signalled only while its command line does
(``procs.py``). This process writes ``DIR/pid.json`` (the job's pid and its kernel start time,
so a reused pid is never taken for the job) and exits at once: the job lives on whatever
happens to the driver that started it.

A gang's supervisor is forked by this process (init reaps it) and watches its ranks itself.
Any other job is forked by a *watcher*, in a session of its own (its pid in ``pid.json`` as
``watcher``), which reaps the job and, when a signal kills it (an out-of-memory kill), writes
``DIR/lost.json`` naming the signal, once it killed what is left of the job's process group
(``procs.end_group``; a job that wrote its result and has not exited ``EXIT_GRACE_S`` later is
killed). The job counts as running until its watcher has ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

from marin.execution.atomic_file import write_file_atomically
from marin.execution.remote.gang_rules import EXIT_GRACE_S
from marin.execution.remote.job_files import CALL, LOG, LOST, PID, RESULT
from marin.execution.remote.procs import GROUP_WAIT_S, end_group, signal_name, start_time

CHILD_MODULE = "marin.execution.pipeline.isolated_child"


GANG_MODULE = "marin.execution.remote.gang"


def main(argv: list[str]) -> int:
    folder, gang = argv[0], argv[1:]  # a gang: its size and each rank's GPUs
    info: dict[str, object]
    if gang:
        pid = _start(folder, gang)
        info = {"pid": pid, "start_time": start_time(pid)}
    else:
        pid, watcher = _watched(folder)
        info = {"pid": pid, "start_time": start_time(pid)}
        info["watcher"] = {"pid": watcher, "start_time": start_time(watcher)}
    write_file_atomically(os.path.join(folder, PID), json.dumps(info).encode())
    return 0


def _start(folder: str, gang: list[str]) -> int:
    """Fork the job into a session of its own (its own process group, no controlling terminal),
    its output into ``DIR/log.txt``; its pid."""
    pid = os.fork()
    if pid == 0:  # the job
        os.setsid()
        _to_log(folder)
        # -P: the working folder (the driver's: anyone's /tmp) never comes first on sys.path
        if gang:
            os.execv(sys.executable, [sys.executable, "-P", "-m", GANG_MODULE, folder, *gang])
        call, result = os.path.join(folder, CALL), os.path.join(folder, RESULT)
        os.execv(sys.executable, [sys.executable, "-P", "-m", CHILD_MODULE, call, result])
    return pid


def _to_log(folder: str) -> None:
    """Standard output and error into ``DIR/log.txt``, nothing on standard input."""
    log = os.path.join(folder, LOG)
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)


def _watched(folder: str) -> tuple[int, int]:
    """Start the job under its watcher, off the driver's session: (the job's pid, the
    watcher's). The watcher outlives the job by the moment it takes to say how it ended."""
    read, write = os.pipe()
    watcher = os.fork()
    if watcher == 0:
        try:
            os.close(read)
            os.setsid()
            _to_log(folder)
            pid = _start(folder, [])
            os.write(write, str(pid).encode())
            os.close(write)
            status = _reap(folder, pid)
            end_group(pid, folder, GROUP_WAIT_S)  # what the job started dies with it
            done = os.path.exists(os.path.join(folder, RESULT))
            if os.WIFSIGNALED(status) and not done:  # killed before fn ended: say by what
                killed = {"lost": True, "signal": signal_name(os.WTERMSIG(status))}
                write_file_atomically(os.path.join(folder, LOST), json.dumps(killed).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        pid = int(pipe.read(32) or b"0")
    return pid, watcher


def _reap(folder: str, pid: int) -> int:
    """Wait for the job to exit; its wait status. A job that wrote its result and has not
    exited ``EXIT_GRACE_S`` later (a thread that never ends) is killed: it counts as running
    until its watcher ends."""
    wrote: float | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if wrote is None and os.path.exists(os.path.join(folder, RESULT)):
            wrote = time.monotonic()
        if wrote is not None and time.monotonic() - wrote > EXIT_GRACE_S:
            with contextlib.suppress(ProcessLookupError):  # unreaped: the group is the job's
                os.killpg(pid, signal.SIGKILL)
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
