"""Module-level step functions for the resource tests: importable by reference, so they can run
isolated in a fresh subprocess or in another runner's worker.

Steps append JSON lines to the call log named by ``$MARIN_TEST_CALLS`` (the conformance suite's
format), with the devices they were given, so a test can replay who held what and when.
"""

from __future__ import annotations

import json
import os
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
