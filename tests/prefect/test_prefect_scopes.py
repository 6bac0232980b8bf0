"""Issue 48: user scopes on Prefect. ``marin export prefect --scope user`` stores the scope as
the deployment's ``scope`` parameter, the only one its runs take; a run writes under
``<prefix>/users/<user>/`` (the ``user`` parameter, else $MARIN_USER on the worker) and reads
the shared builds, as ``marin run --scope user`` does. Real Prefect (the session's API server),
as in test_prefect_entry_safety.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from marin.cli import main
from marin.execution.lazy import run
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin_prefect.cli import export
from tests import scope_pipeline
from tests.prefect.test_prefect_entry_safety import _deployment, _trigger

pytestmark = pytest.mark.usefixtures("prefect_harness", "calls")

TEAM = f"{Path(__file__).resolve().parents[1] / 'scope_pipeline.py'}:team"
VARIANT = "users/alice/scope/variant/v1"


def _record(prefix: Path, output_path: str) -> dict[str, Any]:
    """A record without what differs between two builds of one step (when, where, ids)."""
    record = read_record(open_prefix(str(prefix)), output_path)
    assert record is not None, output_path
    data = json.loads(record.to_json().replace(str(prefix), "<prefix>"))
    for key in ("provenance", "started_at", "finished_at", "duration_s", "build_id"):
        data.pop(key)
    data["inputs"] = sorted(data["inputs"])  # the ids of the dependency's build differ
    data["output"].pop("digest")  # of an empty folder: names the build
    return dict(data)


def test_the_export_stores_the_scope_as_a_parameter(tmp_path: Path) -> None:
    out = str(tmp_path / "prefect.yaml")
    export(TEAM, output=out, scope="user")
    (entry,) = yaml.safe_load(Path(out).read_text())["deployments"]
    assert entry["parameters"]["scope"] == "user"
    export(TEAM, output=out)  # re-exported in the shared scope: the parameter goes
    (entry,) = yaml.safe_load(Path(out).read_text())["deployments"]
    assert "scope" not in entry["parameters"]


def test_a_user_scope_run_reuses_shared_builds_like_marin_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow, local = tmp_path / "flow", tmp_path / "local"
    base_ids = [run(scope_pipeline.base, prefix=str(p))[0].record.build_id for p in (flow, local)]  # type: ignore[union-attr]
    monkeypatch.setenv("MARIN_USER", "bob")  # the worker's user: the run's parameter wins
    deployment = _deployment({"target": TEAM, "prefix": str(flow), "scope": "user"})
    state = _trigger(deployment, parameters={"user": "alice"})
    assert state.is_completed(), state
    assert state.result()["scope/variant@v1"] == f"{flow}/{VARIANT}"

    monkeypatch.setenv("MARIN_USER", "alice")
    assert main(["run", TEAM, "--prefix", str(local), "--scope", "user", "--no-progress"]) == 0
    assert _record(flow, VARIANT) == _record(local, VARIANT)
    location = open_prefix(str(flow))
    assert read_record(location, VARIANT).result == f"{flow}/scope/base/v1:1"  # type: ignore[union-attr]
    assert read_record(location, "scope/base/v1").build_id == base_ids[0]  # type: ignore[union-attr]
    assert not (flow / "scope" / "variant").exists() and not (flow / "users" / "bob").exists()


@pytest.mark.parametrize(
    ("deployed", "hostile", "message"),
    [
        ({}, {"scope": "user"}, "runs in the shared scope only"),
        ({"scope": "user"}, {"scope": "shared"}, "runs in the user scope only"),
        ({"scope": "user"}, {"user": "../x"}, "param user '../x' is not one path segment"),
        ({"scope": "user"}, {"user": "a/b"}, "param user 'a/b' is not one path segment"),
    ],
)
def test_a_trigger_cannot_choose_another_scope_or_a_bad_user(
    tmp_path: Path, deployed: dict[str, Any], hostile: dict[str, Any], message: str
) -> None:
    prefix = tmp_path / "p"
    deployment = _deployment({"target": TEAM, "prefix": str(prefix), **deployed})
    state = _trigger(deployment, parameters=hostile)
    assert state.is_failed(), state
    assert message in str(state.message)
    assert not prefix.exists()  # refused before touching storage


def test_a_user_scope_step_is_placed_by_a_compiled_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``with_options(scope="user")`` is the pipeline's choice: a Prefect run honours it too."""
    from marin_prefect import to_prefect_flow

    monkeypatch.setenv("MARIN_USER", "alice")
    outputs = to_prefect_flow(TEAM.replace(":team", ":pipeline"), prefix=str(tmp_path))()
    assert outputs["scope/variant@v1"] == f"{tmp_path}/{VARIANT}"
    assert not (tmp_path / "scope" / "variant").exists()
