"""Issue 48: an exported DAG carries its version codex and scope as run params, as data, and
a trigger may set them only to what the export allows. No Airflow needed: the runtime's
functions are called directly, as Airflow would, and the file is parsed as Python."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from marin.execution.errors import InvalidStepError
from marin.execution.pipeline.versions import VersionCodex
from marin_airflow import runtime
from marin_airflow.contract import resolve_target, target_reference
from marin_airflow.export import build_export

PIPE = f"{Path(__file__).resolve().parents[1] / 'test_run_versions.py'}:pipeline"
CODEX = VersionCodex("v3", {"tok/bpe": "v4"})
EXPORTED = '{"default":"v3","overrides":{"tok/bpe":"v4"}}'


def test_the_codex_is_embedded_as_data_and_the_file_is_byte_stable(tmp_path: Path) -> None:
    dags = str(tmp_path / "dags")
    first = build_export(PIPE, dags, versions=CODEX)
    again = build_export(PIPE, dags, versions=VersionCodex("v3", {"tok/bpe": "v4"}))
    assert first.text == again.text
    assert {t.step_id for t in first.tasks} == {"tok/bpe@v4", "train@v3"}
    tree = ast.parse(first.text)
    consts = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }  # fmt: skip
    assert json.loads(consts["VERSIONS"]) == CODEX.as_data()
    assert "enum=[VERSIONS]" in first.text and 'enum=["shared"]' in first.text
    assert "--version v3 --override tok/bpe=v4" in first.command
    plain = build_export(f"{Path(__file__).parent / 'airflow_pipelines.py'}:toy", dags)
    assert "VERSIONS" not in plain.text and '"scope"' not in plain.text  # old files unchanged


def test_an_export_refuses_an_unused_override_and_an_unknown_scope(tmp_path: Path) -> None:
    with pytest.raises(InvalidStepError, match="did you mean tok/bpe"):
        build_export(PIPE, str(tmp_path), versions=VersionCodex("v3", {"tok/bp": "v4"}))
    with pytest.raises(InvalidStepError, match="use one of shared, user"):
        build_export(PIPE, str(tmp_path), versions=CODEX, scope="team")


HOSTILE: list[Any] = [
    '{"default":"v9","overrides":{}}',
    '{"default":"v3","overrides":{"tok/bpe":"../../x"}}',
    "__import__('os').system('true')",
    {"default": "v3"},
    ["v3"],
    "x" * 100_000,
]


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:20])
def test_a_trigger_can_only_choose_the_exported_codex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: Any
) -> None:
    dags = str(tmp_path / "dags")
    result = build_export(PIPE, dags, versions=CODEX, prefix=str(tmp_path / "p"))
    monkeypatch.setattr(runtime, "_airflow_context", lambda: {"params": {"versions": value}})
    target = target_reference(PIPE, dags)
    with pytest.raises(InvalidStepError, match="not the codex this was exported with") as caught:
        runtime.plan_steps(target=target, dag_dir=dags, versions=EXPORTED)
    assert len(str(caught.value)) < 2000
    task = result.tasks[0]
    with pytest.raises(InvalidStepError, match="not the codex"):
        runtime.run_step(
            target=target, step=task.step_id, fingerprint=task.fingerprint, dag_dir=dags,
            versions=EXPORTED,
        )  # fmt: skip
    assert not (tmp_path / "p").exists()
    runtime.clear_cache()


@pytest.mark.parametrize("scope", ["user", "USER", ["user"], "../x"], ids=repr)
def test_a_trigger_cannot_choose_a_user_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scope: Any
) -> None:
    monkeypatch.setattr(runtime, "_airflow_context", lambda: {"params": {"scope": scope}})
    with pytest.raises(InvalidStepError, match="param scope="):
        runtime.plan_steps(target=target_reference(PIPE, str(tmp_path)), dag_dir=str(tmp_path))


def test_the_plan_task_plans_the_exported_versions(tmp_path: Path, monkeypatch) -> None:
    dags = str(tmp_path / "dags")
    prefix = str(tmp_path / "p")
    result = build_export(PIPE, dags, versions=CODEX, prefix=prefix)
    params = {"versions": EXPORTED, "scope": "shared"}
    monkeypatch.setattr(runtime, "_airflow_context", lambda: {"params": params})
    target = target_reference(PIPE, dags)
    kwargs = {"target": target, "dag_dir": dags, "versions": EXPORTED, "default_prefix": prefix}
    plan = runtime.plan_steps(**kwargs)
    assert sorted(plan["build"]) == ["tok/bpe@v4", "train@v3"]
    # A step task finds its step under the exported versions (no Airflow needed for this).
    spec = runtime.step_for(resolve_target(target, dags), "tok/bpe@v4")
    assert spec is not None and spec.fingerprint == result.tasks[0].fingerprint
    runtime.clear_cache()
