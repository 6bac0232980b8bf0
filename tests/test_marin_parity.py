"""Marin's lazy API, as a Marin pipeline uses it (issue 21): each test pins one name of it.

The steps are hand-written ``ArtifactStep``s, the way Marin's library steps are written:
``build_config(ctx)`` makes the config and ``run`` receives that config, nothing else.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import pathlib
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin.execution.errors import (
    ConfigError,
    DuplicateStepError,
    FailedBeforeError,
    InvalidStepError,
    StepFailedError,
)
from marin.execution.lazy import (
    OUT,
    ArtifactStep,
    apply,
    lower,
    materialized_config,
    register_fingerprint,
    resolve,
    run,
)
from marin.execution.pipeline import fingerprint as public_fingerprint
from marin.execution.pipeline.artifact import (
    Artifact,
    ArtifactTypeMismatchError,
    FingerprintMismatchError,
)
from marin.execution.pipeline.canonical import _lookup_cache, _registered, to_canonical
from marin.execution.pipeline.context import (
    FingerprintTimeError,
    NoStepContextError,
    StepContext,
    current_context,
)
from marin.execution.step_runner import StepRunner


def _write(path: str, text: str) -> None:
    """Write one file under ``path`` on local disk or ``memory://``."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/data.txt", text.encode())


def _read(path: str) -> str:
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    return bytes(fs.cat_file(f"{root}/data.txt")).decode()


def source_step(name: str = "corpus", version: str = "v1", text: str = "hello") -> ArtifactStep:
    def build_config(ctx: StepContext) -> dict[str, Any]:
        return {"out": ctx.output_path, "text": text}

    def write(config: dict[str, Any]) -> dict[str, Any]:
        _write(config["out"], config["text"])
        return {"chars": len(config["text"])}

    return ArtifactStep(name=name, version=version, run=write, build_config=build_config)


# --- run(build_config(ctx)) -----------------------------------------------------------------


def test_run_receives_the_config_and_reaches_the_context_through_current_context(
    prefix: str,
) -> None:
    corpus = source_step()
    seen: list[Any] = []

    def build_config(ctx: StepContext) -> dict[str, Any]:
        return {"corpus": ctx.artifact_path(corpus), "out": ctx.output_path, "lr": 0.1}

    def train(config: dict[str, Any]) -> str:
        ctx = current_context()
        seen.append((config, ctx.output_path, ctx.devices, ctx.is_fingerprint))
        return _read(config["corpus"])

    model = ArtifactStep(
        name="model", version="v1", run=train, build_config=build_config, deps=(corpus,)
    )
    artifact = resolve(model, prefix=prefix)
    base = prefix.rstrip("/")
    config = {"corpus": f"{base}/corpus/v1", "out": f"{base}/model/v1", "lr": 0.1}
    assert seen == [(config, f"{base}/model/v1", (), False)]
    assert artifact.result == "hello"
    assert artifact.record is not None and artifact.record.config == config
    # The config a run receives, without running anything:
    assert materialized_config(model, prefix) == config


def test_current_context_outside_a_step_is_a_clear_error() -> None:
    with pytest.raises(NoStepContextError, match="outside a running step"):
        current_context()


def test_apply_is_the_same_build_config_and_run_pair(prefix: str) -> None:
    contexts: list[str] = []

    def add(a: int, b: int, out_path: str) -> int:
        try:
            contexts.append(current_context().output_path)
        except NoStepContextError:
            contexts.append("none")
        return a + b

    step = apply("sum", add, version="v0", a=1, b=2, out_path=OUT)
    config = materialized_config(step, prefix)
    assert config == {"a": 1, "b": 2, "out_path": f"{prefix.rstrip('/')}/sum/v0"}
    assert step.run(config) == 3  # run takes the config: fn(**config)
    assert resolve(step, prefix=prefix).result == 3
    assert contexts == ["none", config["out_path"]]


# --- StepContext ----------------------------------------------------------------------------


def test_is_fingerprint_and_resolved_at_both_times(prefix: str) -> None:
    corpus = source_step()
    modes: list[bool] = []
    loads: list[Any] = []

    def build_config(ctx: StepContext) -> dict[str, Any]:
        modes.append(ctx.is_fingerprint)
        if ctx.is_fingerprint:
            with pytest.raises(FingerprintTimeError, match="while fingerprinting"):
                ctx.resolved(corpus)
            with pytest.raises(ValueError):  # as Marin raises: callers catch ValueError
                ctx.resolved(corpus)
            return {"corpus": ctx.artifact_path(corpus)}
        first = ctx.resolved(corpus)
        assert ctx.resolved(corpus) is first  # read once, cached
        loads.append(first)
        return {"corpus": ctx.artifact_path(corpus), "chars": first.result["chars"]}

    stats = ArtifactStep(
        name="stats", version="v1", run=lambda config: config["chars"], deps=(corpus,),
        build_config=build_config,
    )  # fmt: skip
    lower(stats)
    assert modes == [True]
    assert resolve(stats, prefix=prefix).result == 5
    assert True in modes and False in modes
    loaded = loads[0]
    assert isinstance(loaded, Artifact)
    assert loaded.path() == f"{prefix.rstrip('/')}/corpus/v1"
    assert loaded.record is not None and loaded.record.result == {"chars": 5}


def test_artifact_path_resolved_and_runtime_arg_refuse_what_the_step_did_not_declare() -> None:
    corpus = source_step()
    other = source_step("other")
    ctx = StepContext(
        output_path="/p/x/v0", prefix="/p", region=None,
        dep_paths={corpus.step_id: "/p/corpus/v1"}, runtime_args={"tpu": "v4-8"},
    )  # fmt: skip
    assert ctx.artifact_path(corpus) == ctx.dep_path(corpus) == "/p/corpus/v1"
    with pytest.raises(KeyError, match="other@v1 is not a dependency"):
        ctx.artifact_path(other)
    with pytest.raises(KeyError, match="other@v1 is not a dependency"):
        ctx.resolved(other)
    with pytest.raises(NoStepContextError, match="no storage to read"):
        ctx.resolved(corpus)  # a context not made by a runner
    assert ctx.runtime_arg("tpu") == "v4-8"
    with pytest.raises(KeyError, match="'zone' is not declared.*declared: tpu"):
        ctx.runtime_arg("zone")


def test_runtime_args_are_live_at_run_time_and_never_identity(prefix: str) -> None:
    got: list[Any] = []

    def make(tpu: str) -> ArtifactStep:
        return ArtifactStep(
            name="job", version="v1", runtime_args={"tpu": tpu},
            build_config=lambda ctx: {"tpu": ctx.runtime_arg("tpu"), "steps": 10},
            run=got.append,
        )  # fmt: skip

    small, big = make("v4-8"), make("v5-256")
    assert small.fingerprint() == big.fingerprint()
    assert '"tpu":"{ARG:tpu}"' in small.fingerprint_payload()
    assert small.path(prefix) == big.path(prefix) == f"{prefix.rstrip('/')}/job/v1"
    run(big, prefix=prefix)
    assert got == [{"tpu": "v5-256", "steps": 10}]
    assert materialized_config(small, prefix) == {"tpu": "v4-8", "steps": 10}
    run(small, prefix=prefix)
    assert len(got) == 1  # the same identity: served, not rebuilt
    undeclared = ArtifactStep(
        name="job2", version="v1", run=got.append,
        build_config=lambda ctx: {"tpu": ctx.runtime_arg("tpu")},
    )  # fmt: skip
    with pytest.raises(KeyError, match="'tpu' is not declared"):
        lower(undeclared)
    with pytest.raises(InvalidStepError, match="runtime_args=.*string keys"):
        ArtifactStep(name="j", version="v1", run=got.append, runtime_args={1: 2})  # type: ignore[dict-item]


# --- handle methods, pins, adoption ---------------------------------------------------------


def test_fingerprint_methods_match_lowering_and_do_not_depend_on_the_prefix(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = source_step()
    spec = lower(step)
    assert step.fingerprint() == spec.fingerprint
    assert step.fingerprint_payload() == spec.fingerprint_payload
    assert json.loads(step.fingerprint_payload())["config"] == {"out": "{OUT}", "text": "hello"}
    assert step.path("memory://a") == "memory://a/corpus/v1"
    assert step.path("gs://b/") == "gs://b/corpus/v1"
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path))
    assert step.path() == f"{tmp_path}/corpus/v1"


def test_a_pinned_step_builds_at_its_pin_with_its_own_fingerprint(prefix: str) -> None:
    plain = apply("ckpt", _write, version="v1", path=OUT, text="w")
    pinned = apply("ckpt", _write, version="v1", path=OUT, text="w", pin="checkpoints/base")
    assert pinned.fingerprint() != plain.fingerprint()
    assert json.loads(pinned.fingerprint_payload())["pin"] == "checkpoints/base"
    assert "pin" not in json.loads(plain.fingerprint_payload())
    assert pinned.path("memory://x") == "memory://x/checkpoints/base"
    artifact = resolve(pinned, prefix=prefix)
    assert artifact.path() == f"{prefix.rstrip('/')}/checkpoints/base"
    assert _read(artifact.path()) == "w"
    assert artifact.record is not None and artifact.record.output_path == artifact.path()

    consumer = apply("eval", lambda ckpt: _read(ckpt), version="v1", ckpt=pinned)
    assert resolve(consumer, prefix=prefix).result == "w"


@pytest.mark.parametrize(
    ("pin", "message"),
    [
        ("memory::gs://b/c", "chains file systems"),
        ("ckpt/*", "glob character"),
        ("a/../b", "'..' segment"),
        ("/abs/../ckpt", "'..' segment"),
        ("gs://bucket/ckpt?generation=1", "not a literal location"),
        ("/abs/ckpt*", "not a literal location"),
        (7, "not a string"),
    ],
)
def test_a_pin_must_be_a_literal_path(pin: Any, message: str) -> None:
    with pytest.raises(InvalidStepError, match=message) as info:
        apply("ckpt", _write, version="v1", path=OUT, text="w", pin=pin)
    assert info.value.step == "ckpt@v1" and "pin" in info.value.fix


def test_an_absolute_pin_is_accepted_under_the_allowed_roots_and_refused_outside(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marin's ``pin="gs://other/loc"``: accepted when it lies under ``MARIN_ALLOWED_PREFIXES``
    (refused outside them, at the handle), built under the prefix that holds it."""
    root = tmp_path / "team"
    monkeypatch.setenv("MARIN_ALLOWED_PREFIXES", f"{root},gs://team-bucket")
    pinned = apply("ckpt", _write, version="v1", path=OUT, text="w", pin=f"{root}/p/ckpt/base")
    assert pinned.path(str(root / "p")) == f"{root}/p/ckpt/base"
    apply("ckpt", _write, version="v1", path=OUT, text="w", pin="gs://team-bucket/ckpt")
    for outside in ("gs://other/loc", str(tmp_path / "elsewhere/ckpt"), "s3://team-bucket/c"):
        with pytest.raises(InvalidStepError, match="outside MARIN_ALLOWED_PREFIXES") as info:
            apply("ckpt", _write, version="v1", path=OUT, text="w", pin=outside)
        assert info.value.step == "ckpt@v1"
    artifact = resolve(pinned, prefix=str(root / "p"))
    assert artifact.path() == f"{root}/p/ckpt/base" and _read(artifact.path()) == "w"
    record = artifact.record
    assert record is not None and record.output_path == artifact.path()
    assert (root / "p/ckpt/base.marin/record.json").is_file()  # recorded beside it
    consumer = apply("eval", lambda ckpt: _read(ckpt), version="v1", ckpt=pinned)
    assert resolve(consumer, prefix=str(root / "p")).result == "w"
    # Another prefix under the same root does not hold the pin: refused before anything runs.
    with pytest.raises(InvalidStepError, match="outside the run's prefix") as info:
        resolve(consumer, prefix=str(root / "q"))
    assert info.value.step == "ckpt@v1" and not (root / "q").exists()


def test_an_absolute_pin_and_a_relative_one_onto_one_path_are_refused_when_placed(
    tmp_path: pathlib.Path,
) -> None:
    prefix = tmp_path / "p"
    absolute = apply("a", _write, version="v1", path=OUT, text="a", pin=f"{prefix}/shared")
    relative = apply("b", _write, version="v1", path=OUT, text="b", pin="shared")
    lower([absolute, relative])  # prefix-free: the two spellings cannot meet yet
    with pytest.raises(DuplicateStepError, match="both write shared"):
        run(absolute, relative, prefix=str(prefix))


def test_a_pin_inside_or_onto_another_steps_output_is_refused_at_lower() -> None:
    corpus = source_step()
    inside = apply("x", _write, version="v1", path=OUT, text="w", pin="corpus/v1/sub")
    with pytest.raises(DuplicateStepError, match="contains the output of x@v1"):
        lower([corpus, inside])
    onto = apply("y", _write, version="v1", path=OUT, text="w", pin="corpus/v1")
    with pytest.raises(DuplicateStepError, match="corpus@v1 and y@v1 both write corpus/v1"):
        lower([corpus, onto])


def test_a_step_pinned_onto_another_pipelines_build_neither_serves_nor_replaces_it(
    prefix: str,
) -> None:
    """r7 #14: the pin check of ``lower()`` sees one graph only; a step of another pipeline
    pinned onto ``corpus/v1`` finds corpus@v1's record there, which is not its own."""
    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import read_record

    run(source_step(text="corpus"), prefix=prefix)
    onto = apply("y", _write, version="v1", path=OUT, text="pinned", pin="corpus/v1")
    before = sorted(os.listdir(f"{prefix}/corpus/v1.marin")) if "://" not in prefix else []
    for rebuild in ({}, {"on_drift": "rebuild"}, {"force": ["y"]}):
        with pytest.raises(StepFailedError) as info:
            run(onto, prefix=prefix, **rebuild)  # type: ignore[arg-type]
        text = str(info.value.__cause__ or info.value)
        assert "pin 'corpus/v1' is the output of corpus@v1" in text and "another pin" in text
    assert _read(f"{prefix}/corpus/v1") == "corpus"  # corpus@v1's build is intact
    if before:
        assert sorted(os.listdir(f"{prefix}/corpus/v1.marin")) == before
    kept = read_record(open_prefix(prefix), "corpus/v1", step=("corpus", "v1"))
    assert kept is not None and kept.step_id == "corpus@v1"
    # The reverse: a pinned step's build is never served as the step its path names.
    fresh = apply("z", _write, version="v1", path=OUT, text="z", pin="w/v1")
    run(fresh, prefix=prefix)
    assert read_record(open_prefix(prefix), "w/v1", step=("w", "v1")) is None
    assert read_record(open_prefix(prefix), "w/v1", step=("z", "v1")) is not None


def test_adopting_and_pinning_together_is_an_error() -> None:
    adopted = ArtifactStep.adopt("raw", "v1", "/data/raw")
    with pytest.raises(InvalidStepError, match="both adopted .* and pinned") as info:
        dataclasses.replace(adopted, override_path="raw/pinned")
    assert info.value.step == "raw@v1"


def test_an_adopted_step_points_consumers_at_its_source(prefix: str, tmp_path: Any) -> None:
    external = str(tmp_path / "elsewhere" / "tokens")
    _write(external, "tokens!")
    adopted = ArtifactStep.adopt(
        "tokenized/web", "v3", external, kind="tokenized", config={"tokenizer": "gpt2"}
    )
    moved = ArtifactStep.adopt("tokenized/web", "v3", external + "2", config={"tokenizer": "gpt2"})
    assert adopted.fingerprint() != moved.fingerprint()  # the source is identity
    payload = json.loads(adopted.fingerprint_payload())
    assert payload["config"] == {"tokenizer": "gpt2"} and payload["source"] == external
    assert adopted.path("memory://anything") == external
    train = apply("train", _read, version="v1", path=adopted)
    artifacts = run(adopted, train, prefix=prefix)
    assert artifacts[0].path() == external
    assert artifacts[1].result == "tokens!"
    record = artifacts[0].record
    assert record is not None and record.artifact_type == "tokenized"
    assert record.output_path == f"{prefix.rstrip('/')}/tokenized/web/v3"  # recorded here
    assert record.config == {"tokenizer": "gpt2"}  # the config given to adopt, as Marin's
    assert record.source == external  # the source is its own field
    assert not os.path.exists(os.path.join(external, "record.json"))  # the data is untouched


def test_adopting_a_relative_source_reads_it_under_the_prefix(prefix: str) -> None:
    _write(f"{prefix.rstrip('/')}/imports/raw", "raw!")
    adopted = ArtifactStep.adopt("raw", "v1", "imports/raw")
    assert adopted.path("memory://p") == "memory://p/imports/raw"
    reader = apply("read", _read, version="v1", path=adopted)
    assert resolve(reader, prefix=prefix).result == "raw!"


@pytest.mark.parametrize("spelling", ["relative", "absolute"])
def test_adopting_data_in_place_records_it_and_never_moves_it(prefix: str, spelling: str) -> None:
    """Data already at the step's own output path is adopted where it is (as in Marin): the
    record names it, and neither a first build nor a forced one moves or deletes it."""
    data = f"{prefix.rstrip('/')}/raw/v1"
    _write(data, "raw!")
    adopted = ArtifactStep.adopt("raw", "v1", "raw/v1" if spelling == "relative" else data)
    reader = apply("read", _read, version="v1", path=adopted)
    built, read = run(adopted, reader, prefix=prefix)
    assert read.result == "raw!"
    assert built.record is not None and built.record.source == data
    assert built.record.output_path == data
    again, read = run(adopted, reader, prefix=prefix, force=["raw@v1"])  # rebuilt in place
    assert read.result == "raw!" and _read(data) == "raw!"
    assert again.record is not None and again.record.build_id != built.record.build_id


def _built_raw(current: dict[str, str], prefix: str) -> ArtifactStep:
    """``raw@v1``, built: it writes ``current["text"]`` (changed by a test, then forced)."""

    def write(out: str) -> None:
        _write(out, current["text"])

    raw = apply("raw", write, version="v1", out=OUT)
    run(raw, prefix=prefix)
    return raw


def test_rebuilding_the_build_an_adoption_lies_in_makes_it_and_its_readers_stale(
    prefix: str,
) -> None:
    """Red team r7-12(b): ``adopt("data", "v1", "raw/v1")`` of another step's build, which a
    ``--force raw@v1`` then rebuilt in place with new bytes, kept the adoption and its reader
    served with the old bytes. The adoption records the build its data lies in as its input;
    a rebuild of that build makes the adoption, and so its readers, stale."""
    current = {"text": "one"}
    raw = _built_raw(current, prefix)
    adopted = ArtifactStep.adopt("data", "v1", "raw/v1")
    reader = apply("read", _read, version="v1", path=adopted)
    first, read = run(adopted, reader, prefix=prefix)
    assert read.result == "one"
    raw_record = resolve(raw, prefix=prefix, dry_run=True).record
    assert first.record is not None and raw_record is not None
    assert first.record.inputs == {"raw@v1": raw_record.build_id}
    assert run(adopted, reader, prefix=prefix)[0].record == first.record  # served as it is
    current["text"] = "two"
    run(raw, prefix=prefix, force=["raw@v1"])
    again, read = run(adopted, reader, prefix=prefix)
    assert read.result == "two"
    assert again.record is not None and again.record.build_id != first.record.build_id


def test_a_reader_of_an_adoption_never_commits_from_a_build_rebuilt_meanwhile(
    prefix: str,
) -> None:
    """Red team r11-2: ``adopt("data", "v1", "raw/v1")``; while its reader ran, another runner
    started a ``--force raw@v1`` (its lease, then raw's record gone, then its output cleared):
    the reader was committed from the cleared folder, and so was an adoption made meanwhile.
    The adopted builds are inputs like any other: checked at the start and before the commit,
    and an adoption is never recorded while a build its data lies in is under way."""
    from marin.execution.store.lease import Lease
    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import (
        REPLACES,
        RUNNING,
        delete_record,
        read_record,
        write_status,
    )

    current = {"text": "one"}
    raw = _built_raw(current, prefix)
    adopted = ArtifactStep.adopt("data", "v1", "raw/v1")
    run(adopted, prefix=prefix)
    location = open_prefix(prefix)
    rebuilds: list[Any] = []

    def read_while_raw_is_rebuilt(path: str) -> str:
        rebuilds.append(Lease(location, "raw/v1", ttl=600))  # another runner's --force raw@v1
        assert rebuilds[-1].try_acquire() is None
        built = read_record(location, "raw/v1")
        assert built is not None  # as that rebuild does: its status names the build it replaces
        write_status(location, "raw/v1", RUNNING, **{REPLACES: built.build_id})
        delete_record(location, "raw/v1")
        return _read(path)

    reader = apply("read", read_while_raw_is_rebuilt, version="v1", path=adopted)
    with pytest.raises(StepFailedError, match="adopts data .* rebuilt or removed while"):
        run(adopted, reader, prefix=prefix)
    assert resolve(reader, prefix=prefix, dry_run=True).record is None
    with pytest.raises(StepFailedError, match="which another runner is building now"):
        run(adopted, prefix=prefix)  # re-adopting while raw's rebuild is under way
    rebuilds[0].release()
    current["text"] = "two"
    run(raw, prefix=prefix, force=["raw@v1"])
    again, read = run(adopted, apply("read", _read, version="v1", path=adopted), prefix=prefix)
    assert read.result == "two" and again.record is not None


def test_data_in_a_failed_steps_output_path_is_never_adopted(prefix: str) -> None:
    """Red team r11-1: ``s@v1`` failed (its status beside ``s/v1``); the user put data at
    ``s/v1`` and adopted it as ``d@v1``; the next build of ``s`` cleared it as the failed
    attempt's debris. The adoption is refused, naming that step's output path."""
    from marin.execution.errors import AdoptedDataError, is_final

    def fail(out: str) -> None:
        raise RuntimeError("boom")

    with pytest.raises(StepFailedError):
        run(apply("s", fail, version="v1", out=OUT), prefix=prefix)
    _write(f"{prefix.rstrip('/')}/s/v1", "precious")
    for source in ("s/v1", "s"):  # the output path itself, or a folder holding it
        with pytest.raises(StepFailedError) as info:
            run(ArtifactStep.adopt("d", "v1", source), prefix=prefix)
        error = info.value.__cause__
        assert isinstance(error, AdoptedDataError) and is_final(error), info.value
        assert "the output path of a step with no build there" in error.what
    assert resolve(ArtifactStep.adopt("d", "v1", "s"), prefix=prefix, dry_run=True).record is None
    assert _read(f"{prefix.rstrip('/')}/s/v1") == "precious"


@pytest.mark.parametrize("source", ["raw/v1", "raw/v1/part", "raw", "raw//v1"])
def test_adopting_another_steps_output_in_one_graph_is_refused(source: str) -> None:
    """Red team r11-5: ``[raw, reader]`` with ``reader`` reading ``adopt("ad", "v1",
    "raw/v1")``: ``--force raw`` left the adoption and its reader served from the old bytes in
    that run, and a first run could adopt before raw was built. Refused at ``lower()``."""
    raw = apply("raw", _write, version="v1", path=OUT, text="one")
    reader = apply("read", _read, version="v1", path=ArtifactStep.adopt("ad", "v1", source))
    with pytest.raises(InvalidStepError, match="a step of this graph") as info:
        lower([raw, reader])
    assert info.value.step == "ad@v1" and "as a dependency" in info.value.fix
    lower([reader])  # alone (raw built by another pipeline), the next plan sees its rebuilds


def test_an_adoptions_record_and_a_builds_never_stand_for_each_other(
    prefix: str, tmp_path: Any
) -> None:
    """The checker's seed 472: a built record of ``raw@v1`` was served as its adoption under
    ``--on-drift warn`` (drift), so its reader read the source but recorded the build as its
    input. A record of the other kind is replaced, under every policy."""
    elsewhere = str(tmp_path / "elsewhere")
    _write(elsewhere, "adopted")
    adopted = ArtifactStep.adopt("raw", "v1", elsewhere)
    built = apply("raw", _write, version="v1", path=OUT, text="built")
    first = resolve(adopted, prefix=prefix)
    as_built = resolve(built, prefix=prefix)  # default: on_drift warn
    assert as_built.record is not None and as_built.record.source is None
    assert as_built.record.build_id != (first.record.build_id if first.record else None)
    back = resolve(adopted, prefix=prefix)
    assert back.record is not None and back.record.source == elsewhere
    assert resolve(apply("read", _read, version="v1", path=adopted), prefix=prefix).result == (
        "adopted"
    )


def test_an_adopted_record_names_its_source_and_marin_show_prints_it(
    prefix: str, tmp_path: Any
) -> None:
    from marin.catalog import show_record
    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import ArtifactRecord

    external = str(tmp_path / "elsewhere" / "raw")
    _write(external, "raw!")
    record = resolve(ArtifactStep.adopt("raw", "v1", external), prefix=prefix).record
    assert record is not None and record.source == external  # Marin's record.source
    assert ArtifactRecord.from_json(record.to_json()).source == external
    built = resolve(source_step(), prefix=prefix).record
    assert built is not None and "source" not in json.loads(built.to_json())  # bytes as before
    text, code = show_record(open_prefix(prefix), "raw/v1")
    assert code == 0 and f"source       {external}" in text
    if not prefix.startswith("memory://"):  # and through the CLI, which cannot see memory://
        from tests.ux.helpers import marin

        shown = marin("show", "raw@v1", "--prefix", prefix)
        assert shown.returncode == 0 and f"source       {external}" in shown.stdout


def test_data_where_a_step_writes_is_refused_with_advice_that_works(tmp_path: Any) -> None:
    """Data Marin did not write at a step's output path is never cleared; the advice to adopt
    it in place, followed, serves it. (Local disk: memory:// has no foreign writers.)"""
    prefix = str(tmp_path / "prefix")
    data = f"{prefix}/corpus/v1"
    _write(data, "theirs")
    with pytest.raises(StepFailedError) as info:
        resolve(source_step(), prefix=prefix)
    message = str(info.value.__cause__ or info.value)
    assert "not written by Marin" in message and _read(data) == "theirs"
    call = re.search(r"ArtifactStep\.adopt\(([^)]*)\)", message)
    assert call, message
    name, version, source = (ast.literal_eval(part.strip()) for part in call.group(1).split(","))
    adopted = ArtifactStep.adopt(name, version, source)
    assert (
        resolve(apply("read", _read, version="v1", path=adopted), prefix=prefix).result == "theirs"
    )


def test_an_adoption_never_records_itself_inside_another_steps_build(tmp_path: Any) -> None:
    """Red team r8-4: ``adopt("corpus/v1/sub", "v1", ...)``, named inside another pipeline's
    build ``corpus@v1``, wrote its record there: corpus's artifact changed, and ``--force
    corpus@v1`` was refused from then on. Refused as a built step there is."""
    prefix = str(tmp_path / "prefix")
    resolve(source_step(), prefix=prefix)
    before = sorted(p.name for p in (tmp_path / "prefix/corpus/v1").iterdir())
    elsewhere = str(tmp_path / "elsewhere")
    _write(elsewhere, "theirs")
    with pytest.raises(StepFailedError, match="lies inside another step's output"):
        resolve(ArtifactStep.adopt("corpus/v1/sub", "v1", elsewhere), prefix=prefix)
    assert sorted(p.name for p in (tmp_path / "prefix/corpus/v1").iterdir()) == before
    resolve(source_step(), prefix=prefix, force=["corpus@v1"])  # still repairable


@pytest.mark.parametrize("source", ["train/v1.marin/checkpoints", "/data/x.marin/ckpt"])
def test_an_adopted_source_in_a_metadata_folder_is_refused(source: str) -> None:
    """Red team r8-5: a step's kept checkpoints (``train/v1.marin/checkpoints``) adopted as
    data: gc deleted them with their build, and a registration of the adoption froze nothing.
    A metadata folder is Marin's state, never another step's data."""
    with pytest.raises(InvalidStepError, match="lies in a step's metadata folder"):
        lower(ArtifactStep.adopt("ckpts", "v1", source))


def test_an_adoption_holding_two_builds_of_one_step_is_stale_when_either_is_rebuilt(
    prefix: str,
) -> None:
    """Red team r10-1: an adopted folder holding two builds of ``raw@v1`` (two pins) recorded
    one of them (its inputs are keyed by step): the other's rebuild left it served. The
    builds it adopts are recorded by output path."""
    current = {"text": "one"}

    def write(out: str) -> None:
        _write(out, current["text"])

    for pin in ("data/r1", "data/r2"):
        run(apply("raw", write, version="v1", out=OUT, pin=pin), prefix=prefix)
    adopted = ArtifactStep.adopt("imported", "v1", "data")
    first = run(adopted, prefix=prefix)[0]
    assert first.record is not None
    current["text"] = "two"
    run(apply("raw", write, version="v1", out=OUT, pin="data/r2"), prefix=prefix, force=["raw"])
    again = run(adopted, prefix=prefix)[0]
    assert again.record is not None and again.record.build_id != first.record.build_id


def test_an_adoption_holding_a_build_is_stale_once_that_build_is_rebuilt(prefix: str) -> None:
    """Red team r7-12(b), the source holding the build (``raw``, the folder of its versions)
    rather than lying in it: the builds it holds are recorded as its inputs when it commits."""
    current = {"text": "one"}
    raw = _built_raw(current, prefix)
    adopted = ArtifactStep.adopt("data", "v1", "raw")
    first = run(adopted, prefix=prefix)[0]
    assert first.record is not None and list(first.record.inputs) == ["raw@v1"]
    current["text"] = "two"
    run(raw, prefix=prefix, force=["raw@v1"])
    again = run(adopted, prefix=prefix)[0]
    assert again.record is not None and again.record.build_id != first.record.build_id


def test_adopting_data_that_is_not_there_fails_the_step_and_records_nothing(
    prefix: str,
) -> None:
    adopted = ArtifactStep.adopt("raw", "v1", "/nonexistent/marin-data/raw")
    with pytest.raises(StepFailedError, match="cannot adopt /nonexistent/marin-data/raw"):
        resolve(adopted, prefix=prefix)
    assert resolve(adopted, prefix=prefix, dry_run=True).record is None


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("gs://b/x*", "glob character"),
        ("simplecache::gs://b/x", "'::'"),
        ("/d/../x", "'..'"),
        ("file:/d/raw/v1", "reads as a URL without '//'"),  # red team r9: read under the prefix
        ("FILE:///d/raw/v1", "protocol 'FILE', which fsspec does not know"),  # r9: a traceback
    ],
)
def test_an_adopted_source_is_literal(source: str, message: str) -> None:
    with pytest.raises(InvalidStepError, match=message):
        ArtifactStep.adopt("raw", "v1", source)


# --- registered types -----------------------------------------------------------------------


class Tokenizer:
    """A user type with no canonical form of its own (its repr holds an address)."""

    def __init__(self, name: str, vocab: int) -> None:
        self.name, self.vocab = name, vocab


class FastTokenizer(Tokenizer):
    pass


@pytest.fixture
def clean_registry() -> Any:
    saved = dict(_registered)
    yield
    _registered.clear()
    _registered.update(saved)
    _lookup_cache.clear()


def _tokenize_step(tokenizer: Tokenizer) -> ArtifactStep:
    return apply("tok", lambda tokenizer, out: None, version="v1", tokenizer=tokenizer, out=OUT)


def test_register_fingerprint_gives_a_user_type_an_exact_form(
    clean_registry: Any, prefix: str
) -> None:
    with pytest.raises(ConfigError, match="config.tokenizer holds a tests.test_marin_parity"):
        lower(_tokenize_step(Tokenizer("gpt2", 50257)))
    register_fingerprint(Tokenizer, lambda t: {"name": t.name, "vocab": t.vocab})
    step = _tokenize_step(Tokenizer("gpt2", 50257))
    assert json.loads(step.fingerprint_payload())["config"]["tokenizer"] == {
        "__registered__": "Tokenizer",
        "value": {"name": "gpt2", "vocab": 50257},
    }
    assert step.fingerprint() == _tokenize_step(Tokenizer("gpt2", 50257)).fingerprint()
    assert step.fingerprint() != _tokenize_step(Tokenizer("gpt2", 1)).fingerprint()
    # A subclass is matched along its MRO, but is its own config (red team r28-1: an
    # ``np.matrix`` under an ``ndarray`` registration was the array's build):
    fast = _tokenize_step(FastTokenizer("gpt2", 50257))
    assert json.loads(fast.fingerprint_payload())["config"]["tokenizer"] == {
        "__registered__": "FastTokenizer",
        "value": {"name": "gpt2", "vocab": 50257},
    }
    assert fast.fingerprint() != step.fingerprint()
    # One of the same name in another module too (red team r29-4):
    same_name = type("Tokenizer", (Tokenizer,), {"__module__": "fancy.tokenizers"})
    assert _tokenize_step(same_name("gpt2", 50257)).fingerprint() != step.fingerprint()
    # ... or of an unregistered class between them (r30-5):
    again = type("FastTokenizer", (FastTokenizer,), {"__module__": "fancy.tokenizers"})
    assert _tokenize_step(again("gpt2", 50257)).fingerprint() != fast.fingerprint()
    assert step.path(prefix) == f"{prefix.rstrip('/')}/tok/v1"
    # The public module re-exports the one implementation:
    assert public_fingerprint.register_fingerprint is register_fingerprint


@dataclasses.dataclass(frozen=True)
class Named:
    name: str


@dataclasses.dataclass(frozen=True)
class TrainConfig(Named):
    lr: float


def test_a_registered_bases_dataclass_subclass_keeps_its_own_fields(clean_registry: Any) -> None:
    """Red team r28-1: a function registered for a base knows only the base's fields, so
    ``TrainConfig("run", 0.1)`` and ``TrainConfig("run", 0.2)`` were one config."""
    register_fingerprint(Named, lambda named: {"name": named.name})

    def fingerprint(config: Named) -> str:
        step = apply("train", lambda config, out: None, version="v1", config=config, out=OUT)
        return step.fingerprint()

    assert fingerprint(TrainConfig("run", 0.1)) != fingerprint(TrainConfig("run", 0.2))
    assert fingerprint(TrainConfig("run", 0.1)) == fingerprint(TrainConfig("run", 0.1))
    assert fingerprint(TrainConfig("run", 0.1)) != fingerprint(Named("run"))
    # An ``InitVar`` is no field: it was recorded as its class default (r30-6).
    assert "warm" not in json.dumps(to_canonical(Scheduled("run", 0.1, 5)))


@dataclasses.dataclass(frozen=True)
class Scheduled(TrainConfig):
    warm: dataclasses.InitVar[int] = 0


def test_register_fingerprint_refuses_built_in_types_and_reports_a_failing_function(
    clean_registry: Any,
) -> None:
    with pytest.raises(ConfigError, match="str already has a canonical form"):
        register_fingerprint(str, str.upper)
    with pytest.raises(ConfigError, match="not a class"):
        register_fingerprint("Tokenizer", repr)  # type: ignore[arg-type]

    def broken(t: Tokenizer) -> Any:
        raise ValueError("no vocab")

    register_fingerprint(Tokenizer, broken)
    with pytest.raises(ConfigError, match="config.tokenizer: the fingerprint function registered"):
        lower(_tokenize_step(Tokenizer("gpt2", 1)))


# --- guarantees -----------------------------------------------------------------------------


def test_expected_fingerprint_pins_the_recipe_at_lower() -> None:
    step = source_step()
    pinned = dataclasses.replace(step, expected_fingerprint=step.fingerprint())
    assert lower(pinned).fingerprint == step.fingerprint()
    changed = dataclasses.replace(
        source_step(text="changed"), expected_fingerprint=step.fingerprint()
    )
    with pytest.raises(FingerprintMismatchError, match="expected_fingerprint pins") as info:
        lower(changed)
    assert info.value.step == "corpus@v1" and "bump the version" in info.value.fix


def test_a_stored_build_of_another_fingerprint_is_an_error_under_expected_fingerprint(
    prefix: str,
) -> None:
    resolve(source_step(text="old"), prefix=prefix)
    new = source_step(text="new")
    assert resolve(new, prefix=prefix).result == {"chars": 3}  # drift: served, with a warning
    pinned = dataclasses.replace(new, expected_fingerprint=new.fingerprint())
    with pytest.raises(FingerprintMismatchError, match="config.text: old -> new") as info:
        resolve(pinned, prefix=prefix)
    assert info.value.step == "corpus@v1" and "bump the version" in info.value.fix
    assert resolve(pinned, prefix=prefix, force=["corpus"]).result == {"chars": 3}
    assert resolve(pinned, prefix=prefix).record.fingerprint == new.fingerprint()  # type: ignore[union-attr]


def test_a_fixed_version_depending_on_a_mutable_one_is_refused_at_lower() -> None:
    scratch = source_step("scratch", "dev")
    fixed = apply("report", _read, version="v1", path=scratch)
    with pytest.raises(InvalidStepError) as info:
        lower(fixed)
    assert "report@v1 has a fixed version but depends on scratch@dev" in info.value.what
    assert "report" in info.value.fix and "scratch" in info.value.fix
    assert info.value.step == "report@v1"
    lower(apply("report", _read, version="v1-dev", path=scratch))  # mutable on mutable: fine


def test_another_artifact_type_for_a_built_name_version_is_a_mismatch(prefix: str) -> None:
    step = source_step()
    resolve(step, prefix=prefix)
    retyped = step.with_options(artifact_type="checkpoint")
    with pytest.raises(ArtifactTypeMismatchError, match="'artifact'.*'checkpoint'") as info:
        resolve(retyped, prefix=prefix)
    assert info.value.step == "corpus@v1" and "bump the step's version" in info.value.fix
    rebuilt = resolve(retyped, prefix=prefix, force=["corpus"])  # the documented way out
    assert rebuilt.record is not None and rebuilt.record.artifact_type == "checkpoint"


def test_artifact_type_may_be_given_as_a_class_as_marin_does(prefix: str) -> None:
    class Checkpoint:
        pass

    label = f"{__name__}.test_artifact_type_may_be_given_as_a_class_as_marin_does.<locals>"
    step = apply("ck", _write, version="v1", path=OUT, text="w", artifact_type=Checkpoint)
    assert step.artifact_type is Checkpoint  # the handle keeps the class, as Marin's does
    assert lower(step).artifact_type == f"{label}.Checkpoint"  # recorded by its name
    hand = ArtifactStep(name="ck2", version="v1", run=lambda c: None, artifact_type=Checkpoint)
    assert hand.artifact_type is Checkpoint
    assert ArtifactStep.adopt("a", "v1", "/d", kind=Checkpoint).artifact_type is Checkpoint
    record = resolve(step, prefix=prefix).record
    assert record is not None and record.artifact_type == f"{label}.Checkpoint"
    with pytest.raises(InvalidStepError, match="artifact_type=3 is neither"):
        ArtifactStep(name="ck3", version="v1", run=lambda c: None, artifact_type=3)  # type: ignore[arg-type]


def test_force_run_failed_false_does_not_retry_a_failed_step(prefix: str) -> None:
    calls: list[str] = []
    fail = {"now": True}

    def flaky(config: dict[str, Any]) -> str:
        calls.append(config["out"])
        if fail["now"]:
            raise RuntimeError("disk full")
        return "ok"

    step = ArtifactStep(
        name="flaky", version="v1", run=flaky, build_config=lambda ctx: {"out": ctx.output_path}
    )
    with pytest.raises(StepFailedError, match="disk full"):
        resolve(step, prefix=prefix)
    fail["now"] = False
    with pytest.raises(FailedBeforeError, match="last attempt failed") as info:
        resolve(step, prefix=prefix, force_run_failed=False)
    assert info.value.step == "flaky@v1" and "force_run_failed=True" in info.value.fix
    with pytest.raises(FailedBeforeError):
        StepRunner(prefix=prefix).run(
            [lower(step)], dry_run=False, force_run_failed=False, max_concurrent=2
        )
    assert len(calls) == 1  # never retried
    assert resolve(step, prefix=prefix).result == "ok"  # the default retries it
    assert len(calls) == 2


def test_step_runner_run_takes_marins_arguments(prefix: str) -> None:
    runner = StepRunner(prefix=prefix)
    report = runner.run([lower(source_step())], dry_run=False, force_run_failed=True,
                        max_concurrent=1)  # fmt: skip
    assert list(report.outcomes) == ["corpus/v1"] and runner.max_concurrent == 8
    with pytest.raises(InvalidStepError, match="max_concurrent=0"):
        runner.run([lower(source_step())], max_concurrent=0)


# --- every runner: the hand-written pipeline of tests/marin_contract_pipeline.py ------------


def test_the_hand_written_pipeline_runs_locally_and_isolated(tmp_path: pathlib.Path) -> None:
    from tests import marin_contract_pipeline as mp

    prefix = str(tmp_path)
    count, isolated = run(mp.pipeline, prefix=prefix)
    assert count.result.pop("pid") == os.getpid()
    assert count.result == mp.expected(prefix, "contract/count", "v4-8")
    assert isolated.result.pop("pid") != os.getpid()  # ran in a fresh subprocess
    assert isolated.result == mp.expected(prefix, "contract/count-isolated", "v5-16")
    assert _read(f"{prefix}/contract/pinned-corpus") == mp.TEXT


def test_a_step_under_a_timeout_reaches_its_context_on_the_helper_thread(prefix: str) -> None:
    import threading

    seen: list[Any] = []

    def work(config: dict[str, Any]) -> None:
        seen.append((current_context().output_path, threading.current_thread().name, config))

    step = ArtifactStep(
        name="timed", version="v1", run=work, build_config=lambda ctx: {"out": ctx.output_path}
    ).with_options(timeout=60)
    artifact = step.resolve(prefix=prefix)  # the method form of resolve(handle)
    out = f"{prefix.rstrip('/')}/timed/v1"
    assert artifact.path() == out
    assert seen == [(out, "marin-timed-timed@v1", {"out": out})]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(value=_json_values, other=_json_values)
def test_property_a_runtime_arg_reaches_the_config_and_never_the_fingerprint(
    value: Any, other: Any
) -> None:
    def make(arg: Any) -> ArtifactStep:
        return ArtifactStep(
            name="prop", version="v1", run=lambda config: None, runtime_args={"arg": arg},
            build_config=lambda ctx: {"arg": ctx.runtime_arg("arg"), "out": ctx.output_path},
        )  # fmt: skip

    assert make(value).fingerprint() == make(other).fingerprint()
    assert materialized_config(make(value), "memory://prop")["arg"] == value


def test_an_isolated_step_sees_its_devices_as_its_own_process_numbers_them(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from marin.execution.builder.commit import build_step
    from marin.execution.builder.request import BuildRequest
    from marin.execution.pipeline.context import assigned_devices
    from marin.execution.store.location import open_prefix
    from tests import marin_contract_pipeline as mp

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    step = ArtifactStep(name="gpu", version="v1", run=mp.devices_seen, isolate=True)
    with assigned_devices((1, 3)):
        outcome = build_step(BuildRequest(lower(step), open_prefix(str(tmp_path))))
    result = outcome.record.result
    assert result["pid"] != os.getpid()
    assert result["cuda"] == "1,3"  # the runner's devices 1 and 3 ...
    assert result["devices"] == [0, 1]  # ... are the child's 0 and 1
