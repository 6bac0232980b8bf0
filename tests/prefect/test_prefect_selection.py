"""``marin export prefect --select/--exclude`` (issue 22): the deployment's runs build only the
selection and what it needs; its ``select``/``exclude`` parameters are a trigger's data, checked
before the pipeline is imported, and a pattern matching no step is one clear error.

Real Prefect: the session's test harness stores the deployment and creates the flow runs from it
(as a trigger does); each runs in this process with Prefect's own flow engine, as on a worker.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prefect.prefect_helpers import TOY_TARGET
from tests.prefect.test_prefect_entry_safety import _deployment, _trigger

pytestmark = pytest.mark.usefixtures("prefect_harness", "calls")

STEPS = ("corpus", "tokens", "model-0.1", "model-1.0", "eval-0.1", "eval-1.0", "report")


def marin(*args: str) -> subprocess.CompletedProcess[str]:
    """Through the real `marin` console script and its `marin.exporters` entry point."""
    command = [str(Path(sys.executable).parent / "marin"), *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


def built(prefix: Path) -> set[str]:
    return {s for s in STEPS if (prefix / "toy" / s / "v0.marin" / "record.json").exists()}


def exported_parameters(out: Path, *selection: str) -> dict[str, Any]:
    result = marin("export", "prefect", TOY_TARGET, "-o", str(out), *selection)
    assert result.returncode == 0, result.stderr
    [entry] = yaml.safe_load(out.read_text())["deployments"]
    return dict(entry["parameters"])


def test_the_deployment_builds_only_the_selection(tmp_path: Path, calls: Path) -> None:
    out = tmp_path / "prefect.yaml"
    parameters = exported_parameters(out, "--select", "toy/eval-0.1", "--exclude", "toy/report")
    assert parameters["select"] == ["toy/eval-0.1"] and parameters["exclude"] == ["toy/report"]
    prefix = tmp_path / "p"
    state = _trigger(_deployment({**parameters, "prefix": str(prefix)}))
    assert state.is_completed(), state.message
    assert built(prefix) == {"corpus", "tokens", "model-0.1", "eval-0.1"}
    assert sorted(state.result()) == sorted(  # type: ignore[arg-type]
        f"toy/{s}@v0" for s in ("corpus", "tokens", "model-0.1", "eval-0.1")
    )
    assert "train-1.0" not in calls.read_text() and "report" not in calls.read_text()

    # Re-exporting without a selection removes it: the deployment runs the whole pipeline again.
    assert "select" not in exported_parameters(out)


def test_a_trigger_s_selection_is_checked_before_and_after_import(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    deployment = _deployment({"target": TOY_TARGET, "prefix": str(prefix)})
    empty = _trigger(deployment, parameters={"select": ["toy/corpus", " "]})
    assert empty.is_failed() and "select=['toy/corpus', ' '] has an empty pattern" in str(
        empty.message
    ), empty.message
    typo = _trigger(deployment, parameters={"exclude": ["toy/evl-0.1"]})
    assert typo.is_failed()
    assert "exclude 'toy/evl-0.1' matches no step of this pipeline: did you mean toy/eval-0.1" in (
        str(typo.message)
    ), typo.message
    assert built(prefix) == set()
    # A trigger may narrow the run (it chooses among the pinned target's steps, never code).
    narrowed = _trigger(deployment, parameters={"select": ["toy/tokens"]})
    assert narrowed.is_completed(), narrowed.message
    assert built(prefix) == {"corpus", "tokens"}


@pytest.mark.parametrize(
    ("option", "pattern", "hint"),
    [
        ("--select", "toy/evl-*", "did you mean toy/eval-0.1"),
        ("--exclude", "toy/reprt", "did you mean toy/report?"),
    ],
)
def test_a_pattern_that_matches_nothing_exits_2_and_writes_nothing(
    tmp_path: Path, option: str, pattern: str, hint: str
) -> None:
    out = tmp_path / "prefect.yaml"
    result = marin("export", "prefect", TOY_TARGET, "-o", str(out), option, pattern)
    assert result.returncode == 2, result.stderr
    assert f"error: {option} {pattern!r} matches no step of this pipeline: {hint}" in (
        result.stderr
    )
    assert not out.exists()
