"""Pipelines and a process entry point for the reliability tests.

Child processes run ``python -m tests.reliability.pipelines <pipeline> <prefix>`` (or the
``marin`` CLI with ``tests/reliability/pipelines.py:<pipeline>``). Everything a test controls
goes through environment variables, so a test never has to sleep and hope:

- ``MARIN_TEST_CALLS``: a file every ``fn`` call appends one line to with ``O_APPEND`` (a single
  ``write`` of a short line, so lines from racing processes never interleave);
- ``MARIN_TEST_GO``: the entry point waits for this file to exist before it starts (a start
  barrier for racing processes);
- ``MARIN_TEST_SLEEP``: seconds each ``fn`` sleeps (default 0.02);
- ``MARIN_TEST_HOLD`` = ``<step>:<started file>:<release file>``: that step's ``fn`` writes its
  whole output, creates the started file, then waits until the release file exists;
- ``MARIN_FAULT_CRASH=during-fn@<step>``: that step's ``fn`` kills its own process with SIGKILL
  after writing the first half of its output (the engine's own crash points are in
  ``marin.execution.faults``).

Each ``fn`` writes ``part1`` and ``part2`` into its output folder, both holding a token unique to
the call, and returns the token. A committed step whose record's token differs from either
part's token, or that lacks a part, would be a committed step with partial output.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

import fsspec

from marin.execution import faults
from marin.execution.lazy import OUT, ArtifactStep, apply

CALLS_ENV = "MARIN_TEST_CALLS"
GO_ENV = "MARIN_TEST_GO"
SLEEP_ENV = "MARIN_TEST_SLEEP"
HOLD_ENV = "MARIN_TEST_HOLD"


def append_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def wait_for_file(path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


def work(step: str, inputs: list[str], out_path: str) -> str:
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    calls = os.environ.get(CALLS_ENV)
    if calls:
        append_line(calls, f"{step} {token}")
    for path in inputs:
        fs, p = fsspec.core.url_to_fs(path)
        if not fs.exists(f"{p}/part2"):
            raise AssertionError(f"{step} started before its input {path} was complete")
    fs, out = fsspec.core.url_to_fs(out_path)
    fs.makedirs(out, exist_ok=True)
    fs.pipe_file(f"{out}/part1", token.encode())
    if faults.should_crash("during-fn", step):
        faults.crash_now()
    time.sleep(float(os.environ.get(SLEEP_ENV, "0.02")))
    fs.pipe_file(f"{out}/part2", token.encode())
    hold = os.environ.get(HOLD_ENV, "")
    if hold:
        held, started, release = hold.split(":")
        if held == step:
            append_line(started, token)
            wait_for_file(release)
    return token


def step(name: str, *deps: ArtifactStep) -> ArtifactStep:
    return apply(name, work, version="v1", step=name, inputs=list(deps), out_path=OUT)


def race_pipeline(width: int = 5, depth: int = 6) -> list[ArtifactStep]:
    """``width * depth`` steps (30 by default) in layers; each depends on one or two steps above."""
    layers: list[list[ArtifactStep]] = []
    for d in range(depth):
        row = []
        for w in range(width):
            above = [] if d == 0 else sorted({w, (w * 3 + d) % width})
            deps = [layers[-1][i] for i in above]
            row.append(step(f"race/{d}-{w}", *deps))
        layers.append(row)
    return [s for row in layers for s in row]


def crash_pipeline() -> list[ArtifactStep]:
    """Six steps: a diamond, a tail and an independent step."""
    a = step("crash/a")
    b = step("crash/b", a)
    c = step("crash/c", a)
    d = step("crash/d", b, c)
    e = step("crash/e", d)
    f = step("crash/f")
    return [a, b, c, d, e, f]


CRASH_STEPS = ["crash/a", "crash/b", "crash/c", "crash/d", "crash/e", "crash/f"]
PIPELINES = {"race": race_pipeline, "crash": crash_pipeline}

# Targets for the ``marin`` CLI and the Prefect adapter.
race = race_pipeline()
crash = crash_pipeline()
held = [step("held/one")]


def verify(handles: list[ArtifactStep], prefix: str) -> dict[str, Any]:
    """Every artifact committed and complete, as this process sees it."""
    from marin.execution.lazy import lower
    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import read_record

    location = open_prefix(prefix)
    seen = {}
    for spec in lower(*handles, memo={}):
        record = read_record(location, spec.output_path)
        assert record is not None, f"{spec.step_id} has no record"
        out = location.path(spec.output_path)
        parts = [location.fs.cat_file(f"{out}/part{i}").decode() for i in (1, 2)]
        assert parts == [record.result] * 2, f"{spec.step_id}: {parts} vs {record.result}"
        seen[spec.step_id] = record.result
    return seen


def main(argv: list[str]) -> int:
    import logging

    from marin.execution.lazy import run

    logging.basicConfig(level=logging.INFO, format="%(process)d %(levelname)s %(message)s")
    name, prefix = argv[0], argv[1]
    max_concurrent = int(argv[2]) if len(argv) > 2 else 4
    handles = PIPELINES[name]()
    go = os.environ.get(GO_ENV)
    if go:
        wait_for_file(go)
    run(*handles, prefix=prefix, max_concurrent=max_concurrent)
    print(json.dumps(verify(handles, prefix)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
