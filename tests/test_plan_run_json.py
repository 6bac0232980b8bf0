"""``marin plan --json`` and ``marin run --json`` with the same options agree step by step.

Plan ``build`` <-> run ``built``, ``skip`` <-> ``skipped``, ``prune`` <-> ``pruned``, on store states
set up as in the conformance cases; and the steps whose ``fn`` ran (the call log) are exactly the
plan's builds. Both commands run as a user runs them, in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conformance.plan_cases import TARGET, Case, chain_deps, set_up_store, step_name
from tests.conformance.random_graph import GRAPH_ENV
from tests.conformance.scenarios import CALLS_ENV, read_calls

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK = {"a": [], "b": ["a"], "c": ["b"], "d": ["c"], "e": ["a"]}
CHAIN = chain_deps(["a", "b", "c"])
RUN_WORD = {"build": "built", "skip": "skipped", "prune": "pruned"}


def marin(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": ROOT, **env},
    )  # fmt: skip


def states(deps: dict[str, list[str]], **overrides: str) -> dict[str, str]:
    return {n: overrides.get(n, "built") for n in deps}


CASES = {
    "force-previews-cascade": (
        Case(FORK, ["d", "e"], states(FORK), force=["b"]),
        ["--force", "graph/b"],
        {"b", "c", "d"},
    ),
    "force-no-cascade": (
        Case(FORK, ["d", "e"], states(FORK), force=["b"], cascade=False),
        ["--force", "graph/b", "--no-cascade"],
        {"b"},
    ),
    "drift-rebuild": (
        Case(CHAIN, ["c"], states(CHAIN, b="drifted"), on_drift="rebuild"),
        ["--on-drift", "rebuild"],
        {"b", "c"},
    ),
    "drift-warn-missing-corrupt": (
        Case(FORK, ["d", "e"], states(FORK, a="drifted", b="missing", e="corrupt")),
        ["--on-drift", "warn"],
        {"e"},
    ),
    "stale-failed-old": (
        Case(FORK, ["d", "e"], states(FORK, c="stale", d="old", e="failed")),
        [],
        {"c", "d", "e"},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_json_and_run_json_agree(name: str, tmp_path: Any) -> None:
    case, options, expected = CASES[name]
    prefix = str(tmp_path / "prefix")
    os.makedirs(prefix)
    set_up_store(case, prefix, str(tmp_path / "setup-calls.jsonl"))
    calls = str(tmp_path / "calls.jsonl")
    env = {GRAPH_ENV: json.dumps(case.description()), CALLS_ENV: calls}
    common = [TARGET, "--prefix", prefix, "--json", *options]

    plan_proc = marin("plan", *common, env=env)
    assert plan_proc.returncode == 0, plan_proc.stderr
    plan = {step_name(s["step"]): s["action"] for s in json.loads(plan_proc.stdout)["steps"]}
    assert {n for n, a in plan.items() if a == "build"} == expected, plan
    assert read_calls(calls) == [], "marin plan ran a step"

    run_proc = marin("run", *common, env=env)
    assert run_proc.returncode == 0, run_proc.stderr
    report = json.loads(run_proc.stdout)
    run = {step_name(s["step"]): s["action"] for s in report["steps"]}
    assert run == {n: RUN_WORD[a] for n, a in plan.items()}
    ran = sorted(c["step"] for c in read_calls(calls) if c["event"] == "start")
    assert ran == sorted(expected)
    assert report["options"]["force"] == [f"graph/{n}@v1" for n in case.force]
    assert report["options"]["cascade"] == case.cascade


def test_drift_under_error_fails_plan_gate_and_run_alike(tmp_path: Any) -> None:
    case = Case(CHAIN, ["c"], states(CHAIN, b="drifted"), on_drift="error")
    prefix = str(tmp_path / "prefix")
    os.makedirs(prefix)
    set_up_store(case, prefix, str(tmp_path / "setup-calls.jsonl"))
    calls = str(tmp_path / "calls.jsonl")
    env = {GRAPH_ENV: json.dumps(case.description()), CALLS_ENV: calls}
    common = [TARGET, "--prefix", prefix, "--json", "--on-drift", "error"]
    plan_proc = marin("plan", *common, env=env)
    run_proc = marin("run", *common, env=env)
    assert run_proc.returncode == 1, run_proc.stderr
    assert "graph/b@v1" in run_proc.stdout + run_proc.stderr
    assert "value" in run_proc.stdout + run_proc.stderr
    assert plan_proc.returncode != 0, plan_proc.stdout
    assert "graph/b@v1" in plan_proc.stdout + plan_proc.stderr
    assert read_calls(calls) == [], "a step ran despite drift under --on-drift error"
