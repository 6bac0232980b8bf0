"""``marin plan --json`` keeps schema 1 (docs/plan-json.md): names, types and meanings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.ux.helpers import EXAMPLE, ROOT, marin

TOP = {"schema": int, "prefix": str, "options": dict, "summary": dict, "steps": list}
SUMMARY = ("total", "built", "run", "drift", "dev", "failed-before")
ACTIONS = ("build", "skip", "prune")
OPTIONS = {"on_drift": str, "force": list, "cascade": bool, "on_code_drift": str}
STEP = {
    "step": str,
    "name": str,
    "version": str,
    "fingerprint": str,
    "stored_fingerprint": (str, type(None)),
    "output_path": str,
    "status": str,
    "reason": str,
    "drift": list,
    "deps": list,
    "action": str,
    "stale": list,
    "lineage": str,
    "build_id": (str, type(None)),
    "artifact": dict,
    "code_drift": list,
    "unless_unchanged": list,
    "unchanged": list,
}
ARTIFACT = ("url", "dataset_namespace", "dataset_name", "asset_uri")
STATUSES = {"built", "run", "drift", "dev", "failed-before"}


def check_schema(data: dict[str, Any]) -> None:
    assert data["schema"] == 1
    for key, kind in TOP.items():
        assert isinstance(data[key], kind), key
    assert set(SUMMARY) <= set(data["summary"])
    assert all(isinstance(data["summary"][k], int) for k in SUMMARY)
    assert sum(data["summary"][k] for k in SUMMARY[1:]) == data["summary"]["total"]
    assert len(data["steps"]) == data["summary"]["total"]
    actions = data["summary"]["actions"]
    assert set(actions) == set(ACTIONS) and sum(actions.values()) == data["summary"]["total"]
    for key, kind in OPTIONS.items():
        assert isinstance(data["options"][key], kind), key
    seen: set[str] = set()
    for step in data["steps"]:
        assert set(STEP) <= set(step), set(STEP) - set(step)
        for key, kind in STEP.items():
            assert isinstance(step[key], kind), (step["step"], key)
        assert step["status"] in STATUSES
        assert step["action"] in ACTIONS
        assert step["lineage"] in ("ok", "stale", "unknown", "none")
        assert (step["lineage"] == "none") == (step["stored_fingerprint"] is None)
        assert step["step"] == f"{step['name']}@{step['version']}"
        assert len(step["fingerprint"]) == 64
        assert step["output_path"].startswith(data["prefix"])
        assert set(step["artifact"]) == set(ARTIFACT)
        assert step["artifact"]["url"] == step["output_path"]
        assert all(dep in seen for dep in step["deps"]), "dependencies come first"
        assert all(isinstance(line, str) for line in step["drift"])
        assert bool(step["drift"]) == (step["status"] == "drift")
        if step["status"] in ("built", "drift"):
            assert step["stored_fingerprint"]
        seen.add(step["step"])


def test_fresh_prefix_schema(tmp_path: Path) -> None:
    result = marin("plan", EXAMPLE, "--prefix", str(tmp_path / "p"), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    check_schema(data)
    assert data["summary"]["run"] == 11
    assert all(s["stored_fingerprint"] is None for s in data["steps"])


def test_drift_schema(built_example: str, drifted_example: str) -> None:
    result = marin("plan", drifted_example, "--prefix", built_example, "--json")
    data = json.loads(result.stdout)
    check_schema(data)
    by_step = {s["step"]: s for s in data["steps"]}
    bigram = by_step["ngram/models/bigram-add-k@v1"]
    assert bigram["status"] == "drift"
    assert bigram["stored_fingerprint"] != bigram["fingerprint"]
    assert bigram["drift"] == ["config.smoothing.k: 0.05 -> 0.5", "deps.ngram/dataset: v1 -> v2"]


def test_exit_code_gates_only_with_the_flag(tmp_path: Path, built_example: str) -> None:
    fresh = str(tmp_path / "p")
    assert marin("plan", EXAMPLE, "--prefix", fresh, "--json").returncode == 0
    assert marin("plan", EXAMPLE, "--prefix", fresh, "--json", "--exit-code").returncode == 1
    assert marin("plan", EXAMPLE, "--prefix", built_example, "--exit-code").returncode == 0


def test_documented_fields_match_the_schema() -> None:
    doc = (ROOT / "docs" / "plan-json.md").read_text()
    for key in [*TOP, *SUMMARY, *STEP, *ACTIONS, *OPTIONS]:
        assert f"`{key}`" in doc, f"docs/plan-json.md does not document {key}"


def test_plan_takes_run_options_and_previews_a_forced_cascade(built_example: str) -> None:
    forced = marin(
        "plan", EXAMPLE, "--prefix", built_example, "--json", "--force", "ngram/models/bigram-add-k"
    )
    assert forced.returncode == 0, forced.stderr
    data = json.loads(forced.stdout)
    check_schema(data)
    assert data["options"]["force"] == ["ngram/models/bigram-add-k@v1"]
    builds = {s["step"]: s["reason"] for s in data["steps"] if s["action"] == "build"}
    assert builds == {
        "ngram/models/bigram-add-k@v1": "forced (--force)",
        # A forced step is never cut off: what read it is rebuilt outright (issue 43).
        "ngram/eval/bigram-add-k@v1": "stale: upstream ngram/models/bigram-add-k@v1 is rebuilt "
        "in this run",
        "ngram/report@v1": "stale: upstream ngram/eval/bigram-add-k@v1 is rebuilt in this run "
        "(rebuilt unless the upstream output is unchanged)",
    }
    no_cascade = marin(
        "plan", EXAMPLE, "--prefix", built_example, "--json",
        "--force", "ngram/models/bigram-add-k", "--no-cascade",
    )  # fmt: skip
    data = json.loads(no_cascade.stdout)
    assert [s["step"] for s in data["steps"] if s["action"] == "build"] == [
        "ngram/models/bigram-add-k@v1"
    ]
    report = next(s for s in data["steps"] if s["step"] == "ngram/eval/bigram-add-k@v1")
    assert report["action"] == "skip" and report["stale"]
    unknown = marin("plan", EXAMPLE, "--prefix", built_example, "--force", "ngram/nope")
    assert unknown.returncode == 2 and "--force names no step" in unknown.stderr


def test_json_into_a_reader_that_stops_early_is_no_traceback(tmp_path: Path) -> None:
    """Red team r7 (minor): ``marin plan --json | head -c 10`` ended in a ``BrokenPipeError``
    traceback; a reader that has read enough is no error of the pipeline's."""
    import subprocess
    import sys

    for command in ("plan", "ls"):
        args = [command, EXAMPLE, "--prefix", str(tmp_path / "p"), "--json"]
        if command == "ls":
            args.remove(EXAMPLE)
        child = subprocess.Popen(
            [sys.executable, "-m", "marin.cli", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        )
        assert child.stdout is not None and child.stderr is not None
        assert child.stdout.read(1) == b"{"
        child.stdout.close()  # the reader stops: the child's next write meets a broken pipe
        err = child.stderr.read().decode()
        assert child.wait(timeout=120) in (0, 141), err
        assert "Traceback" not in err, err
