"""Start a ``local`` remote job, detached: ``python -m marin.execution.remote.local_job
DIR [RANKS GPUS]`` (with ``RANKS``, the job is a gang's supervisor, ``gang.py``).

Forks once: the child starts a new session (its own process group, no controlling terminal),
sends its output to ``DIR/log.txt`` and becomes ``isolated_child`` on ``DIR/call.pkl``, which
writes ``DIR/result.json`` (atomically) when ``fn`` ends. Both command lines name ``DIR``, which
holds the job id: a pid is signalled only while its command line does (``procs.py``). The
parent writes ``DIR/pid.json`` (the child's pid and its kernel start time, so a reused pid is
never taken for the job) and exits at once: the job is nobody's child then (init reaps it), and
lives on whatever happens to the driver that started it.
"""

from __future__ import annotations

import json
import os
import sys

from marin.execution.atomic_file import write_file_atomically
from marin.execution.remote.procs import start_time

CHILD_MODULE = "marin.execution.pipeline.isolated_child"
CALL, RESULT, LOG, PID = "call.pkl", "result.json", "log.txt", "pid.json"


GANG_MODULE = "marin.execution.remote.gang"


def main(argv: list[str]) -> int:
    folder, gang = argv[0], argv[1:]  # a gang: its size and each rank's GPUs
    call, result = os.path.join(folder, CALL), os.path.join(folder, RESULT)
    pid = os.fork()
    if pid == 0:  # the job
        os.setsid()
        log = os.path.join(folder, LOG)
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        # -P: the working folder (the driver's: anyone's /tmp) never comes first on sys.path
        if gang:
            os.execv(sys.executable, [sys.executable, "-P", "-m", GANG_MODULE, folder, *gang])
        os.execv(sys.executable, [sys.executable, "-P", "-m", CHILD_MODULE, call, result])
    info = {"pid": pid, "start_time": start_time(pid)}
    write_file_atomically(os.path.join(folder, PID), json.dumps(info).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
