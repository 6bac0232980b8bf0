"""Golden output of ``marin plan`` and ``marin graph`` for the example pipeline.

The fingerprints come from a real build of ``examples/ngram.py`` (the ``built_example`` fixture);
the temporary prefix is replaced by ``<prefix>``. Regenerate after an intended change with
``MARIN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/ux``.
"""

from __future__ import annotations

import json

import pytest

from tests.ux.helpers import EXAMPLE, check_golden, marin, normalise


def test_plan_of_a_fresh_prefix(tmp_path) -> None:
    prefix = str(tmp_path / "empty")
    result = marin("plan", EXAMPLE, "--prefix", prefix)
    assert result.returncode == 0, result.stderr
    check_golden("plan_fresh.txt", normalise(result.stdout, prefix, collapse=True))
    assert result.stdout.rstrip().endswith("11 steps: 11 to run; a run would build 11")


def test_plan_after_the_real_run(built_example: str) -> None:
    result = marin("plan", EXAMPLE, "--prefix", built_example)
    assert result.returncode == 0, result.stderr
    check_golden("plan_built.txt", normalise(result.stdout, built_example, collapse=True))
    assert result.stdout.rstrip().endswith("11 steps: 11 built; a run would build 0, skip 11")


def test_plan_explains_drift_and_dependency_bumps(built_example: str, drifted_example: str) -> None:
    result = marin("plan", drifted_example, "--prefix", built_example)
    assert result.returncode == 0, result.stderr
    check_golden("plan_drift.txt", normalise(result.stdout, built_example, collapse=True))
    out = result.stdout
    assert "config.smoothing.k: 0.05 -> 0.5" in out
    assert "deps.ngram/dataset: v1 -> v2" in out
    # Under the default drift policy (warn) the drifted models are served, so the bumped
    # dataset is needed by nothing that runs: pruned, exactly as `marin run` does.
    assert out.rstrip().endswith(
        "11 steps: 6 built, 4 drift, 1 pruned; a run would build 0, skip 10, prune 1"
    )
    # The status never contradicts the action: the pruned dataset is "pruned", not "run".
    row = next(line for line in out.splitlines() if "ngram/dataset@v2" in line)
    assert row.startswith("·  prune   pruned")
    gate = marin("plan", drifted_example, "--prefix", built_example, "--exit-code")
    assert gate.returncode == 1


def test_plan_json_after_the_real_run(built_example: str, drifted_example: str) -> None:
    result = marin("plan", drifted_example, "--prefix", built_example, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    check_golden(
        "plan_drift.json",
        normalise(json.dumps(data, indent=2, ensure_ascii=False) + "\n", built_example),
    )


@pytest.mark.parametrize("fmt", ["mermaid", "dot", "text"])
def test_graph_golden(fmt: str) -> None:
    result = marin("graph", EXAMPLE, "--format", fmt)
    assert result.returncode == 0, result.stderr
    check_golden(f"graph.{fmt}.txt", result.stdout)


@pytest.mark.parametrize("fmt", ["mermaid", "dot", "text"])
def test_graph_golden_with_status(fmt: str, built_example: str, drifted_example: str) -> None:
    result = marin("graph", drifted_example, "--format", fmt, "--prefix", built_example)
    assert result.returncode == 0, result.stderr
    check_golden(f"graph_status.{fmt}.txt", normalise(result.stdout, built_example))


def test_plan_shows_failed_before_and_dev(tmp_path) -> None:
    from tests.ux.helpers import PIPELINES

    prefix = str(tmp_path / "p")
    marin("run", f"{PIPELINES}:failing", "--prefix", prefix, env={"MARIN_TEST_SLEEP": "0"})
    out = marin("plan", f"{PIPELINES}:failing", "--prefix", prefix).stdout
    row = next(line for line in out.splitlines() if "demo/bad@v1" in line)
    assert row.startswith("✗  build   failed-before")
    assert "previous failure: RuntimeError: kaboom: the model diverged" in row
    assert out.rstrip().endswith("3 steps: 2 built, 1 failed-before; a run would build 1, skip 2")
    dev = marin("plan", f"{PIPELINES}:dev_step", "--prefix", prefix).stdout
    assert "↻  build   dev" in dev and "is mutable: rebuilds every run" in dev
