"""Issue 48: a Prefect deployment carries the version codex as its ``versions`` parameter
(data), and a trigger can choose neither another codex nor a user scope. Real Prefect (the
session's API server), as in test_prefect_entry_safety.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from marin.execution.pipeline.versions import VersionCodex
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin_prefect.cli import export
from tests.prefect.test_prefect_entry_safety import _deployment, _trigger

pytestmark = pytest.mark.usefixtures("prefect_harness", "calls")

PIPE = f"{Path(__file__).resolve().parents[1] / 'test_run_versions.py'}:pipeline"
CODEX = VersionCodex("v3", {"tok/bpe": "v4"})
EXPORTED = '{"default":"v3","overrides":{"tok/bpe":"v4"}}'


def test_the_export_stores_the_codex_as_a_parameter(tmp_path: Path) -> None:
    out = str(tmp_path / "prefect.yaml")
    export(PIPE, output=out, versions=CODEX)
    (entry,) = yaml.safe_load(Path(out).read_text())["deployments"]
    assert entry["parameters"]["versions"] == EXPORTED
    export(PIPE, output=out)  # re-exported without a codex: the parameter goes
    (entry,) = yaml.safe_load(Path(out).read_text())["deployments"]
    assert "versions" not in entry["parameters"]


HOSTILE: list[dict[str, Any]] = [
    {"versions": '{"default":"v9","overrides":{}}'},
    {"versions": '{"default":"v3","overrides":{"tok/bpe":"../x"}}'},
    {"versions": "__import__('os')"},
    {"scope": "user"},
    {"scope": "../shared"},
]


def test_a_trigger_can_only_run_the_exported_codex_in_the_shared_scope(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    deployment = _deployment({"target": PIPE, "prefix": str(prefix), "versions": EXPORTED})
    for hostile in HOSTILE:
        state = _trigger(deployment, parameters=hostile)
        assert state.is_failed(), (hostile, state)
        assert not prefix.exists(), hostile  # refused before touching storage
    state = _trigger(deployment)
    assert state.is_completed(), state
    record = read_record(open_prefix(str(prefix)), "tok/bpe/v4")
    assert record is not None and record.provenance["lowered"]["version_from"] == "override"
