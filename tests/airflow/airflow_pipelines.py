"""Small pipelines for the Airflow adapter tests. DAG files name this file as their target.

Every step appends one JSON line per event (start / fail / end, with a timestamp and pid) to the
file named by ``$MARIN_AIRFLOW_TEST_CALLS`` when it is set, so a test can prove that a cached
task never called ``fn``, that dependents never started, and what ran at the same time.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from marin.execution.lazy import OUT, ArtifactStep, apply
from tests.conformance.scenarios import append_call
from tests.conformance.scenarios import read_calls as read_calls  # re-exported for the tests

CALLS_ENV = "MARIN_AIRFLOW_TEST_CALLS"
LR_ENV = "MARIN_AIRFLOW_TEST_LR"
"""The ``tuned`` step's learning rate: part of its config, so of its fingerprint."""
FAIL_ENV = "MARIN_AIRFLOW_TEST_FAIL"
"""Comma-separated tags of steps that raise when they run (not part of any fingerprint)."""
SLEEP_ENV = "MARIN_AIRFLOW_TEST_SLEEP"

WEIRD_NAME = "af/we'ird\"{{7+7}}-ü"  # Jinja braces and quotes; no glob character
FANOUT_WIDTH = 8


def record(tag: str, event: str) -> None:
    path = os.environ.get(CALLS_ENV)
    if path:
        append_call(path, tag, event)


def work(tag: str, inputs: list[str], config: dict[str, Any], out_path: str) -> dict[str, Any]:
    record(tag, "start")
    for path in inputs:
        if not os.path.exists(path):
            raise AssertionError(f"{tag} started before its input {path} existed")
    time.sleep(float(config.get("sleep", 0)) * float(os.environ.get(SLEEP_ENV, "1")))
    if tag in os.environ.get(FAIL_ENV, "").split(","):
        record(tag, "fail")
        raise RuntimeError(f"boom in {tag}")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump({"tag": tag, "config": config}, f)
    record(tag, "end")
    return {"tag": tag, "inputs": len(inputs)}


def step(name: str, tag: str, *deps: ArtifactStep, **config: Any) -> ArtifactStep:
    return apply(name, work, version="v1", tag=tag, inputs=list(deps), config=config, out_path=OUT)


def toy() -> list[ArtifactStep]:
    """root -> weird, root -> tuned -> after-tuned, root -> bad -> after-bad."""
    root = step("af/root", "root")
    weird = step(WEIRD_NAME, "weird", root, note="quotes ' \" and {{ braces }}")
    tuned = step("af/tuned", "tuned", root, lr=float(os.environ.get(LR_ENV, "0.1")))
    after_tuned = step("af/after-tuned", "after-tuned", tuned)
    bad = step("af/bad", "bad", root)
    after_bad = step("af/after-bad", "after-bad", bad)
    return [weird, after_tuned, after_bad]


def scheduling() -> list[ArtifactStep]:
    """Per-step retries and pools, for the DAG structure tests (parsed, not run)."""
    a = step("sched/a", "a").with_options(retries=3)
    b = step("sched/b", "b", a).with_options(pool="gpu 'pool'")
    c = step("sched/c", "c", a, b)
    return [c]


def fanout() -> ArtifactStep:
    """root -> FANOUT_WIDTH sleeping leaves -> sink: for the scheduler concurrency test."""
    root = step("fan/root", "root")
    leaves = [step(f"fan/leaf-{i}", f"leaf-{i}", root, sleep=3.0) for i in range(FANOUT_WIDTH)]
    return step("fan/sink", "sink", *leaves)


WIDE_WIDTH = 40


def wide() -> list[ArtifactStep]:
    """root -> WIDE_WIDTH leaves, no sink: a leaf's ancestors are 2 of the graph's 41 steps."""
    root = step("wide/root", "root")
    return [step(f"wide/leaf-{i}", f"leaf-{i}", root) for i in range(WIDE_WIDTH)]
