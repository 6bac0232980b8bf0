"""Module-level step functions for the resource tests: importable by reference, so they can run
isolated in a fresh subprocess or in another runner's worker.

Steps append JSON lines to the call log named by ``$MARIN_TEST_CALLS`` (the conformance suite's
format), with the devices they were given, so a test can replay who held what and when.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from typing import Any

from tests.conformance.scenarios import CALLS_ENV, append_call, read_calls

RELEASE = threading.Event()
"""Set by a test to let ``wait_for_release`` return (the in-thread timeout test)."""


def _log(calls: str, step: str, event: str) -> None:
    append_call(calls, step, event + "|" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))


def wait_for_peers(calls: str, step: str, peers: int, out_path: str) -> dict[str, Any]:
    """Start, then wait (bounded) until ``peers`` steps have started, so the cap is reached."""
    _log(calls, step, "start")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        started = sum(1 for c in read_calls(calls) if c["event"].startswith("start|"))
        if started >= peers:
            break
        time.sleep(0.01)
    print(f"step {step} ran with CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, "done"), "w") as f:
        f.write(step)
    _log(calls, step, "end")
    return {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}


def hang(pid_file: str) -> None:
    """Write this process's id, then never return (only a kill ends it)."""
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)


def start_helpers(pid_file: str, then_hang: bool = False) -> None:
    """Start two helper processes that keep this process's stdout open (a metrics server, a
    data-loader worker), write their ids, then return, or hang when ``then_hang``. The second
    leaves the process group in its own session, as a daemonising server does."""
    helpers = [
        subprocess.Popen(["sleep", "600"]),
        subprocess.Popen(["sleep", "600"], start_new_session=True),
    ]
    with open(pid_file, "w") as f:
        f.write(" ".join(str(pid) for pid in [p.pid for p in helpers] + [os.getpid()]))
    print("helpers started", flush=True)
    while then_hang:
        time.sleep(1)


ATTEMPTS: list[int] = []
LATE_WRITTEN = threading.Event()


def write_per_attempt(out_path: str) -> int:
    """Attempt 1 writes a file, then (timed out, abandoned) waits for ``RELEASE`` and writes
    another one late. A later attempt releases it, waits for that late write, writes its own."""
    attempt = len(ATTEMPTS) + 1
    ATTEMPTS.append(attempt)
    os.makedirs(out_path, exist_ok=True)
    if attempt == 1:
        _touch(out_path, "attempt-1")
        RELEASE.wait(60)
        _touch(out_path, "attempt-1-late")
        LATE_WRITTEN.set()
        return attempt
    RELEASE.set()
    LATE_WRITTEN.wait(10)
    _touch(out_path, f"attempt-{attempt}")
    return attempt


def _touch(folder: str, name: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(name)


def wait_for_release() -> str:
    RELEASE.wait(60)
    return "released"


def fail(message: str) -> None:
    print("about to fail")
    raise KeyError(message)


def whoami(out_path: str) -> dict[str, Any]:
    os.makedirs(out_path, exist_ok=True)
    return {"pid": os.getpid(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


def calls_env() -> str:
    return os.environ[CALLS_ENV]


def overlaps(calls: list[dict[str, Any]]) -> tuple[int, dict[str, int]]:
    """Replay a call log: the peak number of steps running at once, and per device."""
    running = 0
    peak = 0
    per_device: dict[str, int] = {}
    device_peak: dict[str, int] = {}
    for call in sorted(calls, key=lambda c: (c["t"], c["event"].startswith("start"))):
        kind, _, devices = call["event"].partition("|")
        if kind not in ("start", "end"):
            continue
        delta = 1 if kind == "start" else -1
        running += delta
        peak = max(peak, running)
        for device in filter(None, devices.split(",")):
            per_device[device] = per_device.get(device, 0) + delta
            device_peak[device] = max(device_peak.get(device, 0), per_device[device])
    return peak, device_peak


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# --- pipelines for the engine tests (targets: tests/resources/resource_pipelines.py:NAME) -------


def placed() -> list[Any]:
    """One step per mapping: cpu/memory + queue + timeout, GPUs in the gpu pool, none at all."""
    from marin.execution.lazy import OUT, apply

    return [
        apply("place/tokenize", whoami, version="v1", out_path=OUT).with_options(
            resources={"cpu": 4, "memory": "16GiB"}, queue="cpu-q", timeout="1h30m"
        ),
        apply("place/train", whoami, version="v1", out_path=OUT).with_options(
            resources={"gpu": 2, "cpu": 8, "memory": "64GiB"}, pool="gpu", timeout=7200
        ),
        apply("place/eval", whoami, version="v1", out_path=OUT).with_options(
            resources={"gpu": 1, "cpu": 0.5, "memory": "1.5GiB", "tpu": 4},
            pool="gpu 'q\"",
            queue="gpu-q",
        ),
        apply("place/plain", whoami, version="v1", out_path=OUT),
    ]


GPU_CAP = {"e0": 1, "e1": 1, "e2": 1, "e3": 1, "train": 2}
"""The conformance scenario: GPUs per step; run it where the capacity is gpu=2."""


def gpu_cap() -> list[Any]:
    """Steps asking for 6 GPUs in all, on a 2-GPU capacity (the ``gpu`` pool / limit)."""
    from marin.execution.lazy import OUT, apply

    calls = os.environ.get(CALLS_ENV, "calls.jsonl")
    return [
        apply(f"cap/{name}", wait_for_peers, version="v1", calls=calls, step=name,
              peers=2 if n == 1 else 1, out_path=OUT).with_options(
            resources={"gpu": n}, pool="gpu"
        )
        for name, n in GPU_CAP.items()
    ]  # fmt: skip


def gpu_in_use(calls: list[dict[str, Any]], gpus: dict[str, int]) -> list[int]:
    """Replay start/end events: the GPUs held after each event, in time order."""
    held, timeline = 0, []
    for call in sorted(calls, key=lambda c: (c["t"], c["event"].startswith("start"))):
        kind = call["event"].split("|")[0]
        if kind in ("start", "end"):
            held += gpus[call["step"]] * (1 if kind == "start" else -1)
            timeline.append(held)
    return timeline


class NeedsTwo(Exception):
    """Pickles (as its one message) but cannot be unpickled: ``__init__`` needs two arguments."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what} failed: {why}")


def fail_oddly() -> None:
    raise NeedsTwo("tokenize", "no vocab")
