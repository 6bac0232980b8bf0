"""Remote steps for ``test_watch_timing.py`` (issue 55): a job's duration, and a log holding a
huge line.

``timed``: a ``local`` job that writes ``$MARIN_TEST_STARTED``, waits for ``$MARIN_TEST_GATE``
and runs at least ``MIN_JOB_S`` in all (``timed_resumable``: the same step, resumable). ``logs``: a plain job and a gang of two that each print
a line, a 3 MB line (a progress bar would make one), then a partial line, and wait for the gate.
"""

from __future__ import annotations

import os
import sys
import time

from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.context import current_context

MIN_JOB_S = 3.0
HUGE = 3_000_000


def _gate() -> None:
    gate = os.environ["MARIN_TEST_GATE"]
    deadline = time.monotonic() + 300  # left alone: at most 5 minutes
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)


def long_job(out: str) -> str:
    began = time.monotonic()
    with open(os.environ["MARIN_TEST_STARTED"], "w") as f:
        f.write("started")
    _gate()
    time.sleep(max(0.0, MIN_JOB_S - (time.monotonic() - began)))  # the job's own length
    os.makedirs(out, exist_ok=True)
    return "trained"


def printer(out: str) -> str:
    rank = current_context().rank
    print(f"rank {rank}: epoch 1 loss=0.5", flush=True)
    sys.stdout.write("A" * HUGE + "\n")
    print(f"rank {rank}: epoch 2 (no newline yet)", end="", flush=True)
    _gate()
    os.makedirs(out, exist_ok=True)
    return "printed"


timed = [apply("timed/train", long_job, version="v1", out=OUT).with_options(remote="local")]
timed_resumable = [
    apply("timed/train", long_job, version="v1", out=OUT).with_options(
        remote="local", resumable=True
    )
]
logs = [
    apply("logs/plain", printer, version="v1", out=OUT).with_options(remote="local"),
    apply("logs/gang", printer, version="v1", out=OUT).with_options(remote="local", ranks=2),
]
