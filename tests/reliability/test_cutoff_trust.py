"""Issue 43, items 1-3: early cutoff never serves stale work.

An upstream step is rebuilt with only one thing a reader can consume changed (the content, a
file's mode, what a link inside it points to, the output being a link, an empty folder, the
value it returned, its artifact type); its reader must be rebuilt, and ``marin plan`` afterwards
must call the reader current only because it was made from the current upstream. The control
(nothing changed) shows the cutoff is live in this very set-up, so the other tests are not
vacuous. The rebuild is a cascade: a root step's config changes (``on_drift="rebuild"``) and
its new bytes make the upstream stale, whose own config never changes (a changed config is
never cut off: a reader gets it through ``ctx.resolved``). Not ``--force``: a forced upstream
is never cut off (item 2), which would hide what the digest sees. Local disk, ``memory://`` and S3 (moto) where the thing exists there.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from marin.execution.lazy import OUT, apply, lower
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.vocabulary import Action

SEED, UP, READER = "cut/seed@v1", "cut/up@v1", "cut/reader@v1"
CALLS: list[str] = []
Writer = Callable[[str], Any]
WRITER: dict[str, Writer] = {}
"""How the upstream writes its output (given its URL) and what it returns, set by each test."""


def seed(salt: int, out_path: str) -> None:
    with fsspec.open(out_path + "/salt.txt", "w", auto_mkdir=True) as f:
        f.write(str(salt))


def upstream(seed: str, out_path: str) -> Any:
    CALLS.append("up")
    return WRITER["up"](out_path)


def reader(up: str, out_path: str) -> None:
    CALLS.append("reader")
    with fsspec.open(out_path + "/seen.txt", "w", auto_mkdir=True) as f:
        f.write(up)


def pipeline(salt: int, kind: str = "artifact") -> Any:
    root = apply("cut/seed", seed, version="v1", salt=salt, out_path=OUT)
    up = apply("cut/up", upstream, version="v1", seed=root, out_path=OUT, artifact_type=kind)
    return apply("cut/reader", reader, version="v1", up=up, out_path=OUT)


def run(prefix: str, salt: int, kind: str = "artifact", **options: Any) -> list[str]:
    CALLS.clear()
    StepRunner(RunOptions(on_drift="rebuild", **options), prefix=prefix).run(
        lower(pipeline(salt, kind))
    )
    return list(CALLS)


def settle(prefix: str, write: Writer, kind: str = "artifact") -> None:
    """Both steps built, every record with a known digest (``memory://`` digests rebuilds only)."""
    WRITER["up"] = write
    run(prefix, 0, kind)
    run(prefix, 0, kind, force=("cut/up", "cut/reader"))


def assert_plan_is_honest(
    prefix: str, salt: int, kind: str = "artifact", *, cut_off: bool = False
) -> None:
    """Everything is current: the reader was made from the upstream's current build, or (only
    when it was ``cut_off``) the plan says the upstream's output is the one it consumed."""
    plan, _ = StepRunner(prefix=prefix).plan(lower(pipeline(salt, kind)))
    decisions = {d.spec.step_id: d for d in plan.decisions.values() if d.spec.step_id != SEED}
    assert {i: d.action for i, d in decisions.items()} == {UP: Action.SKIP, READER: Action.SKIP}
    up, seen = decisions[UP].record, decisions[READER].record
    assert up is not None and seen is not None
    if cut_off:
        assert seen.inputs[UP] != up.build_id and decisions[READER].unchanged == (UP,)
    else:
        assert seen.inputs[UP] == up.build_id and decisions[READER].unchanged == ()


def rebuilt_with(prefix: str, before: Writer, after: Writer) -> list[str]:
    settle(prefix, before)
    WRITER["up"] = after
    ran = run(prefix, 1)
    assert_plan_is_honest(prefix, 1, cut_off="reader" not in ran)
    return ran


def text(data: str, result: Any = None) -> Writer:
    def write(out: str) -> Any:
        with fsspec.open(out + "/data.txt", "w", auto_mkdir=True) as f:
            f.write(data)
        return result

    return write


# --- the control: the cutoff is live in this set-up --------------------------------------------


def test_a_rebuild_that_changes_nothing_serves_the_reader(store_prefix: str) -> None:
    ran = rebuilt_with(store_prefix, text("same", {"ppl": 12.5}), text("same", {"ppl": 12.5}))
    assert ran == ["up"]


def test_the_cutoff_holds_over_a_chain_of_unchanged_rebuilds(store_prefix: str) -> None:
    """The reader, cut off once, still read the bytes of each later identical rebuild."""
    settle(store_prefix, text("same"))
    assert run(store_prefix, 1) == ["up"]
    assert run(store_prefix, 2) == ["up"]
    assert_plan_is_honest(store_prefix, 2, cut_off=True)
    WRITER["up"] = text("other")
    assert run(store_prefix, 3) == ["up", "reader"]
    assert_plan_is_honest(store_prefix, 3)


def test_a_damaged_link_in_the_chain_ends_the_cutoff(store_prefix: str) -> None:
    settle(store_prefix, text("same"))
    assert run(store_prefix, 1) == ["up"]
    location = open_prefix(store_prefix)
    location.fs.pipe_file(location.path("cut/up/v1/data.txt"), b"edited by hand")
    assert run(store_prefix, 2) == ["up", "reader"]
    assert_plan_is_honest(store_prefix, 2)


# --- each thing a reader consumes --------------------------------------------------------------


def test_changed_content_rebuilds_the_reader(store_prefix: str) -> None:
    assert rebuilt_with(store_prefix, text("first"), text("other")) == ["up", "reader"]


def test_a_changed_returned_value_rebuilds_the_reader(store_prefix: str) -> None:
    """The issue's evaluation: no files, a result read through ``ctx.resolved(dep).result``."""
    ran = rebuilt_with(store_prefix, lambda out: {"ppl": 12.5}, lambda out: {"ppl": 13.0})
    assert ran == ["up", "reader"]


def test_a_changed_artifact_type_rebuilds_the_reader(store_prefix: str) -> None:
    """A new artifact type needs ``--force`` (it is refused otherwise); same bytes, same result."""
    settle(store_prefix, text("same"), kind="tokens")
    assert run(store_prefix, 0, "shards", force=("cut/up",)) == ["up", "reader"]
    assert_plan_is_honest(store_prefix, 0, "shards")


def test_a_changed_file_mode_rebuilds_the_reader(tmp_path: Path) -> None:
    def mode(bits: int) -> Writer:
        def write(out: str) -> None:
            text("same")(out)
            os.chmod(out + "/data.txt", bits)

        return write

    assert rebuilt_with(str(tmp_path / "p"), mode(0o644), mode(0o600)) == ["up", "reader"]


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_an_added_empty_folder_rebuilds_the_reader(backend: str, tmp_path: Path) -> None:
    def with_folder(out: str) -> None:
        text("same")(out)
        fs, path = fsspec.core.url_to_fs(out)
        fs.makedirs(path + "/empty")

    prefix = str(tmp_path / "p") if backend == "local" else f"memory://cut-{tmp_path.name}"
    assert rebuilt_with(prefix, text("same"), with_folder) == ["up", "reader"]


def test_what_a_link_inside_the_output_points_to_rebuilds_the_reader(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"

    def linked(content: str) -> Writer:
        def write(out: str) -> None:
            outside.write_text(content)
            text("same")(out)
            os.symlink(outside, out + "/link.txt")

        return write

    assert rebuilt_with(str(tmp_path / "p"), linked("first"), linked("other")) == ["up", "reader"]


def test_an_output_path_that_is_a_link_rebuilds_the_reader(tmp_path: Path) -> None:
    """The docs call an output that is a link the ``fn``'s business: it is never followed."""
    elsewhere = tmp_path / "elsewhere"

    def linked(content: str) -> Writer:
        def write(out: str) -> None:
            elsewhere.mkdir(exist_ok=True)
            (elsewhere / "data.txt").write_text(content)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            os.symlink(elsewhere, out)

        return write

    assert rebuilt_with(str(tmp_path / "p"), linked("first"), linked("other")) == ["up", "reader"]


# --- item 2: forcing a step repairs what was built from it -------------------------------------


def damaged_then_read(prefix: str) -> None:
    """The upstream commits "good"; its output is then changed by hand ("bad"); the reader is
    built from the damaged bytes (its record still names the upstream's claimed digest)."""
    WRITER["up"] = text("good")
    CALLS.clear()
    for force in ((), ("cut/up",)):  # twice: memory:// digests a rebuild only
        StepRunner(RunOptions(force=force), prefix=prefix).run(lower(pipeline(0)).deps[0])
    location = open_prefix(prefix)
    location.fs.pipe_file(location.path("cut/up/v1/data.txt"), b"bad")
    assert run(prefix, 0) == ["reader"]


def test_force_repairs_what_was_built_from_a_damaged_output(
    store_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    damaged_then_read(store_prefix)
    with caplog.at_level(logging.WARNING, logger="marin"):
        assert run(store_prefix, 0, force=("cut/up",)) == ["up", "reader"]
    assert "clear cut/up@v1: its output is not what its record claimed" in caplog.text
    assert_plan_is_honest(store_prefix, 0)
    location = open_prefix(store_prefix)
    record = read_record(location, "cut/up/v1")
    assert record is not None and record.replaced == {}  # the damage was seen


def test_a_rebuild_over_a_damaged_output_does_not_cut_off(store_prefix: str) -> None:
    """Not forced (a drift rebuild): the bytes about to be replaced are digested, they are not
    what the record claimed, so the reader, built from them, is rebuilt."""
    damaged_then_read(store_prefix)
    assert run(store_prefix, 1) == ["up", "reader"]
    assert_plan_is_honest(store_prefix, 1)


def test_the_plan_of_a_forced_upstream_rebuilds_its_readers_outright(store_prefix: str) -> None:
    settle(store_prefix, text("same"))
    plan, _ = StepRunner(RunOptions(force=("cut/up",)), prefix=store_prefix).plan(lower(pipeline(0)))
    decision = next(d for d in plan.decisions.values() if d.spec.step_id == READER)
    assert decision.action == Action.BUILD and decision.unless_unchanged == ()
    assert run(store_prefix, 0, force=("cut/up",)) == ["up", "reader"]


@pytest.fixture(autouse=True)
def _clean() -> Any:
    yield
    WRITER.clear()
    CALLS.clear()
