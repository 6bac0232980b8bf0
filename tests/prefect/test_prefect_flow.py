"""The compiled Prefect flow, run for real against one session-wide Prefect test harness."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.flows import load_flow_from_entrypoint

import tests.prefect.prefect_pipelines as toy
from marin.execution.errors import PipelineFailedError, StepFailedError
from marin.execution.lazy import OUT, apply, lower, run
from marin.execution.pipeline.graph import collect_steps
from marin.execution.plan.options import RunOptions
from marin_prefect import to_prefect_flow
from marin_prefect.compile import CACHED_STATE_NAME, NOT_RUN_STATE_NAME
from tests.prefect.prefect_helpers import (
    ROOT,
    TOY_TARGET,
    child_flow_runs,
    flow_run_id,
    read_flow_run,
    task_runs,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

EXAMPLE = ROOT / "examples" / "ngram.py"
EXAMPLE_TARGET = f"{EXAMPLE}:pipeline"

TIMING_KEYS = {"provenance", "started_at", "finished_at", "duration_s", "build_id"}


def _records(prefix: Path) -> dict[str, dict[str, Any]]:
    """Every committed record under ``prefix`` by its relative path, prefix and timings removed."""
    out = {}
    for record in sorted(prefix.rglob("record.json")):
        text = record.read_text().replace(str(prefix), "<PREFIX>")
        data = {k: v for k, v in json.loads(text).items() if k not in TIMING_KEYS}
        data["inputs"] = sorted(data["inputs"])  # build ids differ per build; the keys must not
        out[str(record.relative_to(prefix))] = data
    return out


def _outputs(prefix: Path) -> dict[str, bytes]:
    """Every artifact file (not Marin's own metadata) by relative path, with its bytes."""
    return {
        str(p.relative_to(prefix)): p.read_bytes()
        for p in sorted(prefix.rglob("*"))
        if p.is_file() and not any(part.endswith(".marin") for part in p.relative_to(prefix).parts)
    }


def test_example_as_flow_matches_local_run(tmp_path: Path) -> None:
    prefect_prefix, local_prefix = tmp_path / "prefect", tmp_path / "local"
    # The example declares resources; without resource_limits=True no Prefect limit is needed.
    pipeline = to_prefect_flow(EXAMPLE_TARGET, prefix=str(prefect_prefix))
    state = pipeline(return_state=True)
    assert state.is_completed(), state

    from marin.execution.pipeline.targets import load_target

    handles = load_target(EXAMPLE_TARGET)
    run(handles, prefix=str(local_prefix))

    specs = collect_steps(lower(list(handles)))
    outputs = state.result()
    assert outputs == {s.step_id: f"{prefect_prefix}/{s.output_path}" for s in specs}
    prefect_records, local_records = _records(prefect_prefix), _records(local_prefix)
    assert len(prefect_records) == len(specs)
    assert prefect_records == local_records  # paths, fingerprints, configs, results
    assert {r["fingerprint"] for r in prefect_records.values()} == {s.fingerprint for s in specs}
    assert _outputs(prefect_prefix) == _outputs(local_prefix)

    # One task run per step, named name@version, with the lowered dependencies as wait_for.
    runs = task_runs(flow_run_id(state), expected=len(specs))
    assert sorted(runs) == sorted(s.step_id for s in specs)
    names_by_id = {r.id: name for name, r in runs.items()}
    for spec in specs:
        waited = {names_by_id[i.id] for i in runs[spec.step_id].task_inputs.get("wait_for", [])}
        assert waited == {d.step_id for d in spec.deps}, spec.step_id
        assert runs[spec.step_id].state.is_completed()

    # Who built what: each record names the Prefect task run that built it; a local run's none.
    for spec in specs:
        path = f"{spec.output_path}.marin/record.json"
        prov = json.loads((prefect_prefix / path).read_text())["provenance"]
        assert prov["engine"] == {
            "name": "prefect",
            "task_run_id": str(runs[spec.step_id].id),
            "flow_run_id": str(flow_run_id(state)),
        }, spec.step_id
        assert "engine" not in json.loads((local_prefix / path).read_text())["provenance"]


def test_second_run_is_all_cached_and_never_calls_fn(tmp_path: Path, calls: Path) -> None:
    prefix = tmp_path / "p"
    pipeline = to_prefect_flow(toy.pipeline(), prefix=str(prefix))
    first = pipeline(return_state=True)
    assert first.is_completed(), first
    called = calls.read_text().splitlines()
    assert len(called) == 7, called
    records = sorted(prefix.rglob("record.json"))
    mtimes = [r.stat().st_mtime_ns for r in records]

    second = pipeline(return_state=True)
    assert second.is_completed(), second
    assert calls.read_text().splitlines() == called, "a cached run called a step's fn"
    assert [r.stat().st_mtime_ns for r in records] == mtimes
    runs = task_runs(flow_run_id(second), expected=7)
    assert len(runs) == 7
    for name, task_run in runs.items():
        assert task_run.state.is_completed() and task_run.state.name == CACHED_STATE_NAME, name
    # The Cached state's result is the artifact path.
    assert second.result() == first.result()
    assert second.result()["toy/report@v0"] == f"{prefix}/toy/report/v0"


@pytest.mark.parametrize("max_concurrent", [1, 3])
def test_peak_concurrency_equals_max_concurrent(tmp_path: Path, max_concurrent: int) -> None:
    gauge = toy.Gauge()
    steps = toy.wide(gauge, n=3 * max_concurrent, seconds=0.3, tag=str(max_concurrent))
    pipeline = to_prefect_flow(steps, prefix=str(tmp_path), options=RunOptions(max_concurrent=max_concurrent))
    assert pipeline(return_state=True).is_completed()
    assert gauge.peak == max_concurrent


def test_failed_step_fails_the_flow_and_blocks_its_dependents(tmp_path: Path, calls: Path) -> None:
    pipeline = to_prefect_flow(toy.failing(), prefix=str(tmp_path))
    state = pipeline(return_state=True)
    assert state.is_failed(), state
    with pytest.raises(StepFailedError, match=r"fail/bad@v0") as caught:
        state.result()
    assert isinstance(caught.value.__cause__, ValueError)
    assert "fail/child@v0" in str(caught.value)

    called = set(calls.read_text().splitlines())
    assert called == {"root", "sibling", "boom"}, "a dependent of the failed step ran"
    assert not (tmp_path / "fail/child/v0.marin/record.json").exists()
    assert not (tmp_path / "fail/bad/v0.marin/record.json").exists()
    assert json.loads((tmp_path / "fail/bad/v0.marin/status.json").read_text())["state"] == "FAILED"

    runs = task_runs(flow_run_id(state), expected=5)
    assert runs["fail/bad@v0"].state.is_failed()
    for blocked in ("fail/child@v0", "fail/grandchild@v0"):
        blocked_state = runs[blocked].state
        assert not blocked_state.is_completed(), blocked
        assert blocked_state.name == NOT_RUN_STATE_NAME
        assert "fail/bad@v0 failed" in (blocked_state.message or ""), blocked_state.message
    assert runs["fail/root@v0"].state.is_completed()
    assert runs["fail/sibling@v0"].state.is_completed()


@pytest.mark.parametrize("keep_going", [False, True])
def test_fail_fast_and_keep_going(tmp_path: Path, calls: Path, keep_going: bool) -> None:
    pipeline = to_prefect_flow(toy.fail_fast_graph(), prefix=str(tmp_path), options=RunOptions(keep_going=keep_going))
    state = pipeline(return_state=True)
    assert state.is_failed(), state
    called = calls.read_text().splitlines()
    runs = task_runs(flow_run_id(state), expected=3)
    if keep_going:
        with pytest.raises(PipelineFailedError, match=r"ff/bad@v0"):
            state.result()
        assert "after-slow" in called
        assert runs["ff/after-slow@v0"].state.is_completed()
    else:
        with pytest.raises(StepFailedError, match=r"ff/bad@v0"):
            state.result()
        assert "after-slow" not in called, "a step started after a failure under fail-fast"
        after = runs["ff/after-slow@v0"].state
        assert after.name == NOT_RUN_STATE_NAME
        assert "stopped after ff/bad@v0 failed" in (after.message or "")


def test_step_retries_map_to_task_retries(tmp_path: Path) -> None:
    attempts = tmp_path / "attempts"
    step = apply(
        "retry/flaky", toy.flaky, version="v0", out=OUT, attempts_file=str(attempts)
    ).with_options(retries=1)
    state = to_prefect_flow(step, prefix=str(tmp_path / "p"))(return_state=True)
    assert state.is_completed(), state
    assert attempts.read_text() == "2"
    run = task_runs(flow_run_id(state), expected=1)["retry/flaky@v0"]
    assert run.run_count == 2 and run.state.is_completed()

    attempts.unlink()
    no_retry = apply("retry/once", toy.flaky, version="v0", out=OUT, attempts_file=str(attempts))
    assert to_prefect_flow(no_retry, prefix=str(tmp_path / "p"))(return_state=True).is_failed()
    assert attempts.read_text() == "1"


def test_compiled_flow_runs_as_a_subflow(tmp_path: Path) -> None:
    pipeline = to_prefect_flow(toy.pipeline(), prefix=str(tmp_path))

    @flow(name="user-parent-flow")
    def parent() -> dict[str, str]:
        return pipeline()

    state = parent(return_state=True)
    assert state.is_completed(), state
    assert (tmp_path / "toy/report/v0").exists()
    children = child_flow_runs(flow_run_id(state))
    assert [c.name for c in children] and len(children) == 1
    child = children[0]
    assert child.flow_id == read_flow_run(child.id).flow_id
    assert child.parent_task_run_id is not None
    assert child.state is not None and child.state.is_completed()
    assert len(task_runs(child.id, expected=7)) == 7


def test_global_concurrency_limit_caps_builds_across_the_flow(tmp_path: Path) -> None:
    limit = "marin-test-gcl"
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit, limit=1))
    gauge = toy.Gauge()
    steps = toy.wide(gauge, n=2, seconds=0.2, tag="gcl")
    # A dependent waits for its dependency without holding a slot: with a limit of 1, a waiting
    # step that held one would deadlock the run.
    steps.append(apply("gcl/after", toy.after, version="v0", out=OUT, upstream=steps[0], label="x"))
    pipeline = to_prefect_flow(steps, prefix=str(tmp_path), concurrency_limit=limit, options=RunOptions(max_concurrent=3))
    assert pipeline(return_state=True).is_completed()
    assert gauge.peak == 1

    # A built step is served without asking for a slot: even a limit that does not exist
    # (strict, so asking would fail) is never consulted on a fully cached run.
    cached = to_prefect_flow(steps, prefix=str(tmp_path), concurrency_limit="no-such-limit")
    assert cached(return_state=True).is_completed()

    # ...while a step that must build asks for the slot, and strict mode makes a missing limit
    # an error rather than an unlimited run.
    fresh = to_prefect_flow(
        toy.wide(toy.Gauge(), n=1, seconds=0, tag="gcl-missing"),
        prefix=str(tmp_path),
        concurrency_limit="no-such-limit",
    )
    state = fresh(return_state=True)
    assert state.is_failed()
    with pytest.raises(StepFailedError, match="no-such-limit"):
        state.result()


def test_entry_flow_is_importable_by_module_path(tmp_path: Path, calls: Path) -> None:
    from marin_prefect.flows import marin_pipeline

    assert marin_pipeline.fn.__module__ == "marin_prefect.flows"
    assert marin_pipeline.fn.__name__ == "marin_pipeline"
    module = importlib.import_module(marin_pipeline.fn.__module__)
    assert getattr(module, marin_pipeline.fn.__name__) is marin_pipeline
    loaded = load_flow_from_entrypoint("marin_prefect.flows:marin_pipeline")
    assert loaded.name == "marin-pipeline"

    state = marin_pipeline(
        target=TOY_TARGET, prefix=str(tmp_path), max_concurrent=2, return_state=True
    )
    assert state.is_completed(), state
    assert state.result()["toy/report@v0"] == f"{tmp_path}/toy/report/v0"
    assert len(calls.read_text().splitlines()) == 7
    assert len(child_flow_runs(flow_run_id(state))) == 1


def test_bad_inputs_get_clear_errors(tmp_path: Path) -> None:
    from marin.execution.errors import TargetError

    with pytest.raises(TargetError, match="no file"):
        to_prefect_flow(f"{tmp_path}/missing.py:pipeline")
    with pytest.raises(TypeError, match="not a step handle"):
        to_prefect_flow([object()])
    with pytest.raises(ValueError, match="max_concurrent"):
        to_prefect_flow(toy.pipeline(), options=RunOptions(max_concurrent=0))
    with pytest.raises(ValueError, match="on_drift"):
        to_prefect_flow(toy.pipeline(), options=RunOptions(on_drift="sometimes"))
    assert to_prefect_flow(toy.pipeline()).name == "marin-toy-report"
    assert to_prefect_flow(TOY_TARGET).name == "marin-prefect_pipelines-pipeline"
    assert "PREFECT_HOME" in os.environ and "marin-prefect-home-" in os.environ["PREFECT_HOME"]
