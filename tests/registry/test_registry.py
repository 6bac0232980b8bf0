"""The registry of released artifacts (issue 57): ``marin register``, ``Artifact.from_id`` with
one read, append-only manifests, and ``marin gc`` keeping what is registered whatever its
targets. Real file systems (local disk and ``memory://``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import marin.execution.store.location as location_module
from marin.cli import main
from marin.execution.lazy import JsonArtifact, run
from marin.execution.pipeline.artifact import Artifact
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.registry import (
    REGISTRY_FOLDER,
    ArtifactAlreadyExistsError,
    ArtifactNotFoundError,
    ArtifactRegistryError,
    InvalidArtifactIdError,
    RegisteredBuildGoneError,
    RegistryId,
    register,
)
from marin.gc import collect_garbage
from tests.gc.pipelines import pipeline, scratch, step


class Built(JsonArtifact):
    text: str


def _plant(location: Any, relative: str, data: bytes) -> None:
    """A file written under the prefix by someone else (storage is untrusted)."""
    path = location.path(relative)
    location.fs.makedirs(path.rpartition("/")[0], exist_ok=True)
    location.put_file(path, data)


def test_register_then_from_id_with_two_reads(prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    artifacts = run(scratch(), prefix=prefix)  # raw -> scratch
    location = open_prefix(prefix)
    manifest = register(location, "gc/scratch/v1", RegistryId.parse("exp/scratch/v1"), "me@h")
    assert manifest.build_id == artifacts[0].record.build_id

    reads: list[str] = []
    original = location_module.Location.read_file

    def counted(self: Any, path: str) -> bytes:
        reads.append(path)
        return original(self, path)

    monkeypatch.setattr(location_module.Location, "read_file", counted)
    found = Artifact.from_id("exp/scratch/v1", prefix=prefix)
    # The manifest, then the step's record (still the registered build: finding 6).
    assert len(reads) == 2 and reads[0].endswith(f"{REGISTRY_FOLDER}/exp/scratch/v1.json")
    assert reads[1].endswith("gc/scratch/v1.marin/record.json")
    assert found.url == f"{prefix.rstrip('/')}/gc/scratch/v1"
    assert found.record is not None and found.record.build_id == manifest.build_id
    assert found.result == {"text": "scratch"} and found.spec is None
    typed = Artifact.from_id("exp/scratch", "v1", Built, prefix=prefix)  # Marin's arguments
    assert isinstance(typed, Built) and typed.text == "scratch" and typed.path == found.url
    assert len(reads) == 4


def test_a_second_registration_of_an_id_is_refused_and_never_written(prefix: str) -> None:
    run(pipeline(), prefix=prefix)
    location = open_prefix(prefix)
    reg_id = RegistryId.parse("exp/train/v1")
    first = register(location, "gc/train/v1", reg_id, "alice@h")
    path = location.path(reg_id.manifest_path)
    before = location.read_file(path)
    with pytest.raises(ArtifactAlreadyExistsError, match="exp/train/v1 is registered already") as info:
        register(location, "gc/raw/v1", reg_id, "bob@h")
    assert info.value.existing is not None and info.value.existing.token == first.token
    assert "new tag" in info.value.fix
    assert location.read_file(path) == before


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("exp/train", "not 3 segments"),
        ("exp/train/v1/x", "not 3 segments"),
        ("exp/../v1", "segment '..'"),
        ("exp/tr ain/v1", "segment 'tr ain'"),
        ("exp/train/v1.", "segment 'v1.'"),
        ("exp/train/v1.marin", "not 3 segments"),
        ("gs://b/x", "segment 'gs:'"),
    ],
)
def test_a_bad_id_is_refused_before_any_io(given: str, message: str) -> None:
    with pytest.raises(InvalidArtifactIdError, match=message) as info:
        RegistryId.parse(given)
    assert "namespace/name/tag" in info.value.fix


def test_from_id_of_an_unknown_or_untrusted_manifest_is_a_clear_error(prefix: str) -> None:
    run(scratch(), prefix=prefix)
    location = open_prefix(prefix)
    with pytest.raises(ArtifactNotFoundError, match="exp/none/v1 is not registered under"):
        Artifact.from_id("exp/none/v1", prefix=prefix)
    manifest = register(location, "gc/raw/v1", RegistryId.parse("exp/raw/v1"), "me@h")
    # A planted copy under another id, and one whose record was edited to point elsewhere.
    data = json.loads(manifest.to_bytes())
    _plant(location, f"{REGISTRY_FOLDER}/exp/copy/v1.json", manifest.to_bytes())
    data["id"], data["output_path"] = "exp/moved/v1", "gc/scratch/v1"
    _plant(location, f"{REGISTRY_FOLDER}/exp/moved/v1.json", json.dumps(data).encode())
    for bad, why in (("exp/copy/v1", "manifest of 'exp/raw/v1'"), ("exp/moved/v1", "not the record")):
        with pytest.raises(ArtifactRegistryError, match=why):
            Artifact.from_id(bad, prefix=prefix)


def test_marin_register_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = str(tmp_path / "p")
    run(pipeline(), prefix=prefix)
    assert main(["register", "gc/train@v1", "--id", "models/train/v1", "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert out.startswith("registered models/train/v1: gc/train@v1 (build ")
    assert f"data at {prefix}/gc/train/v1" in out
    again = ["register", "gc/tok@v1", "--id", "models/train/v1", "--prefix", prefix]
    assert main(again) == 1
    assert "models/train/v1 is registered already (to gc/train@v1" in capsys.readouterr().err
    assert main(["register", "gc/none@v1", "--id", "models/none/v1", "--prefix", prefix]) == 2
    assert "nothing is built at" in capsys.readouterr().err
    assert main(["register", "gc/tok@v1", "--id", "bad", "--prefix", prefix]) == 2
    assert main(["register", "gc/tok", "--id", "m/tok/v1", "--prefix", prefix, "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    assert fields["step"] == "gc/tok@v1" and fields["url"] == f"{prefix}/gc/tok/v1"
    assert main(["ls", "--prefix", prefix]) == 0
    listed = capsys.readouterr().out
    assert "3 artifact(s)" in listed and "registry" not in listed  # the registry is no step


def test_from_id_of_a_registered_build_rebuilt_in_place_or_deleted_is_refused(
    prefix: str, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 6: after ``--force`` rebuilt a registered build in place, ``from_id`` returned
    the registered record (its build id, its result) with a path holding the new build's bytes.
    A registered id never serves another build's data: it names what happened instead."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    target = "tests/gc/pipelines.py:scratch"
    assert main(["run", target, "--prefix", prefix, "--no-progress"]) == 0
    assert main(["register", "gc/scratch@v1", "--id", "exp/scratch/r1", "--prefix", prefix]) == 0
    registered = Artifact.from_id("exp/scratch/r1", prefix=prefix).record.build_id
    argv = ["run", target, "--prefix", prefix, "--force", "gc/scratch", "--no-progress"]
    assert main(argv) == 0
    rebuilt = read_record(open_prefix(prefix), "gc/scratch/v1")
    assert rebuilt is not None and rebuilt.build_id != registered
    with pytest.raises(RegisteredBuildGoneError) as gone:
        Artifact.from_id("exp/scratch/r1", prefix=prefix)
    assert f"build {registered}, which is gone" in gone.value.what
    assert f"now holds build {rebuilt.build_id} (rebuilt in place" in gone.value.what
    with pytest.raises(RegisteredBuildGoneError):  # typed too
        Artifact.from_id("exp/scratch/r1", None, Built, prefix=prefix)
    # The current build, registered under a new tag, is served.
    assert main(["register", "gc/scratch@v1", "--id", "exp/scratch/r2", "--prefix", prefix]) == 0
    found = Artifact.from_id("exp/scratch/r2", prefix=prefix)
    assert found.record is not None and found.record.build_id == rebuilt.build_id
    # Deleted (by hand, or by a gc): said so, never a path to nothing.
    open_prefix(prefix).remove_tree(open_prefix(prefix).path("gc/scratch/v1.marin"))
    with pytest.raises(RegisteredBuildGoneError, match="nothing is built at .* any more"):
        Artifact.from_id("exp/scratch/r2", prefix=prefix)


# --- gc keeps what is registered, whatever its targets ------------------------------------------


def test_a_registered_build_rebuilt_in_place_is_said_gone_and_its_inputs_kept(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(pipeline(), prefix=prefix)  # raw -> tok -> train
    location = open_prefix(prefix)
    register(location, "gc/train/v1", RegistryId.parse("models/train/v1"), "me@h")
    tok_v1 = read_record(location, "gc/tok/v1")
    monkeypatch.setenv("MARIN_TEST_GC_TOK", "v2")  # the pipeline moved on: train drifts
    run(pipeline(), prefix=prefix, on_drift="rebuild")  # rebuilt in place, over the release
    report = collect_garbage(pipeline(), location)
    assert any("models/train/v1 names gc/train@v1 build" in n for n in report.gone)
    kept = {k.step: k.why for k in report.kept}
    assert kept["gc/tok@v1"] == "models/train/v1 was made from it"  # its exact input build
    assert read_record(location, "gc/tok/v1") == tok_v1


def test_gc_keeps_a_registered_build_the_targets_no_longer_need(prefix: str) -> None:
    run(pipeline(), prefix=prefix)
    run(scratch(), prefix=prefix)
    location = open_prefix(prefix)
    register(location, "gc/scratch/v1", RegistryId.parse("exp/scratch/v1"), "me@h")
    from tests.gc.pipelines import other

    report = collect_garbage(other(), location)  # keeps only `other`, which is not built
    assert report.ok
    collected = {c.step for c in report.collected}
    assert collected == {"gc/train@v1", "gc/tok@v1"}
    kept = {k.step: k.why for k in report.kept}
    assert kept["gc/scratch@v1"] == "registered as exp/scratch/v1"
    assert kept["gc/raw@v1"] == "gc/scratch@v1 was built from it"
    assert [(x.step, x.why) for x in report.registry] == [
        ("gc/scratch@v1", "registered as exp/scratch/v1")
    ]
    assert report.to_json()["registry"] == [
        {"step": "gc/scratch@v1", "path": "gc/scratch/v1", "why": "registered as exp/scratch/v1"}
    ]
    assert report.not_marins == []  # the registry folder is Marin's own
    assert Artifact.from_id("exp/scratch/v1", prefix=prefix).record is not None
    from marin.gc.report import render

    assert "kept for the registry: gc/scratch@v1 (registered as exp/scratch/v1)" in render(report)


def test_a_build_registered_while_gc_runs_is_not_deleted_by_that_gc(prefix: str) -> None:
    """Finding 13: gc read the registry once, at its start; a build registered while it ran
    (``marin register`` succeeded) was then deleted, and ``from_id`` returned a path to
    nothing. gc reads the registry again under each step's lease before deleting it."""
    run(pipeline(), prefix=prefix)  # raw -> tok -> train, none kept by `other`
    location = open_prefix(prefix)
    paths = {"gc/raw/v1": "gc/raw@v1", "gc/tok/v1": "gc/tok@v1", "gc/train/v1": "gc/train@v1"}
    registered: list[str] = []

    def register_one_left(item: Any, done: int, total: int) -> None:
        if registered:
            return
        left = next(p for p in sorted(paths) if read_record(location, p) is not None)
        argv = ["register", paths[left], "--id", "rel/mid/gc", "--prefix", prefix]
        assert main(argv) == 0  # the registration succeeds while gc runs
        registered.append(left)

    from tests.gc.pipelines import other

    report = collect_garbage(other(), location, on_deleted=register_one_left)
    assert len(registered) == 1 and len(report.collected) == 2
    (skipped,) = report.skipped
    assert (skipped.path, skipped.why) == (registered[0], "registered as rel/mid/gc while gc ran")
    found = Artifact.from_id("rel/mid/gc", prefix=prefix)
    assert found.record is not None
    assert found.record.build_id == read_record(location, registered[0]).build_id  # type: ignore[union-attr]


def test_register_refuses_a_build_whose_lease_is_held(prefix: str) -> None:
    """Finding 13, the other half: a step being built or deleted (gc holds its lease while it
    deletes it) is not registered: the registration would name a build that may vanish."""
    from marin.execution.store.lease import Lease

    run(scratch(), prefix=prefix)
    location = open_prefix(prefix)
    held = Lease(location, "gc/scratch/v1")
    assert held.try_acquire() is None
    try:
        with pytest.raises(ArtifactRegistryError, match="is being built or deleted"):
            register(location, "gc/scratch/v1", RegistryId.parse("exp/scratch/v1"), "me@h")
    finally:
        held.release()
    with pytest.raises(ArtifactNotFoundError):
        Artifact.from_id("exp/scratch/v1", prefix=prefix)  # nothing was written
    register(location, "gc/scratch/v1", RegistryId.parse("exp/scratch/v1"), "me@h")
    assert Artifact.from_id("exp/scratch/v1", prefix=prefix).record is not None


def test_gc_deletes_nothing_when_a_manifest_cannot_be_read(prefix: str) -> None:
    run(scratch(), prefix=prefix)
    location = open_prefix(prefix)
    _plant(location, f"{REGISTRY_FOLDER}/exp/x/v1.json", b"{not json")
    with pytest.raises(ArtifactRegistryError, match="holds what gc cannot read") as info:
        collect_garbage([], location)
    assert "deletes nothing" in info.value.fix
    assert read_record(location, "gc/scratch/v1") is not None


# --- the property: after any gc, every registered id resolves with its lineage -------------------


@st.composite
def histories(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(2, 6))
    deps = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=2))) if i else [] for i in range(n)]
    return {
        "deps": deps,
        "registered": sorted(draw(st.sets(st.integers(0, n - 1), max_size=n))),
        "bumped": sorted(draw(st.sets(st.integers(0, n - 1), max_size=n))),
        "targets": sorted(draw(st.sets(st.integers(0, n - 1), max_size=2))),
        "keep": draw(st.one_of(st.none(), st.integers(0, 1))),
    }


def _graph(deps: list[list[int]], bumped: set[int]) -> list[Any]:
    handles: list[Any] = []
    moved: list[bool] = []
    for i, ds in enumerate(deps):
        moved.append(i in bumped or any(moved[d] for d in ds))
        handles.append(step(f"p{i}", "v2" if moved[i] else "v1", *[handles[d] for d in ds]))
    return handles


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(case=histories())
@example(case={"deps": [[], [0], [1]], "registered": [2], "bumped": [0], "targets": [], "keep": 0})
@example(case={"deps": [[], [0]], "registered": [0, 1], "bumped": [1], "targets": [1], "keep": None})
def test_after_any_gc_every_registered_id_resolves_with_its_lineage(case: dict[str, Any]) -> None:
    prefix = f"memory://reg-{uuid.uuid4().hex[:10]}"
    location = open_prefix(prefix)
    first = _graph(case["deps"], set())
    run(first, prefix=prefix)
    ids = {}
    for i in case["registered"]:
        reg_id = RegistryId.parse(f"exp/p{i}/v1")
        register(location, first[i].lower().output_path, reg_id, "me@h")
        ids[str(reg_id)] = first[i].lower().output_path
    now = _graph(case["deps"], set(case["bumped"]))
    targets = [now[i] for i in case["targets"]]
    run(now, prefix=prefix)
    report = collect_garbage(targets, location, keep_versions=case["keep"])
    assert report.ok, report.failed
    for reg_id, path in ids.items():
        found = Artifact.from_id(reg_id, prefix=prefix)
        stored = read_record(location, path)
        assert stored is not None and stored.build_id == found.record.build_id, reg_id
        todo = [stored]
        while todo:  # every build its record was made from, transitively, by build id
            record = todo.pop()
            for dep, build in record.inputs.items():
                name, _, version = dep.rpartition("@")
                made_from = read_record(location, f"{name}/{version}")
                assert made_from is not None and made_from.build_id == build, (reg_id, dep)
                todo.append(made_from)
    fsspec.filesystem("memory").rm(location.root, recursive=True)
