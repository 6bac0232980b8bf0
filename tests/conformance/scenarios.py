"""Pipelines the conformance suite runs on every runner (local, Prefect, Airflow).

They are module-level functions so that any runner can import them by module path
(``tests.conformance.scenarios:diamond``), in another process if it must. Steps report to a call
log named by ``$MARIN_TEST_CALLS``, one JSON line per event, appended with ``O_APPEND`` so that
concurrent writers from threads or processes never interleave within a line.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import fsspec

from marin.execution.lazy import OUT, ArtifactStep, apply

CALLS_ENV = "MARIN_TEST_CALLS"
SLEEP_ENV = "MARIN_TEST_SLEEP"


def record_call(step: str, event: str) -> None:
    append_call(os.environ[CALLS_ENV], step, event)


def append_call(path: str, step: str, event: str) -> None:
    """One JSON line per event; ``O_APPEND`` keeps concurrent writers' lines whole."""
    line = json.dumps({"step": step, "event": event, "t": time.time(), "pid": os.getpid()})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_calls(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def work(step: str, inputs: list[str], sleep: float, fail: bool, out_path: str) -> dict[str, Any]:
    """A step that proves its inputs exist, takes ``sleep`` seconds, and writes its output."""
    record_call(step, "start")
    for path in inputs:
        fs, p = fsspec.core.url_to_fs(path)
        if not fs.exists(p):
            raise AssertionError(f"{step} started before its input {path} existed")
    time.sleep(sleep * float(os.environ.get(SLEEP_ENV, "1")))
    if fail:
        record_call(step, "fail")
        raise RuntimeError(f"boom in {step}")
    with fsspec.open(out_path, "w", auto_mkdir=True) as f:
        f.write(step)
    record_call(step, "end")
    return {"step": step, "inputs": len(inputs)}


def step(name: str, *deps: ArtifactStep, sleep: float = 0.0, fail: bool = False) -> ArtifactStep:
    return apply(
        f"conformance/{name}", work, version="v1",
        step=name, inputs=list(deps), sleep=sleep, fail=fail, out_path=OUT,
    )  # fmt: skip


def chain() -> ArtifactStep:
    a = step("a")
    b = step("b", a)
    return step("c", b)


def diamond() -> ArtifactStep:
    top = step("top")
    left, right = step("left", top, sleep=0.05), step("right", top, sleep=0.05)
    return step("bottom", left, right)


WIDE_LEAVES = 8


def wide() -> ArtifactStep:
    root = step("root")
    leaves = [step(f"leaf-{i}", root, sleep=0.4) for i in range(WIDE_LEAVES)]
    return step("sink", *leaves)


def failing() -> list[ArtifactStep]:
    """``bad`` fails at once while ``slow`` is still running; ``after_slow`` is independent."""
    root = step("root")
    bad = step("bad", root, fail=True)
    after_bad = step("after-bad", bad)
    slow = step("slow", root, sleep=0.6)
    after_slow = step("after-slow", slow)
    return [after_bad, after_slow]
