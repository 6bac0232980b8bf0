"""Absurd placement values (issue 43 item 12): a clear error naming the step and the field,
with the maximum, never an ``OverflowError`` or an infinite timeout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marin.execution.errors import InvalidStepError
from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.resources import MAX_TIMEOUT_S, parse_capacity, parse_duration
from tests.resources import resource_pipelines as rp

ROOT = Path(__file__).resolve().parents[2]
NINES = "9" * 400


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"resources": {"memory": NINES + "GiB"}}, "resources.memory='99999"),
        ({"resources": {"memory": 10**400}}, "resources.memory=10000"),
        ({"resources": {"cpu": 10**400}}, "resources.cpu=10000"),
        ({"resources": {"gpu": 10**400}}, "resources.gpu=10000"),
        ({"resources": {"tpu": 1e300}}, "resources.tpu=1e+300"),
        ({"timeout": 10**400}, "timeout=10000"),
        ({"timeout": NINES + "s"}, "timeout='99999"),
        ({"timeout": float("inf")}, "timeout=inf"),
        ({"timeout": "400d"}, "timeout='400d'"),
    ],
)
def test_absurd_values_are_refused_with_the_maximum(options: dict[str, Any], needle: str) -> None:
    step = apply("train", rp.whoami, version="v1", out_path=OUT)
    with pytest.raises(InvalidStepError) as info:
        step.with_options(**options)
    text = str(info.value)
    assert needle in text and "is more than the maximum of" in text
    assert "(step train@v1)" in text and len(text) < 300  # the value is cut short


def test_the_longest_timeout_is_accepted_and_finite() -> None:
    assert parse_duration("365d") == MAX_TIMEOUT_S
    with pytest.raises(InvalidStepError, match="more than the maximum"):
        parse_capacity("gpu=1e400")


@pytest.mark.parametrize("capacity", ["gpu=1e400", f"memory={NINES}GiB", f"cpu={10**400}"])
def test_marin_run_refuses_an_absurd_capacity_as_bad_input(tmp_path: Path, capacity: str) -> None:
    target = f"{ROOT / 'tests' / 'resources' / 'resource_pipelines.py'}:gpu_cap"
    cmd = [sys.executable, "-m", "marin.cli", "run", target, "--prefix", str(tmp_path / "p")]
    result = subprocess.run(
        [*cmd, "--resources", capacity], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("marin run: error: argument --resources:")
    assert "is more than the maximum of" in last
