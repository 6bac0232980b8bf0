"""Pipelines the conformance suite runs on every runner (local, Prefect, Airflow).

They are module-level functions so that any runner can import them by module path
(``tests.conformance.scenarios:diamond``), in another process if it must. Steps report to a call
log named by ``$MARIN_TEST_CALLS``, one JSON line per event, appended with ``O_APPEND`` so that
concurrent writers from threads or processes never interleave within a line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import fsspec

from marin.execution.lazy import OUT, ArtifactStep, apply

CALLS_ENV = "MARIN_TEST_CALLS"
SLEEP_ENV = "MARIN_TEST_SLEEP"
LIMIT_ENV = "MARIN_TEST_LIMIT"
"""The concurrency limit a test runs with: peer steps wait until that many of them run at once."""
LIMIT_FILE_ENV = "MARIN_TEST_LIMIT_FILE"
"""Or a file holding it: a runner whose workers' environment is fixed (Airflow's services)."""


def _limit() -> int:
    """``$MARIN_TEST_LIMIT``, else what ``$MARIN_TEST_LIMIT_FILE`` holds, else 0."""
    if LIMIT_ENV in os.environ or LIMIT_FILE_ENV not in os.environ:
        return int(os.environ.get(LIMIT_ENV, "0"))
    try:
        with open(os.environ[LIMIT_FILE_ENV]) as f:
            return int(f.read() or "0")
    except FileNotFoundError:
        return 0


def record_call(step: str, event: str, **extra: Any) -> None:
    append_call(os.environ[CALLS_ENV], step, event, **extra)


def append_call(path: str, step: str, event: str, **extra: Any) -> None:
    """One JSON line per event; ``O_APPEND`` keeps concurrent writers' lines whole."""
    data = {"step": step, "event": event, "t": time.time(), "pid": os.getpid(), **extra}
    line = json.dumps(data)
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


def observed_engine() -> dict[str, Any] | None:
    """The engine's own id of the unit of work running this step's fn, asked of the engine
    itself (never of Marin): the Prefect task run, or the Airflow task instance; None under
    the local runner. A record must name the same one (tests/conformance/test_scenarios.py).
    An engine that is not imported here is not running this fn, so none is imported."""
    if "prefect" in sys.modules:
        from prefect.runtime import flow_run, task_run

        if task_run.id is not None:
            return {"name": "prefect", "task_run_id": task_run.id, "flow_run_id": flow_run.id}
    if "airflow.sdk" in sys.modules:
        from airflow.sdk import get_current_context

        try:
            ti = get_current_context()["ti"]
        except Exception:  # no task instance is running here
            return None
        fields = ("dag_id", "run_id", "task_id", "try_number", "map_index")
        return {"name": "airflow", **{field: getattr(ti, field) for field in fields}}
    return None


WAIT_TIMEOUT_S = 120.0


def wait_for_event(step: str, event: str, timeout: float = WAIT_TIMEOUT_S) -> None:
    """Block until the call log has ``event`` for ``step`` (written by any thread or process)."""
    path = os.environ[CALLS_ENV]
    deadline = time.monotonic() + timeout
    while not any(c["step"] == step and c["event"] == event for c in read_calls(path)):
        if time.monotonic() > deadline:
            raise AssertionError(f"{step} never logged {event!r} within {timeout:.0f} s")
        time.sleep(0.01)


def wait_for_peers(group: str, size: int, timeout: float = WAIT_TIMEOUT_S) -> None:
    """With ``$MARIN_TEST_LIMIT`` = L, block until as many steps of ``group`` (name prefix) run at
    once as the limit allows: started >= min(size, ended + L). The runner's cap is then reached
    by events, whatever each step's start-up costs (threads, or an Airflow task process)."""
    limit = _limit()
    if limit <= 1:
        return
    path = os.environ[CALLS_ENV]
    deadline = time.monotonic() + timeout
    while True:
        calls = [c for c in read_calls(path) if c["step"].startswith(group)]
        started = sum(1 for c in calls if c["event"] == "start")
        ended = sum(1 for c in calls if c["event"] == "end")
        if started >= min(size, ended + limit):
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"only {started - ended} {group}* steps ran at once within {timeout:.0f} s "
                f"(limit {limit})"
            )
        time.sleep(0.01)


def work(
    step: str,
    inputs: list[str],
    sleep: float,
    fail: bool,
    out_path: str,
    after_failure_of: str | None = None,
    peers: int = 0,
    failing_attempts: int = 0,
    after_start_of: str | None = None,
) -> dict[str, Any]:
    """A step that proves its inputs exist, takes ``sleep`` seconds, and writes its output.

    With ``after_failure_of``, it also waits until that step has failed: an ordering by event,
    not by a sleep that a loaded machine (or a scheduler's task start-up) can outrun. With
    ``after_start_of``, it waits (before failing or ending) until that step has started.
    With ``failing_attempts`` = N, its first N attempts fail: attempts are counted in the call
    log, which every process appends to (an Airflow retry runs in a new worker process).
    """
    record_call(step, "start")
    if failing_attempts:
        calls = read_calls(os.environ[CALLS_ENV])
        attempt = sum(1 for c in calls if c["step"] == step and c["event"] == "start")
        if attempt <= failing_attempts:
            record_call(step, "fail")
            raise RuntimeError(f"{step}: attempt {attempt} fails on purpose")
    for path in inputs:
        fs, p = fsspec.core.url_to_fs(path)
        if not fs.exists(p):
            raise AssertionError(f"{step} started before its input {path} existed")
    if after_start_of:
        wait_for_event(after_start_of, "start")
    if after_failure_of:
        wait_for_event(after_failure_of, "fail")
    if peers:
        wait_for_peers(step.rstrip("0123456789"), peers)
    time.sleep(sleep * float(os.environ.get(SLEEP_ENV, "1")))
    if fail:
        record_call(step, "fail")
        raise RuntimeError(f"boom in {step}")
    with fsspec.open(out_path, "w", auto_mkdir=True) as f:
        f.write(step)
    record_call(step, "end", engine=observed_engine())
    return {"step": step, "inputs": len(inputs)}


def step(
    name: str,
    *deps: ArtifactStep,
    sleep: float = 0.0,
    fail: bool = False,
    after_failure_of: str | None = None,
    peers: int = 0,
    failing_attempts: int = 0,
    after_start_of: str | None = None,
) -> ArtifactStep:
    extra: dict[str, Any] = {"after_failure_of": after_failure_of} if after_failure_of else {}
    if after_start_of:
        extra["after_start_of"] = after_start_of
    if peers:
        extra["peers"] = peers
    if failing_attempts:  # only when set: the other scenarios' fingerprints stay as they were
        extra["failing_attempts"] = failing_attempts
    return apply(
        f"conformance/{name}", work, version="v1",
        step=name, inputs=list(deps), sleep=sleep, fail=fail, out_path=OUT, **extra,
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
    leaves = [step(f"leaf-{i}", root, sleep=0.1, peers=WIDE_LEAVES) for i in range(WIDE_LEAVES)]
    return step("sink", *leaves)


def failing() -> list[ArtifactStep]:
    """``bad`` fails while ``slow`` is still running: ``bad`` fails only once ``slow`` has
    started, and ``slow`` ends only after that failure, both by event (otherwise a task start-up
    slower than ``bad`` on a loaded machine meets the failure first, and fail-fast rightly never
    starts ``slow``); ``after_slow`` is independent of ``bad``."""
    root = step("root")
    bad = step("bad", root, fail=True, after_start_of="slow")
    after_bad = step("after-bad", bad)
    slow = step("slow", root, sleep=0.1, after_failure_of="bad")
    after_slow = step("after-slow", slow)
    return [after_bad, after_slow]


def flaky() -> ArtifactStep:
    """``flaky`` fails on its first attempt and succeeds on its second (``retries=1``); its
    dependent runs once, after it."""
    root = step("root")
    flaky = step("flaky", root, failing_attempts=1).with_options(retries=1)
    return step("after-flaky", flaky)
