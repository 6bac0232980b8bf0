"""Pipelines for the Airflow-on-Celery tests, imported by module path on every worker.

Every call of a step's ``fn`` leaves one JSON file in ``$MARIN_CELERY_TEST_EVENTS`` (a folder the
test owns) naming the step, the event, the worker (``$MARIN_TEST_WORKER``, set per worker), the
process id and its session id (each Celery worker runs in a session of its own), so a test proves where each step ran and that it was built once. Outputs go to the
step's output path on the object store, through fsspec.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from typing import Any

from marin.execution.lazy import OUT, ArtifactStep, apply

EVENTS_ENV = "MARIN_CELERY_TEST_EVENTS"
WORKER_ENV = "MARIN_TEST_WORKER"
GO_FILE = "go"
"""Written by the test into the events folder: the ``flaky`` step may now fail its attempt."""


def note(tag: str, event: str, **extra: Any) -> None:
    folder = os.environ[EVENTS_ENV]
    data = {"step": tag, "event": event, "worker": os.environ.get(WORKER_ENV), "pid": os.getpid()}
    data["sid"] = os.getsid(0)  # the session of the Celery worker whose task process this is
    name = f"{tag.replace('/', '~')}.{event}.{uuid.uuid4().hex}.json"
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump({**data, **extra, "t": time.time()}, f)
    os.replace(tmp, os.path.join(folder, name))  # a reader never sees half an event


def events(folder: str) -> list[dict[str, Any]]:
    found = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json") and not name.startswith("."):
            with open(os.path.join(folder, name)) as f:
                found.append(json.load(f))
    return sorted(found, key=lambda e: e["t"])


def _started_before(tag: str) -> bool:
    return any(e["step"] == tag and e["event"] == "start" for e in events(os.environ[EVENTS_ENV]))


def _wait_for_file(path: str, timeout: float) -> None:
    """Until the test writes ``path`` (its event to this attempt)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        pause.wait(0.1)


def work(tag: str, inputs: list[str], seconds: float, mode: str, out_path: str) -> dict[str, Any]:
    first = not _started_before(tag)
    note(tag, "start")
    if mode == "hang" and first:
        # The first attempt hangs until the test kills its worker's machine.
        threading.Event().wait(600)
    if mode == "flaky" and first:
        _wait_for_file(os.path.join(os.environ[EVENTS_ENV], GO_FILE), 300)
        note(tag, "fail")
        raise RuntimeError(f"{tag}: a transient failure on worker {os.environ.get(WORKER_ENV)}")
    threading.Event().wait(seconds)  # a step that takes a while, so steps overlap
    import fsspec

    with fsspec.open(f"{out_path}/data.json", "w") as f:
        json.dump({"tag": tag, "inputs": inputs}, f)
    note(tag, "end")
    return {"tag": tag, "worker": os.environ.get(WORKER_ENV)}


def step(
    name: str, *deps: ArtifactStep, seconds: float = 0.0, mode: str = "normal"
) -> ArtifactStep:
    return apply(
        name,
        work,
        version="v1",
        tag=name,
        inputs=list(deps),
        seconds=seconds,
        mode=mode,
        out_path=OUT,
    )


FANOUT = 4


def routed() -> ArtifactStep:
    """prep -> 4 data shards -> 2 training steps on the ``gpu`` queue -> eval."""
    prep = step("cel/prep")
    shards = [step(f"cel/data-{i}", prep, seconds=2.0) for i in range(FANOUT)]
    trains = [
        step(f"cel/train-{i}", *shards[2 * i : 2 * i + 2], seconds=1.0).with_options(queue="gpu")
        for i in range(2)
    ]
    return step("cel/eval", *trains)


def victim() -> ArtifactStep:
    """root -> two sides -> the step whose worker is killed -> after."""
    root = step("kill/root")
    sides = [step(f"kill/side-{i}", root) for i in range(2)]
    hang = step("kill/victim", *sides, mode="hang")
    return step("kill/after", hang)


def flaky() -> ArtifactStep:
    """root -> a step that fails its first attempt (retried once) -> after."""
    root = step("flaky/root")
    bad = step("flaky/step", root, mode="flaky").with_options(retries=2)
    return step("flaky/after", bad)
