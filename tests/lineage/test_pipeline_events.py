"""The pipeline run's own OpenLineage events: START before its steps', its end after theirs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openlineage.client")

from marin.execution.builder import lineage
from marin.execution.errors import StepFailedError
from marin.execution.lazy import OUT, apply, lower
from marin.execution.pipeline.graph import collect_steps
from marin.execution.pipeline.targets import load_target
from marin.execution.step_runner import StepRunner
from tests.lineage.helpers import (
    EXAMPLE,
    ROOT,
    check_event,
    file_transport,
    fresh_sender,
    read_events,
    write,
)

__all__ = ["fresh_sender"]  # the fixture, imported for pytest


def explode(out_path: str, text: str = "x") -> str:
    raise RuntimeError("disk full")


def _marin_run(events: Path, tmp_path: Path, prefix: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "openlineage.yml"
    config.write_text(f"transport:\n  type: file\n  log_file_path: {events}\n  append: true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")}
    env.update(OPENLINEAGE_CONFIG=str(config), PYTHONPATH=str(ROOT))
    marin = Path(sys.executable).parent / "marin"
    return subprocess.run(
        [str(marin), "run", EXAMPLE, "--prefix", str(prefix)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _index(events: list[dict[str, Any]], job: str, state: str) -> int:
    found = [i for i, e in enumerate(events) if e["job"]["name"] == job and e["eventType"] == state]
    assert len(found) == 1, (job, state, found)
    return found[0]


def test_marin_run_sends_the_pipeline_run_around_every_step_run(tmp_path: Path) -> None:
    events_path = tmp_path / "events.jsonl"
    proc = _marin_run(events_path, tmp_path, tmp_path / "art")
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = read_events(events_path)
    for event in events:
        check_event(event)
    steps = [s.step_id for s in collect_steps(list(lower(load_target(EXAMPLE), memo={})))]
    start, end = _index(events, EXAMPLE, "START"), _index(events, EXAMPLE, "COMPLETE")
    pipeline = events[start]
    run_id = pipeline["run"]["runId"]
    assert events[end]["run"]["runId"] == run_id
    assert pipeline["job"] == {
        "namespace": "marin",
        "name": EXAMPLE,
        "facets": pipeline["job"]["facets"],
    }
    assert pipeline["job"]["facets"]["jobType"]["jobType"] == "PIPELINE"
    assert pipeline["run"]["facets"]["marinPipeline"]["stepsToBuild"] == len(steps)
    assert pipeline["run"]["facets"]["marinPipeline"]["runner"] == "local"
    assert pipeline["inputs"] == [] and pipeline["outputs"] == []
    assert len(events) == 2 * len(steps) + 2
    for step in steps:
        step_start, step_end = _index(events, step, "START"), _index(events, step, "COMPLETE")
        assert start < step_start < step_end < end, step
        for i in (step_start, step_end):
            parent = events[i]["run"]["facets"]["parent"]
            assert parent["run"]["runId"] == run_id
            assert (parent["job"]["namespace"], parent["job"]["name"]) == ("marin", EXAMPLE)

    # Fully cached: no step runs, so no pipeline run is claimed either.
    again = _marin_run(events_path, tmp_path, tmp_path / "art")
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(read_events(events_path)) == len(events)


def test_a_failed_run_ends_fail_after_its_step_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_sender: lineage.LineageSender
) -> None:
    path = file_transport(tmp_path, monkeypatch)
    good = apply("pipe/good", write, version="v1", out_path=OUT)
    bad = apply("pipe/bad", explode, version="v1", out_path=OUT, text=good)
    run_id = "6f1c1f0e-1d7e-4c1e-9a39-7f0e3f3c9b11"
    with lineage.pipeline_run("my-sweep", run_id), pytest.raises(StepFailedError):
        StepRunner(prefix=str(tmp_path / "art")).run([bad.lower()])
    assert lineage.flush(30)
    events = read_events(path)
    for event in events:
        check_event(event)
    assert [(e["job"]["name"], e["eventType"]) for e in events] == [
        ("my-sweep", "START"),
        ("pipe/good@v1", "START"),
        ("pipe/good@v1", "COMPLETE"),
        ("pipe/bad@v1", "START"),
        ("pipe/bad@v1", "FAIL"),
        ("my-sweep", "FAIL"),
    ]
    assert events[0]["run"]["runId"] == events[-1]["run"]["runId"] == run_id
    assert events[-1]["run"]["facets"]["errorMessage"]["message"] == "1 step(s) failed"
    assert {e["run"]["facets"]["parent"]["run"]["runId"] for e in events[1:-1]} == {run_id}

    # Outside a named pipeline run (a library run: its parent is the process, which has no
    # end to report), only the step runs are sent.
    StepRunner(prefix=str(tmp_path / "art")).run(
        [apply("pipe/one", write, version="v1", out_path=OUT).lower()]
    )
    assert lineage.flush(30)
    assert [(e["job"]["name"], e["eventType"]) for e in read_events(path)[len(events) :]] == [
        ("pipe/one@v1", "START"),
        ("pipe/one@v1", "COMPLETE"),
    ]
