"""A pipeline for drivers that share the work, loaded by ``marin run`` from this file's path.

Three independent chains of four steps (12 steps, three wide). Each ``fn`` appends
``start <step> <pid> <time>`` to ``$MARIN_SHARED_EVENTS`` before its work and ``end <step>
<pid> <time>`` after it (one ``O_APPEND`` write each, so lines of racing processes never interleave), and
sleeps ``$MARIN_SHARED_SLEEP`` seconds (default 1) as its work.
"""

from __future__ import annotations

import os
import time

from marin.execution.lazy import OUT, ArtifactStep, apply

EVENTS_ENV = "MARIN_SHARED_EVENTS"
SLEEP_ENV = "MARIN_SHARED_SLEEP"
CHAINS, LENGTH = 3, 4


def _note(event: str, step: str) -> None:
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{event} {step} {os.getpid()} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)


def work(step: str, after: list[str], out_path: str) -> int:
    """The step's work: one sleep; it returns its process id (the record's ``result``)."""
    _note("start", step)
    time.sleep(float(os.environ.get(SLEEP_ENV, "1")))
    _note("end", step)
    return os.getpid()


def _chains() -> list[ArtifactStep]:
    steps: list[ArtifactStep] = []
    for c in range(CHAINS):
        above: list[ArtifactStep] = []
        for i in range(LENGTH):
            name = f"shared/c{c}-s{i}"
            above = [apply(name, work, version="v1", step=f"{name}@v1", after=above, out_path=OUT)]
            steps.extend(above)
    return steps


pipeline = _chains()
