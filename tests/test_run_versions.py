"""Issue 48.1: run-wide versions (Marin's ``VersionCodex``): deferred versions, overrides."""

from __future__ import annotations

import json

import pytest

from marin.cli import main
from marin.execution.errors import InvalidStepError
from marin.execution.lazy import DEFER, ArtifactStep, VersionCodex, apply, build_context, lower, run
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record


def tokens(n: int) -> dict[str, int]:
    return {"n": n}


def train(tok: str) -> str:
    return tok


def pipeline() -> ArtifactStep:
    tok = apply("tok/bpe", tokens, version=DEFER, n=3)
    return apply("train", train, version=DEFER, tok=tok)


def test_the_codex_gives_deferred_versions_and_an_override_wins() -> None:
    spec = lower(pipeline(), versions=VersionCodex("v3", {"tok/bpe": "v4"}))
    assert spec.step_id == "train@v3"
    assert spec.deps[0].step_id == "tok/bpe@v4"
    assert spec.deps[0].provenance["version_from"] == "override"
    assert spec.provenance["versions"] == {"default": "v3", "overrides": {"tok/bpe": "v4"}}
    with build_context(VersionCodex("v5")):
        assert lower(pipeline()).step_id == "train@v5"


def test_a_fixed_version_wins_and_the_version_is_identity() -> None:
    fixed = apply("train", train, version="v1", tok="x")
    assert lower(fixed, versions=VersionCodex("v9")).step_id == "train@v1"
    a = lower(pipeline(), versions=VersionCodex("v3"))
    b = lower(pipeline(), versions=VersionCodex("v4"))
    assert a.fingerprint != b.fingerprint


def test_no_silent_dev_a_deferred_version_without_a_codex_is_an_error() -> None:
    with pytest.raises(InvalidStepError, match=r"tok/bpe defers its version.*--version"):
        lower(pipeline())
    with pytest.raises(InvalidStepError, match="train defers"):
        lower(pipeline(), versions=VersionCodex(overrides={"tok/bpe": "v4"}))


def test_an_unused_override_is_refused_with_did_you_mean() -> None:
    with pytest.raises(InvalidStepError, match="did you mean tok/bpe"):
        lower(pipeline(), versions=VersionCodex("v3", {"tok/bp": "v4"}))
    fixed = apply("train", train, version="v1", tok="x")
    with pytest.raises(InvalidStepError, match="names no step that defers"):
        lower(fixed, versions=VersionCodex("v3", {"train": "v4"}))


def test_bad_versions_fail_when_the_codex_is_made() -> None:
    with pytest.raises(InvalidStepError):
        VersionCodex("../x")
    with pytest.raises(InvalidStepError):
        VersionCodex("v1", {"tok": "a/../b"})
    with pytest.raises(InvalidStepError):
        VersionCodex.from_data({"default": "v1", "code": "import os"})


def test_run_records_the_codex_in_provenance(tmp_path) -> None:
    (artifact,) = run(
        pipeline(), prefix=str(tmp_path), versions=VersionCodex("v3", {"tok/bpe": "v4"})
    )
    record = read_record(open_prefix(str(tmp_path)), "tok/bpe/v4")
    assert record is not None
    lowered = record.provenance["lowered"]
    assert lowered["version_from"] == "override"
    assert lowered["versions"]["overrides"] == {"tok/bpe": "v4"}
    assert artifact.spec.step_id == "train@v3"


def test_cli_version_and_override_reach_the_plan(tmp_path, capsys, monkeypatch) -> None:
    mod = tmp_path / "pipe48.py"
    mod.write_text(
        "from tests.test_run_versions import pipeline\npipe = pipeline()\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    prefix = str(tmp_path / "out")
    args = ["plan", f"{mod}:pipe", "--prefix", prefix, "--json"]
    assert main([*args, "--version", "v3", "--override", "tok/bpe=v4"]) == 0
    steps = {s["step"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    assert set(steps) == {"tok/bpe@v4", "train@v3"}
    assert steps["tok/bpe@v4"]["version_from"] == "override"
    assert main([*args[:-1], "--version", "v3", "--override", "tok/bpe=v4"]) == 0
    assert "versions: default v3; override tok/bpe=v4" in capsys.readouterr().out
    assert main([*args, "--version", "v3", "--override", "tok/bp=v4"]) == 2
    assert "did you mean tok/bpe" in capsys.readouterr().err
    assert main(args) == 2
    assert "defers its version" in capsys.readouterr().err


def test_version_none_is_the_spelling_the_docs_and_errors_use(tmp_path) -> None:
    """Issue 55: the README's ``apply(..., version=None)`` defers (Marin's spelling; ``DEFER``
    is the same), a forgotten ``version=`` is still refused at once, and every message says
    ``version=None``."""
    from tests.ux.helpers import marin

    pipe = tmp_path / "deferred.py"
    pipe.write_text(
        "from marin.execution.lazy import OUT, apply\n"
        "def tokens(n, out_path):\n    return n\n"
        "tok = apply('tok/bpe', tokens, version=None, n=3, out_path=OUT)\n"
    )
    prefix = str(tmp_path / "p")
    built = marin("run", f"{pipe}:tok", "--prefix", prefix, "--version", "v3", "--no-progress")
    assert built.returncode == 0, built.stderr
    assert read_record(open_prefix(prefix), "tok/bpe/v3") is not None
    refused = marin("run", f"{pipe}:tok", "--prefix", prefix)
    assert refused.returncode == 2
    assert "tok/bpe defers its version (version=None) and the run gives none" in refused.stderr
    assert "--version v1" in refused.stderr
    assert lower(apply("t", train, version=None, tok="x"), versions=VersionCodex("v2")).version == (
        lower(apply("t", train, version=DEFER, tok="x"), versions=VersionCodex("v2")).version
    )
    with pytest.raises(InvalidStepError, match="needs version=") as info:
        apply("tok/bpe", tokens, n=3)
    assert "version=None to take it from the run" in info.value.fix
    help_text = marin("run", "--help").stdout
    assert "(version=None)" in help_text and "DEFER" not in help_text


def test_a_record_of_another_inputs_version_names_it_not_an_older_marin(
    tmp_path, capsys, monkeypatch
) -> None:
    """Red team r34-3: a record that read ``tok/bpe@v4`` was said to be "written before build
    ids" when planned against ``tok/bpe@v3``: it names the builds it read instead."""
    mod = tmp_path / "pipe_r34.py"
    mod.write_text(
        "from tests.test_run_versions import pipeline\npipe = pipeline()\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    common = [f"{mod}:pipe", "--prefix", str(tmp_path / "out"), "--version", "v3"]
    assert main(["run", *common, "--no-progress"]) == 0
    moved = ["--override", "tok/bpe=v4", "--force", "tok/bpe", "--on-drift", "rebuild"]
    assert main(["run", *common, *moved, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["plan", *common, "--json"]) == 0
    steps = {s["step"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    reason = steps["train@v3"]["reason"]
    assert steps["train@v3"]["lineage"] == "unknown", steps["train@v3"]
    assert "written before build ids" not in reason, reason
    assert "lineage unknown (the record names the builds of tok/bpe@v4" in reason, reason
