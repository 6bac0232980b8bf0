"""Pipelines for the Prefect-on-Dask tests, loaded by file path (``tests/prefect/dask_pipeline.py:
pipeline``): a worker can only resolve their functions by loading this file first.

``pipeline``: prep -> four shards -> two GPU training steps (``gpu=1``) -> one eval. The shards
wait (bounded) until all four have started: two workers of two threads can only do that side
by side, so the steps are spread over both workers whatever Dask's first placement was (it
moves queued tasks to an idle worker). ``slow``: one step whose first attempt blocks (a worker
killed there is the test's lost machine).

Each ``fn`` appends ``start|end <step> <worker> <pid>`` to ``$MARIN_DASK_TEST_EVENTS`` (one
``O_APPEND`` write per line); ``<worker>`` is ``$MARIN_TEST_WORKER``, which the harness sets.
"""

from __future__ import annotations

import os
import time
from typing import Any

import fsspec

from marin.execution.lazy import OUT, apply

EVENTS_ENV = "MARIN_DASK_TEST_EVENTS"


def _note(event: str, step: str) -> None:
    line = f"{event} {step} {os.environ.get('MARIN_TEST_WORKER', '-')} {os.getpid()}\n"
    fd = os.open(os.environ[EVENTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _starts(prefix: str) -> int:
    with open(os.environ[EVENTS_ENV]) as f:
        return sum(1 for line in f if line.startswith(f"start {prefix}"))


def work(
    step: str, after: list[str], out_path: str, seconds: float, hold: bool, peers: int = 0
) -> dict[str, Any]:
    """Write ``out_path/done``; with ``hold``, the first attempt blocks (to be killed); with
    ``peers``, wait (at most 30 s) until that many steps of its group have started."""
    _note("start", step)
    if hold and _starts(step + " ") == 1:
        time.sleep(120)  # killed here by the test; a retry finds a second start and goes on
    group = step.split("-")[0]
    deadline = time.monotonic() + 30
    while peers and _starts(group) < peers and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(seconds)
    fs, path = fsspec.core.url_to_fs(out_path)
    fs.pipe_file(f"{path}/done", step.encode())
    _note("end", step)
    return {"worker": os.environ.get("MARIN_TEST_WORKER"), "pid": os.getpid()}


def step(name: str, *after: Any, seconds: float = 0.5, hold: bool = False, peers: int = 0) -> Any:
    return apply(
        name, work, version="v1", step=f"{name}@v1", after=list(after), out_path=OUT,
        seconds=seconds, hold=hold, peers=peers,
    )  # fmt: skip


prep = step("dask/prep", seconds=0.1)
shards = [step(f"dask/shard-{i}", prep, seconds=0.1, peers=4) for i in range(4)]
train = [step(f"dask/train-{i}", *shards).with_options(resources={"gpu": 1}) for i in range(2)]
pipeline = [step("dask/eval", *train, seconds=0.1)]

slow = [step("dask/slow", seconds=0.1, hold=True)]
