"""A pipeline built from a JSON description in ``$MARIN_TEST_GRAPH``, for the plan property test.

Every runner imports ``tests.conformance.random_graph:pipeline`` by module path (Airflow in
another process), so the graph a test draws travels as data in the environment, not as code.
The description::

    {"steps": [{"name": "s0", "deps": [], "value": 0}, {"name": "s1", "deps": ["s0"], ...}],
     "targets": ["s1"]}

Steps are listed dependencies first. ``value`` is a config field: building a step with one value
and planning it with another, at the same version, is drift. Each step appends ``start`` and
``end`` to the call log of ``tests.conformance.scenarios`` (the side channel the tests count).

A step's output is ``<name>=<value>`` and a nonce, so every build's bytes differ (no early
cutoff), unless the description's ``"outputs"`` maps the step to a fixed suffix: then two builds
with one suffix write the same bytes (the "rebuilt, same output" state), and suffixes ``a`` and
``b`` differ in one byte. It is not config, so it moves no fingerprint.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import fsspec

from marin.execution.lazy import OUT, ArtifactStep, apply
from tests.conformance.scenarios import record_call

GRAPH_ENV = "MARIN_TEST_GRAPH"
PREFIX = "graph"
"""Step names are ``graph/<name>``."""


def graph_step(step: str, inputs: list[str], value: int, out_path: str) -> dict[str, Any]:
    """Prove the inputs exist, then write the output; logs ``start``/``end`` to the call log."""
    record_call(step, "start")
    for path in inputs:
        fs, p = fsspec.core.url_to_fs(path)
        if not fs.exists(p):
            raise AssertionError(f"{step} started before its input {path} existed")
    outputs = json.loads(os.environ.get(GRAPH_ENV, "{}")).get("outputs") or {}
    suffix = outputs.get(step, uuid.uuid4().hex)
    with fsspec.open(out_path, "w", auto_mkdir=True) as f:
        f.write(f"{step}={value}:{suffix}")
    record_call(step, "end")
    return {"step": step, "value": value}


def build(description: dict[str, Any]) -> list[ArtifactStep]:
    handles: dict[str, ArtifactStep] = {}
    for s in description["steps"]:
        handles[s["name"]] = apply(
            f"{PREFIX}/{s['name']}",
            graph_step,
            version="v1",
            step=s["name"],
            inputs=[handles[d] for d in s["deps"]],
            value=s["value"],
            out_path=OUT,
        )
    return [handles[t] for t in description["targets"]]


def pipeline() -> list[ArtifactStep]:
    return build(json.loads(os.environ[GRAPH_ENV]))
