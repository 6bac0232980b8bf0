"""Declared resources on a real Prefect server (the session's test harness): global concurrency
limits ``marin-<kind>`` held only while a step builds, tags, and the task timeout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client

from marin.execution.errors import StepFailedError
from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.resources import parse_capacity, parse_resources
from marin.execution.plan.options import RunOptions
from marin_prefect import to_prefect_flow
from marin_prefect.resources import (
    create_limits,
    limits_commands,
    limits_for_capacity,
    resource_slots,
    task_tags,
)
from tests.conformance.scenarios import read_calls
from tests.prefect.prefect_helpers import flow_run_id, task_runs
from tests.resources import resource_pipelines as rp

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_slots_tags_and_limit_sizes() -> None:
    class Spec:
        step_id = "train@v1"
        resources = parse_resources({"gpu": 2, "memory": "16.5GiB", "cpu": 0.5, "tpu": 4})
        queue = "a100"

    assert resource_slots(Spec) == [
        ("marin-cpu", 1), ("marin-gpu", 2), ("marin-memory-gib", 17), ("marin-tpu", 4),
    ]  # fmt: skip
    assert task_tags(Spec) == ["marin", "gpu", "tpu", "a100"]
    limits = limits_for_capacity(parse_capacity("cpu=16,memory=64GiB,gpu=2"))
    assert limits == [("marin-cpu", 16), ("marin-gpu", 2), ("marin-memory-gib", 64)]
    assert limits_commands(limits)[1] == "prefect gcl create marin-gpu --limit 2"


def test_two_gpu_steps_with_a_limit_of_one_never_overlap(tmp_path: Path) -> None:
    calls = str(tmp_path / "calls.jsonl")
    create_limits([("marin-gpu", 1)])
    steps = [
        apply(f"one-gpu/{i}", rp.wait_for_peers, version="v1", calls=calls, step=f"g{i}",
              peers=1, out_path=OUT).with_options(resources={"gpu": 1}, queue="gpu-queue")
        for i in range(2)
    ]  # fmt: skip
    flow = to_prefect_flow(steps, prefix=str(tmp_path / "p"), resource_limits=True, options=RunOptions(max_concurrent=4))
    state = flow(return_state=True)
    assert state.is_completed(), state
    timeline = rp.gpu_in_use(read_calls(calls), {"g0": 1, "g1": 1})
    assert max(timeline) == 1 and len(timeline) == 4  # both ran, one at a time

    runs = task_runs(flow_run_id(state), expected=2)
    for run in runs.values():
        assert {"marin", "gpu", "gpu-queue"} <= set(run.tags)

    # A built step takes no slot: with the limit at 0 the cached run still completes.
    create_limits([("marin-gpu", 0)])
    again = to_prefect_flow(steps, prefix=str(tmp_path / "p"), resource_limits=True)(
        return_state=True
    )
    assert again.is_completed(), again
    assert len(read_calls(calls)) == 4


def test_resources_beyond_the_limits_never_exceed_them(tmp_path: Path) -> None:
    """Conformance: 4 one-GPU steps and one two-GPU step on marin-gpu=2: the peak is 2."""
    calls = str(tmp_path / "calls.jsonl")
    create_limits([("marin-gpu", 2), ("marin-memory-gib", 64)])
    gpus = {f"e{i}": 1 for i in range(4)} | {"train": 2}
    steps = [
        apply(f"cap/{name}", rp.wait_for_peers, version="v1", calls=calls, step=name,
              peers=2 if n == 1 else 1, out_path=OUT).with_options(
            resources={"gpu": n, "memory": "8GiB"}
        )
        for name, n in gpus.items()
    ]  # fmt: skip
    state = to_prefect_flow(steps, prefix=str(tmp_path / "p"), resource_limits=True, options=RunOptions(max_concurrent=5))(return_state=True)
    assert state.is_completed(), state
    timeline = rp.gpu_in_use(read_calls(calls), gpus)
    assert max(timeline) == 2  # never above the limit, and the limit is reached
    assert timeline[-1] == 0 and len(timeline) == 10


def test_a_missing_limit_is_a_clear_error(tmp_path: Path) -> None:
    step = apply("fpga-step", rp.whoami, version="v1", out_path=OUT).with_options(
        resources={"fpga": 1}
    )
    with get_client(sync_client=True) as client:
        names = {limit.name for limit in client.read_global_concurrency_limits()}
    assert "marin-fpga" not in names
    state = to_prefect_flow(step, prefix=str(tmp_path), resource_limits=True)(return_state=True)
    assert state.is_failed()
    with pytest.raises(StepFailedError, match="prefect gcl create marin-fpga --limit N"):
        state.result()


def test_timeout_becomes_timeout_seconds_and_fails_the_step(tmp_path: Path) -> None:
    pid_file = str(tmp_path / "pid")
    step = apply("hang", rp.hang, version="v1", pid_file=pid_file).with_options(
        timeout=2, isolate=True
    )
    state = to_prefect_flow(step, prefix=str(tmp_path / "p"))(return_state=True)
    assert state.is_failed()
    with pytest.raises(StepFailedError, match="hang@v1"):
        state.result()
    (run,) = task_runs(flow_run_id(state), expected=1).values()
    assert run.state is not None and run.state.is_failed()
    with pytest.raises(ProcessLookupError):  # the isolated process was killed
        os.kill(int(open(pid_file).read()), 0)


def test_export_create_limits_sizes_the_limits_the_pipeline_uses() -> None:
    from marin_prefect.cli import ExportError, resource_limits

    target = f"{ROOT}/tests/resources/resource_pipelines.py:placed"  # cpu, memory, gpu, tpu
    hint = resource_limits(target, None)
    assert "  prefect gcl create marin-tpu --limit <capacity>" in hint
    with pytest.raises(ExportError, match="no capacity for tpu.*,tpu=N"):
        resource_limits(target, "cpu=16,memory=64GiB,gpu=2")
    done = resource_limits(target, "cpu=16,memory=64GiB,gpu=2,tpu=8,unused=3")
    assert any(line.endswith("marin-tpu (limit 8)") for line in done), done
    with get_client(sync_client=True) as client:
        limits = {x.name: x.limit for x in client.read_global_concurrency_limits()}
    assert limits["marin-tpu"] == 8 and limits["marin-memory-gib"] == 64
    assert limits["marin-gpu"] == 2 and "marin-unused" not in limits
