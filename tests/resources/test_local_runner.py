"""The local runner with declared capacity: the conformance scenario and the plan-time check.

``StepRunner(resources=...)`` offers ready steps to a ``ResourcePool`` in the scheduler's order
(``Scheduler.get_ready(admit=...)``) and wraps each build in its grant's ``assigned_devices``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from marin.execution.errors import InvalidStepError
from marin.execution.lazy import lower
from marin.execution.pipeline.resources import parse_capacity
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.conformance.scenarios import CALLS_ENV, read_calls
from tests.resources import resource_pipelines as rp

ROOT = Path(__file__).resolve().parents[2]


def test_local_runner_never_exceeds_capacity_and_assigns_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capacity gpu=2 on this CPU-only machine; isolated steps see CUDA_VISIBLE_DEVICES."""
    from marin.execution.plan.options import RunOptions
    from marin.execution.step_runner import StepRunner

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    handles = [h.with_options(isolate=True) for h in rp.gpu_cap()]
    specs = lower(handles)
    runner = StepRunner(RunOptions(max_concurrent=8), prefix=str(tmp_path / "p"), resources=parse_capacity("cpu=2,gpu=2"))
    runner.run(specs)
    timeline = rp.gpu_in_use(read_calls(str(calls)), rp.GPU_CAP)
    assert max(timeline) == 2 and len(timeline) == 10
    location = open_prefix(str(tmp_path / "p"))
    seen = {}
    for spec in specs:
        record = read_record(location, spec.output_path)
        assert record is not None
        seen[spec.name] = record.result["cuda"]
    assert seen["cap/train"] in ("0,1", "1,0")
    assert {seen[f"cap/e{i}"] for i in range(4)} <= {"0", "1"}
    # No device used twice at once, replayed from the steps' own start/end events.
    _, per_device = rp.overlaps(read_calls(str(calls)))
    assert set(per_device) == {"0", "1"} and max(per_device.values()) == 1


def test_a_step_that_can_never_fit_fails_at_plan_time(tmp_path: Path) -> None:
    from marin.execution.step_runner import StepRunner

    specs = lower(rp.gpu_cap())
    runner = StepRunner(prefix=str(tmp_path / "p"), resources=parse_capacity("cpu=2,gpu=1"))
    with pytest.raises(InvalidStepError) as info:
        runner.run(specs)
    message = str(info.value)
    assert "gpu=2 but the machine has 1 (step cap/train@v1)" in message
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").rglob("record.json"))


def test_marin_run_resources_flag_reaches_the_runner(tmp_path: Path) -> None:
    env = {**os.environ, CALLS_ENV: str(tmp_path / "calls.jsonl")}
    target = f"{ROOT / 'tests' / 'resources' / 'resource_pipelines.py'}:gpu_cap"
    cmd = [sys.executable, "-m", "marin.cli", "run", target, "--prefix", str(tmp_path / "p")]
    result = subprocess.run(
        [*cmd, "--resources", "cpu=2,gpu=1"], capture_output=True, text=True, env=env,
        timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode != 0
    assert "gpu=2 but the machine has 1 (step cap/train@v1)" in result.stderr
