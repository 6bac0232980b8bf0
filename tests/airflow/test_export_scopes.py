"""Issue 48: user scopes on Airflow. An export with ``--scope user`` carries the scope as the
one value of its ``scope`` param, and a ``user`` param; its runs write under
``<prefix>/users/<user>/`` and read shared builds, through the core functions ``marin run
--scope user`` uses. The runtime is called directly here, as Airflow calls it (no Airflow
needed); ``airflow dags test`` runs an exported DAG end to end (``slow``)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from marin.cli import main
from marin.execution.errors import InvalidStepError
from marin.execution.lazy import lower, run
from marin.execution.pipeline.versions import VersionCodex
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin_airflow import runtime
from marin_airflow.contract import target_reference
from marin_airflow.export import build_export, write_export
from tests import scope_pipeline

# Imported first: a step task records its datasets on Airflow's operator, and a file target in
# tests/ puts that folder (and its `airflow` test package) on sys.path once it is loaded.
pytest.importorskip("airflow.sdk")
ROOT = Path(__file__).resolve().parents[2]
TEAM = f"{ROOT / 'tests' / 'scope_pipeline.py'}:team"
VERSIONED = f"{ROOT / 'tests' / 'test_run_versions.py'}:pipeline"


@pytest.fixture(autouse=True)
def _fresh_runtime_cache() -> Any:
    yield
    runtime.clear_cache()  # the lowering of a pipeline these tests share


def _constants(text: str) -> dict[str, Any]:
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(text).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }  # fmt: skip


def _plan(monkeypatch: pytest.MonkeyPatch, dags: str, params: dict[str, Any], **kw: Any) -> Any:
    """The ``marin-plan`` task of a DAG exported from ``TEAM`` to ``dags``, under ``params``."""
    monkeypatch.setattr(runtime, "_airflow_context", lambda: {"params": params})
    return runtime.plan_steps(target=target_reference(TEAM, dags), dag_dir=dags, **kw)


def test_a_user_scope_export_carries_the_scope_and_a_user_param(tmp_path: Path) -> None:
    dags = str(tmp_path / "dags")
    result = build_export(TEAM, dags, scope="user")
    assert _constants(result.text)["SCOPE"] == "user"
    assert 'COMMON["scope"] = SCOPE' in result.text and "enum=[SCOPE]" in result.text
    assert '"user": Param(' in result.text
    assert result.command.endswith("--scope user")
    assert build_export(TEAM, dags, scope="user").text == result.text  # byte-stable
    shared = build_export(TEAM, dags)
    assert "SCOPE" not in shared.text and '"user"' not in shared.text
    # Same steps, same fingerprints: the scope is not part of a step's identity.
    assert [t.fingerprint for t in shared.tasks] == [t.fingerprint for t in result.tasks]


@pytest.mark.parametrize("scope", ["shared", "USER", ["user"], "../x"], ids=repr)
def test_a_run_of_a_user_export_takes_only_the_user_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scope: Any
) -> None:
    dags, prefix = str(tmp_path / "dags"), tmp_path / "p"
    with pytest.raises(InvalidStepError, match="param scope=.*runs in the user scope only"):
        _plan(monkeypatch, dags, {"scope": scope, "user": "alice"}, scope="user",
              default_prefix=str(prefix))  # fmt: skip
    assert not prefix.exists()


@pytest.mark.parametrize("user", ["a/b", "..", "x y", "../../etc", "é" * 3, ["alice"], 7])
def test_a_bad_user_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: Any
) -> None:
    monkeypatch.setenv("MARIN_USER", "bob")  # a good fallback never hides a bad param
    prefix = tmp_path / "p"
    with pytest.raises(InvalidStepError, match="param user=?.*(not one path segment|string)"):
        _plan(monkeypatch, str(tmp_path), {"user": user}, scope="user", default_prefix=str(prefix))
    assert not prefix.exists()


def test_service_accounts_are_no_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARIN_USER", "nobody")
    monkeypatch.setattr("getpass.getuser", lambda: "airflow")
    with pytest.raises(InvalidStepError, match="has no user.*'user' param"):
        _plan(monkeypatch, str(tmp_path), {"user": "root"}, scope="user",
              default_prefix=str(tmp_path / "p"))  # fmt: skip


def test_a_user_scope_plan_serves_shared_builds_and_places_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = str(tmp_path / "p")
    run(scope_pipeline.base, prefix=prefix)  # the team's shared build
    monkeypatch.setenv("MARIN_USER", "bob")  # the param wins over the worker's user
    plan = _plan(monkeypatch, str(tmp_path), {"user": "alice"}, scope="user",
                 default_prefix=prefix)  # fmt: skip
    assert plan["skip"] == ["scope/base@v1"] and plan["build"] == ["scope/variant@v1"]
    assert plan["user"] == "alice"  # the XCom every step task of the run writes for
    shared = _plan(monkeypatch, str(tmp_path), {}, default_prefix=prefix)
    assert shared["build"] == ["scope/variant@v1"] and "user" not in shared


def test_a_user_scope_step_of_a_shared_export_is_placed_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``with_options(scope="user")`` is the pipeline's choice: every runner honours it (an
    Airflow task used to write such a step's shared path)."""
    monkeypatch.setenv("MARIN_USER", "alice")
    monkeypatch.setattr(runtime, "_airflow_context", lambda: {"params": {}})
    pipeline = TEAM.replace(":team", ":pipeline")
    dags, prefix = str(tmp_path / "dags"), str(tmp_path / "p")
    result = build_export(pipeline, dags, prefix=prefix)
    target = target_reference(pipeline, dags)
    plan = runtime.plan_steps(target=target, dag_dir=dags, default_prefix=prefix)
    assert plan["user"] == "alice" and sorted(plan["build"]) == [t.step_id for t in result.tasks]
    for task in result.tasks:  # dependencies first
        out = runtime.run_step(target=target, step=task.step_id, fingerprint=task.fingerprint,
                               dag_dir=dags, default_prefix=prefix)  # fmt: skip
        assert out["action"] == "built"
    location = open_prefix(prefix)
    assert read_record(location, "users/alice/scope/variant/v1") is not None
    assert read_record(location, "scope/variant/v1") is None


def test_the_user_is_the_param_then_the_triggering_user_then_marin_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from marin_airflow.scopes import run_scope

    monkeypatch.setenv("MARIN_USER", "carol")
    targets = [lower(scope_pipeline.team)]

    def user(params: dict[str, Any], triggered_by: str | None, planned: Any = None) -> Any:
        context = {"params": params, "dag_run": SimpleNamespace(triggering_user_name=triggered_by)}
        return run_scope("user", context, planned).user_for(targets)

    assert user({"user": "alice"}, "bob") == "alice"
    assert user({}, "bob") == "bob"
    assert user({}, "dag_test") == "carol"  # `airflow dags test` names no one
    assert user({}, None) == "carol"  # a scheduled run
    assert user({"user": "alice"}, "bob", planned="dave") == "dave"  # the plan task's, for all
    with pytest.raises(InvalidStepError, match="the triggering user 'a@b.c' is not one path"):
        user({}, "a@b.c")


def test_two_codexes_in_one_worker_do_not_share_the_lowering(tmp_path: Path) -> None:
    """Two DAGs exported from one pipeline with other versions, run by one worker process."""
    planned = []
    for codex in (VersionCodex("v3", {"tok/bpe": "v4"}), VersionCodex("v5", {"tok/bpe": "v6"})):
        dags = str(tmp_path / codex.default)  # type: ignore[operator]
        result = build_export(VERSIONED, dags, versions=codex, prefix=str(tmp_path / "p"))
        versions = _constants(result.text)["VERSIONS"]
        target = target_reference(VERSIONED, dags)
        plan = runtime.plan_steps(target=target, dag_dir=dags, versions=versions,
                                  default_prefix=str(tmp_path / "p"))  # fmt: skip
        planned.append(sorted(plan["build"]))
        task = next(t for t in result.tasks if t.step_id.startswith("tok/bpe@"))
        out = runtime.run_step(target=target, step=task.step_id, fingerprint=task.fingerprint,
                               dag_dir=dags, versions=versions,
                               default_prefix=str(tmp_path / "p"))  # fmt: skip
        assert out["action"] == "built"
    assert planned == [["tok/bpe@v4", "train@v3"], ["tok/bpe@v6", "train@v5"]]
    location = open_prefix(str(tmp_path / "p"))
    assert read_record(location, "tok/bpe/v4") and read_record(location, "tok/bpe/v6")


# --- airflow dags test -------------------------------------------------------------------------


def _normalised(record: dict[str, Any], prefix: Path) -> dict[str, Any]:
    """A record without what differs between two builds of one step (when, where, ids)."""
    for key in ("provenance", "started_at", "finished_at", "duration_s", "build_id"):
        record.pop(key)
    record["inputs"] = sorted(record["inputs"])  # the ids of the dependency's build differ
    record["output"].pop("digest")  # of an empty folder: names the build
    return dict(json.loads(json.dumps(record).replace(str(prefix), "<prefix>")))


def _record(prefix: Path, output_path: str) -> dict[str, Any]:
    with open(prefix / f"{output_path}.marin" / "record.json") as f:
        return dict(json.load(f))


@pytest.mark.slow
def test_a_user_scope_dag_reuses_shared_builds_like_marin_run(
    tmp_path: Path, sandbox: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``airflow dags test`` of a ``--scope user`` export: the shared upstream is served, the
    step is built under users/<user>/ of the run's ``user`` param (not the worker's
    $MARIN_USER), and its record is what ``marin run --scope user`` writes."""
    af, local = tmp_path / "airflow", tmp_path / "local"
    dags = tmp_path / "dags"
    write_export(build_export(TEAM, str(dags), dag_id="scoped", scope="user"))
    base_ids = []
    for prefix in (af, local):
        (artifact,) = run(scope_pipeline.base, prefix=str(prefix))
        base_ids.append(artifact.record.build_id)  # type: ignore[union-attr]
    proc = sandbox.dags_test("scoped", str(dags), conf={"prefix": str(af), "user": "alice"},
                             env={"MARIN_USER": "bob"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    states = sandbox.task_states("scoped")
    assert states == {"marin-plan": "success", "scope.base__v1": "skipped",
                      "scope.variant__v1": "success"}, states  # fmt: skip
    assert sandbox.xcoms("scoped", "user") == {"marin-plan": "alice"}

    monkeypatch.setenv("MARIN_USER", "alice")
    assert main(["run", TEAM, "--prefix", str(local), "--scope", "user", "--no-progress"]) == 0
    mine = "users/alice/scope/variant/v1"
    assert _normalised(_record(af, mine), af) == _normalised(_record(local, mine), local)
    assert _record(af, mine)["result"] == f"{af}/scope/base/v1:1"  # read the shared build
    assert _record(af, "scope/base/v1")["build_id"] == base_ids[0]  # never rebuilt
    assert not (af / "scope" / "variant").exists() and not (af / "users" / "bob").exists()
