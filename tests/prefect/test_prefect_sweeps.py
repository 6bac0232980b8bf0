"""A sweep as a compiled Prefect flow (issue 57): each unique step is one task run, built once;
the flow logs the sweep's counts; a second run serves every step."""

from __future__ import annotations

import collections
import logging
from pathlib import Path

import pytest

from marin.execution.plan.options import RunOptions
from marin_prefect import to_prefect_flow
from tests.sweeps import pipelines

pytestmark = pytest.mark.usefixtures("prefect_harness")

ROOT = Path(__file__).resolve().parents[2]
TARGET = f"{ROOT}/tests/sweeps/pipelines.py:points"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _run_flow(prefix: Path) -> list[str]:
    """Run the compiled sweep; the flow run logger's lines."""
    lines = _Lines()
    logger = logging.getLogger("prefect.flow_runs")
    logger.addHandler(lines)
    try:
        state = to_prefect_flow(TARGET, prefix=str(prefix), options=RunOptions(max_concurrent=4))(return_state=True)
    finally:
        logger.removeHandler(lines)
    assert state.is_completed(), state
    return lines.lines


def test_a_sweep_flow_builds_each_unique_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, calls = tmp_path / "prefix", tmp_path / "calls.txt"
    monkeypatch.setenv(pipelines.CALLS_ENV, str(calls))
    logged = _run_flow(prefix)
    assert "marin: sweep of 16 points: 35 unique of 80 requested; 0 reused" in logged
    counted = collections.Counter(calls.read_text().splitlines())
    assert len(counted) == 35 and set(counted.values()) == {1}, counted
    assert len(list(prefix.rglob("record.json"))) == 35

    calls.unlink()
    logged = _run_flow(prefix)
    assert "marin: sweep of 16 points: 35 unique of 80 requested; 35 reused" in logged
    assert not calls.exists()


def test_an_absolute_pin_under_the_prefix_runs_in_a_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = tmp_path / "prefix"
    monkeypatch.setenv(pipelines.PIN_ROOT_ENV, str(prefix))
    target = f"{ROOT}/tests/sweeps/pipelines.py:pinned"
    state = to_prefect_flow(target, prefix=str(prefix))(return_state=True)
    assert state.is_completed(), state
    assert (prefix / "checkpoints/base/data.txt").read_text() == "the quick brown fox"
    assert (prefix / "pin/reader/v1.marin/record.json").is_file()
    other = to_prefect_flow(target, prefix=str(tmp_path / "other"))(return_state=True)
    assert not other.is_completed()  # the pin lies outside that prefix: refused, nothing built
    assert not (tmp_path / "other" / "pin").exists()
