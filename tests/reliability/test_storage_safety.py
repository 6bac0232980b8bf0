"""Storage never touches what is not the step's own (issue 11, items 1-3), on every backend.

Each test runs on local disk, ``memory://``, S3 (moto) and GCS (fake-gcs-server, slow).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import fsspec
import pytest

from marin.execution.builder.commit import build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.errors import DuplicateStepError, InvalidStepError, StepFailedError
from marin.execution.lazy import OUT, apply, lower, resolve
from marin.execution.plan.options import Policy
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record, read_status, status_path, write_status


def write_value(value: str, out_path: str) -> str:
    with fsspec.open(f"{out_path}/data.txt", "w") as f:
        f.write(value)
    return value


def fails_once(switch: str, out_path: str) -> str:
    """Writes some output, then fails while the local file ``switch`` exists (and removes it)."""
    with fsspec.open(f"{out_path}/data.txt", "w") as f:
        f.write("half")
    if os.path.exists(switch):
        os.unlink(switch)
        raise RuntimeError("first attempt fails")
    return "ok"


def put(location: Any, relative: str, data: bytes) -> None:
    path = location.path(relative)
    location.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    location.fs.pipe_file(path, data)


def _files(location: Any, relative: str) -> list[str]:
    return sorted(location.list_tree(location.path(relative)))


@pytest.mark.parametrize("odd", ["r*n", "grid[0]", "p?", "**"])
def test_storage_operations_are_literal(store_prefix: str, odd: str) -> None:
    """exists / list / remove of a path holding glob characters touch only that path."""
    location = open_prefix(store_prefix)
    for rel in (f"{odd}/v1/f", "run/v1/f", "rxn/v1/f", "grid0/v1/f", "g/v1/f", "pq/v1/f"):
        put(location, rel, b"x")
    others = {rel: _files(location, rel) for rel in ("run", "rxn", "grid0", "g", "pq")}
    assert all(others.values())
    assert location.exists(location.path(odd))
    assert not location.exists(location.path(odd.replace("*", "x").replace("?", "q") + "-none"))
    assert _files(location, odd) == [location.path(f"{odd}/v1/f")]
    location.remove_tree(location.path(odd))
    assert _files(location, odd) == []
    assert {rel: _files(location, rel) for rel in others} == others, "a sibling was deleted"
    location.remove_tree(location.path("no[such]*"))  # matches nothing: a no-op, never an error


@pytest.mark.parametrize("pattern", ["r?n", "r*n", "r[u]n"])
def test_the_fsspec_calls_marin_relies_on_are_literal(store_prefix: str, pattern: str) -> None:
    """``storage.py`` uses exists/isfile/info/ls/find/du/cat_file as literal operations: a path
    that is a pattern matching only a sibling (``run``) must not find that sibling."""
    location = open_prefix(store_prefix)
    put(location, "run/v1/f", b"sibling")
    fs, path = location.fs, location.path(pattern)
    assert not fs.exists(path) and not location.exists(path)
    assert not fs.isfile(f"{path}/v1/f")
    assert fs.find(path) == [] and location.list_tree(path) == []
    assert fs.du(path) == 0
    for call in (lambda: fs.info(path), lambda: fs.ls(path), lambda: fs.cat_file(f"{path}/v1/f")):
        with pytest.raises(FileNotFoundError):
            call()
    assert fs.cat_file(location.path("run/v1/f")) == b"sibling"


def test_a_glob_prefix_retry_clears_only_its_own_debris(store_prefix: str, tmp_path: Path) -> None:
    """A prefix is chosen by a user or a trigger: ``base/p*`` must not reach ``base/p1``."""
    target = apply("a", write_value, version="v0", value="keep", out_path=OUT)
    resolve(target, prefix=f"{store_prefix}/p1")
    switch = tmp_path / "fail"
    switch.touch()
    flaky = apply("a", fails_once, version="v0", switch=str(switch), out_path=OUT)
    glob_prefix = f"{store_prefix}/p*"
    with pytest.raises(StepFailedError):
        resolve(flaky, prefix=glob_prefix)
    resolve(flaky, prefix=glob_prefix)  # the retry clears its debris at .../p*/a/v0
    kept = open_prefix(f"{store_prefix}/p1")
    assert kept.fs.cat_file(kept.path("a/v0/data.txt")) == b"keep"
    assert read_record(kept, "a/v0") is not None


@pytest.mark.parametrize("name", ["**", "grid[0]", "r*n", "what?", "a/[b]"])
def test_names_with_glob_characters_are_rejected(name: str) -> None:
    with pytest.raises(InvalidStepError, match="glob character"):
        apply(name, write_value, version="v0", value="x", out_path=OUT)
    with pytest.raises(InvalidStepError, match="glob character"):
        apply("ok", write_value, version=name.replace("/", "-"), value="x", out_path=OUT)


def test_lower_rejects_one_output_inside_another() -> None:
    inner = apply("team/exp", write_value, version="v0", value="inner", out_path=OUT)
    outer = apply("team", write_value, version="exp", value="outer", out_path=OUT)
    with pytest.raises(DuplicateStepError) as info:
        lower(inner, outer)
    message = str(info.value)
    assert "team@exp" in message and "team/exp@v0" in message and "contains" in message
    with pytest.raises(DuplicateStepError):
        lower(outer, inner)


def test_build_never_clears_a_folder_holding_another_steps_metadata(store_prefix: str) -> None:
    """Across two runs (no single graph to reject), the outer step refuses to clear."""
    inner = apply("team/exp", write_value, version="v0", value="inner", out_path=OUT)
    resolve(inner, prefix=store_prefix)
    location = open_prefix(store_prefix)
    write_status(location, "team/exp", "FAILED", error="an earlier attempt")  # Marin was here
    outer = apply("team", write_value, version="exp", value="outer", out_path=OUT)
    with pytest.raises(StepFailedError, match="holds another step's build team/exp@v0"):
        resolve(outer, prefix=store_prefix)
    assert location.fs.cat_file(location.path("team/exp/v0/data.txt")) == b"inner"
    assert read_record(location, "team/exp/v0") is not None
    # Refused before writing anything: the earlier attempt's status is what remains.
    assert (read_status(location, "team/exp") or {}).get("state") == "FAILED"


def test_a_folder_marin_never_wrote_is_not_cleared(store_prefix: str) -> None:
    location = open_prefix(store_prefix)
    put(location, "team/data/v0/precious.txt", b"precious")
    mine = location.path("team/data/v0/precious.txt")
    step = apply("team/data", write_value, version="v0", value="x", out_path=OUT)
    with pytest.raises(StepFailedError) as info:
        resolve(step, prefix=store_prefix)
    message = str(info.value)
    assert "already exists and was not written by Marin" in message and "move it away" in message
    assert location.fs.cat_file(mine) == b"precious"
    # Nothing was written for the refused attempt (it refused before taking the lease): no
    # metadata folder claims the output for Marin, so the next attempt refuses too.
    assert not location.has_file(location.path(status_path("team/data/v0")))
    assert not location.exists(location.path("team/data/v0.marin"))
    assert read_record(location, "team/data/v0") is None
    with pytest.raises(StepFailedError, match="was not written by Marin"):
        resolve(step, prefix=store_prefix)
    assert location.fs.cat_file(mine) == b"precious"


def test_forced_rebuild_says_replacing_and_retry_says_debris(
    store_prefix: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    step = apply("s", write_value, version="v0", value="x", out_path=OUT)
    spec = step.lower()
    location = open_prefix(store_prefix)
    build_step(BuildRequest(spec, location))
    caplog.set_level(logging.INFO, logger="marin")
    build_step(BuildRequest(spec, location, policy=Policy(force=frozenset({spec.step_id}))))
    cleared = [r.getMessage() for r in caplog.records if r.getMessage().startswith("clear ")]
    assert len(cleared) == 1 and "replacing the previous build" in cleared[0], cleared
    caplog.clear()
    switch = tmp_path / "fail"
    switch.touch()
    flaky = apply("f", fails_once, version="v0", switch=str(switch), out_path=OUT).lower()
    with pytest.raises(RuntimeError):
        build_step(BuildRequest(flaky, location))
    build_step(BuildRequest(flaky, location))
    cleared = [r.getMessage() for r in caplog.records if r.getMessage().startswith("clear ")]
    assert len(cleared) == 1 and "removing debris from an earlier attempt" in cleared[0], cleared


def test_a_memory_store_subclass_that_overrides_reads_is_read_through_them() -> None:
    """``memory://`` is read straight from its dict, but a subclass with its own ``cat_file``
    (the benchmarks' latency store simulating an object store) must see every read."""
    from fsspec.implementations.memory import MemoryFileSystem

    from marin.execution.store.location import Location

    class CountingMemory(MemoryFileSystem):
        protocol = "countingmem"
        reads: list[str] = []

        def cat_file(self, path: Any, *args: Any, **kwargs: Any) -> Any:
            self.reads.append(path)
            return super().cat_file(path, *args, **kwargs)

    fs = CountingMemory()
    fs.pipe_file("/counted/a.json", b"{}")
    assert Location("countingmem://counted", fs, "/counted").read_file("/counted/a.json") == b"{}"
    assert CountingMemory.reads == ["/counted/a.json"]
    plain = MemoryFileSystem()
    plain.pipe_file("/plain-read/a.json", b"[]")
    assert (
        Location("memory://plain-read", plain, "/plain-read").read_file("/plain-read/a.json")
        == b"[]"
    )
    with pytest.raises(FileNotFoundError):
        Location("memory://plain-read", plain, "/plain-read").read_file("/plain-read/none")
    for path in ("/counted/a.json", "/plain-read/a.json"):
        plain.rm_file(path)
