"""The commit path's per-build cost (issue 23): what it no longer repeats, and why that is safe.

A dependency's record is parsed once per distinct bytes (a record this process wrote is not
parsed at all), the lease is read once at commit, ids cost no system call, and the process's
provenance facts are looked up once per process and working directory. Each test pins one of those, and the premise
that keeps it as strict as before.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import fsspec
import pytest

from marin.execution.builder.commit import build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.ids import current_pid, new_id
from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.provenance import collect_provenance
from marin.execution.store import records
from marin.execution.store.lease.holder import _holder_id
from marin.execution.store.location import open_prefix
from marin.execution.store.records import ArtifactRecord, read_record, record_path

ROOT = Path(__file__).resolve().parents[1]


def _commit_cost() -> ModuleType:
    """``benchmarks/commit_cost.py``: its ``count_calls`` is the documented storage budget."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "commit_cost", ROOT / "benchmarks" / "commit_cost.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source(out_path: str) -> str:
    with fsspec.open(out_path, "w") as f:
        f.write("data")
    return "source"


def reader(out_path: str, src: str) -> str:
    with fsspec.open(out_path, "w") as f:
        f.write("read")
    return "reader"


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``ArtifactRecord.from_json`` call (the real parse runs; this only counts it)."""
    calls: list[str] = []
    real: Callable[[str], ArtifactRecord] = ArtifactRecord.from_json

    def counted(text: str) -> ArtifactRecord:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(ArtifactRecord, "from_json", staticmethod(counted))
    return calls


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_a_dependent_build_parses_no_record_this_process_wrote(
    backend: str, tmp_path: Path, parses: list[str]
) -> None:
    """Before: the dependency's record was parsed at the dependent's start and again before its
    commit (and once more by a later reader). Now the bytes this process wrote map to the
    record it built."""
    prefix = str(tmp_path / "p") if backend == "local" else f"memory://oh-{new_id()[:10]}"
    location = open_prefix(prefix)
    s = apply("oh/src", source, version="v0", out_path=OUT)
    use = apply("oh/use", reader, version="v0", src=s, out_path=OUT).lower()
    dep = use.deps[0]
    built = build_step(BuildRequest(dep, location))
    assert build_step(BuildRequest(use, location)).action == "built"
    assert read_record(location, dep.output_path) is built.record
    assert parses == []


def test_changed_bytes_are_parsed_and_checked_again(tmp_path: Path, parses: list[str]) -> None:
    """The cache is keyed by the whole bytes: a record edited on disk is validated afresh, and a
    malformed one reads as not built, as it always did."""
    location = open_prefix(str(tmp_path / "p"))
    spec = apply("oh/src", source, version="v0", out_path=OUT).lower()
    built = build_step(BuildRequest(spec, location)).record
    path = location.path(record_path(spec.output_path))
    assert read_record(location, spec.output_path) is built and parses == []
    text = built.to_json().replace(f'"duration_s": {built.duration_s}', '"duration_s": "slow"')
    assert text != built.to_json()
    Path(path).write_text(text)
    assert read_record(location, spec.output_path) is None  # a corrupt record: not built
    assert len(parses) == 1
    Path(path).write_text(built.to_json(indent=2))  # same record, other bytes: parsed once
    assert read_record(location, spec.output_path) == built
    assert read_record(location, spec.output_path) == built
    assert len(parses) == 2


def test_a_built_record_is_what_its_stored_json_parses_to(tmp_path: Path) -> None:
    """The premise of priming the cache at the commit: ``from_json(to_json(r)) == r``."""
    location = open_prefix(str(tmp_path / "p"))
    s = apply("oh/src", source, version="v0", out_path=OUT)
    use = apply("oh/use", reader, version="v0", src=s, out_path=OUT).lower()
    build_step(BuildRequest(use.deps[0], location))
    record = build_step(BuildRequest(use, location)).record
    assert record.inputs and record.provenance["lowered"]
    assert ArtifactRecord.from_json(record.to_json()) == record


def test_the_parse_cache_is_bounded() -> None:
    cache = records._ParsedRecords(3)
    rec: Any = object()
    for i in range(10):
        cache.put(str(i).encode(), rec)
    assert [cache.get(str(i).encode()) for i in range(10)] == [None] * 7 + [rec] * 3
    big = b"x" * (records._PARSED_MAX_BYTES + 1)
    cache.put(big, rec)
    assert cache.get(big) is None and cache.get(b"9") is rec  # not kept, and evicted nothing


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_the_commit_reads_the_lease_once(backend: str) -> None:
    """Before: the commit read the lease (proof of ownership) and the release under the same
    lock read it again to compare. The lock excludes every writer, so the first read is proof."""
    calls = _commit_cost().count_calls(backend, n=5)
    read = "open for reading" if backend == "local" else "cat_file"
    assert calls[read] == 1
    removed = "os.remove" if backend == "local" else "rm_file"
    assert calls[removed] == 1  # the lease is still released with the commit


def test_ids_are_unique_whatever_a_step_does_to_random() -> None:
    random.seed(0)
    first = new_id()
    random.seed(0)
    assert new_id() != first
    assert len({new_id() for _ in range(10_000)}) == 10_000
    assert len(first) == 32 and first[12] == "4"  # a version-4 UUID, as uuid4().hex spells it


class _Bits(random.Random):
    """A generator whose 128-bit draws are given: the extremes, then seeded random ones."""

    def __init__(self, given: list[int]) -> None:
        super().__init__(7)
        self.given = given

    def getrandbits(self, k: int) -> int:
        return self.given.pop(0) if self.given else super().getrandbits(k)


def test_an_id_is_the_uuid4_of_its_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    from marin.execution import ids

    given = [0, (1 << 128) - 1]
    monkeypatch.setattr(ids, "_rng", _Bits(list(given)))
    twin = _Bits(list(given))
    for _ in range(2000):
        assert new_id() == uuid.UUID(int=twin.getrandbits(128), version=4).hex


def test_a_forked_child_draws_other_ids_and_names_its_own_pid() -> None:
    collect_provenance()  # the parent's facts are cached before the fork
    parent_next = new_id.__globals__["_rng"].getstate()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave at once
        try:
            facts = f"{collect_provenance()['pid']} {current_pid()} {_holder_id().split(':')[1]}"
            os.write(write_end, f"{new_id()} {facts} {os.getpid()}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child_id, child_recorded, child_cached, child_holder, child_pid = pipe.read().split()
    os.waitpid(pid, 0)
    assert new_id.__globals__["_rng"].getstate() == parent_next  # the child drew, not us
    assert child_id != new_id()
    assert child_recorded == child_cached == child_holder == child_pid != str(os.getpid())
    assert collect_provenance()["pid"] == current_pid() == os.getpid()


def test_a_process_that_changes_directory_records_the_new_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    monkeypatch.chdir(ROOT)
    here = collect_provenance()["git_commit"]
    other = tmp_path / "other-checkout"
    other.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    for argv in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "other"]):
        subprocess.run(["git", *argv], cwd=other, check=True, env=env)
    theirs = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=other, capture_output=True, text=True, check=True
    ).stdout.strip()
    monkeypatch.chdir(other)
    assert collect_provenance()["git_commit"] == theirs != here


@pytest.mark.parametrize(
    "nanos",
    [
        0,
        1_764_700_799_999_999_999,  # the last nanosecond of a day: the next one is a new date
        1_764_700_800_000_000_000,
        1_764_700_800_000_999_999,  # below a millisecond: truncated, as isoformat does
        1_764_700_800_123_456_789,
        4_102_444_800_500_000_000,  # 2100-01-01, past 2038
    ],
)
def test_now_is_the_text_isoformat_gives(nanos: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime

    from marin.execution.pipeline import provenance

    def expected(ns: int) -> str:
        stamp = datetime.datetime.fromtimestamp(ns // 1_000_000_000, datetime.UTC)
        stamp += datetime.timedelta(microseconds=ns % 1_000_000_000 // 1000)
        return stamp.isoformat(timespec="milliseconds")

    # Each instant after another one in the same second, and after one in another second:
    # the per-second text is reused only for its own second.
    for before in (nanos - 1, nanos - 1_000_000_000, nanos + 1_000_000_000, nanos):
        for ns in (before, nanos):
            monkeypatch.setattr(provenance.time, "time_ns", lambda ns=ns: ns)
            assert provenance.now_iso() == expected(ns)


def _noop_reader(deps: list[str], out: str) -> None:
    """A no-op step with dependencies (the benchmarks' graphs' kind)."""


def _noop(out: str) -> None:
    return None


def test_a_first_local_build_looks_at_each_folder_it_makes_no_more_than_it_must(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first build's folders do not exist yet. Before: the output check looked at the missing
    step folder and then at the output inside it; the lease's ``makedirs`` stat'ed both folders
    before making them; and the listing after the lease looked at both again. Now a missing
    folder answers for everything below it, and a folder this build made with ``mkdir`` (which
    never follows a link) is known real. A link planted on the way is still refused:
    tests/reliability/test_storage_safety.py."""
    from marin.execution.lazy import lower
    from marin.execution.plan.decide import Policy, Stored, decide

    location = open_prefix(str(tmp_path))
    location.check_writable()
    first, second = lower(
        [apply(f"group/{n}", _noop, version="v1", out=OUT) for n in ("a", "b")], memo={}
    )
    build_step(BuildRequest(first, location))  # the group folder exists from here on, as in a run
    looked: list[tuple[str, str]] = []
    opened: list[str] = []
    for name in ("lstat", "stat"):
        real = getattr(os, name)

        def counted(path: Any, *a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            looked.append((_name, os.path.relpath(path, tmp_path)))
            return _real(path, *a, **k)

        monkeypatch.setattr(os, name, counted)

    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active[0] and event == "open" and str(args[0]).startswith(str(tmp_path)):
            opened.append(os.path.relpath(args[0], tmp_path))

    sys.addaudithook(hook)  # cannot be removed: `active` switches it off
    planned = decide(second, Stored(), [], Policy(), needed=True)
    build_step(BuildRequest(second, location, decision=planned, upstream=[]))
    found = list(looked)
    active[0] = False
    monkeypatch.undo()
    assert found == [
        ("lstat", "group.marin"),  # not inside another step's output: each folder above it
        ("lstat", "group/b.marin"),
        ("lstat", "group/b"),  # the output check: no step folder, so no output in it
        ("lstat", "group/b"),  # the lease's create: no link on the way to its folder
        ("lstat", "group/b/v1"),  # after fn: did it write an output?
    ]
    lease = "group/b/v1.marin/lease.json"
    assert [p.split(".tmp-")[0] for p in opened] == [
        lease,  # the create, once: the link check saw no folder, so it was made first
        f"{lease}.guard",  # the commit: the lock, the lease read back, the record
        lease,
        "group/b/v1.marin/record.json",
    ]
    assert read_record(location, second.output_path) is not None


def test_a_read_below_a_missing_folder_opens_nothing(tmp_path: Path) -> None:
    """The walk that checks a metadata file's folders for links already saw the folder missing:
    the read answers ``FileNotFoundError`` from that, as the open would have."""
    location = open_prefix(str(tmp_path))
    opened: list[str] = []
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active[0] and event == "open" and str(args[0]).startswith(str(tmp_path)):
            opened.append(str(args[0]))

    sys.addaudithook(hook)  # cannot be removed: `active` switches it off
    try:
        with pytest.raises(FileNotFoundError):
            location.read_file(f"{tmp_path}/step/v1.marin/record.json")
        assert not location.has_file(f"{tmp_path}/step/v1.marin/status.json")
        active[0] = False
        (tmp_path / "step" / "v1.marin").mkdir(parents=True)
        (tmp_path / "step" / "v1.marin" / "record.json").write_text("{}")
        active[0] = True
        assert location.read_file(f"{tmp_path}/step/v1.marin/record.json") == b"{}"
    finally:
        active[0] = False
    assert opened == [f"{tmp_path}/step/v1.marin/record.json"]  # only the file that is there


def test_a_metadata_read_is_one_read_with_no_fstat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each build reads its inputs' records twice and its lease once: every such read is an
    ``open``, one ``read`` and a ``close``. Before, an ``fstat`` for the size came first (one
    more system call, and one more hand-off of the GIL, per read)."""
    from marin.execution.store import location as storage

    record = tmp_path / "record.json"
    record.write_bytes(b'{"a": 1}')
    calls: list[str] = []
    for name in ("fstat", "read"):
        real = getattr(os, name)

        def counted(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            calls.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(os, name, counted)
    assert storage.read_no_follow(str(record)) == b'{"a": 1}'
    monkeypatch.undo()
    assert calls == ["read"]


def test_a_metadata_read_still_reads_whole_files_and_refuses_what_is_not_a_file(
    tmp_path: Path,
) -> None:
    """The premise: a short read of a regular file is its end. A file larger than the first
    read is read on to its end, an empty one is empty, and a folder or a FIFO (with no
    writer: an open that must not hang) is refused as not a regular file (red team r17-6: a
    folder was ``IsADirectoryError``, read as "no such file")."""
    from marin.execution.errors import StorageError
    from marin.execution.store import location as storage

    big = tmp_path / "big.json"
    payload = os.urandom(storage._FIRST_READ * 3 + 17)
    big.write_bytes(payload)
    assert storage.read_no_follow(str(big)) == payload
    exact = tmp_path / "exact.json"
    exact.write_bytes(payload[: storage._FIRST_READ])
    assert storage.read_no_follow(str(exact)) == payload[: storage._FIRST_READ]
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    assert storage.read_no_follow(str(empty)) == b""
    with pytest.raises(StorageError, match="not a regular file") as folder:
        storage.read_no_follow(str(tmp_path))
    assert folder.value.what == f"{tmp_path} is not a regular file"
    fifo = tmp_path / "record.json"
    os.mkfifo(fifo)
    with pytest.raises(StorageError, match="not a regular file"):
        storage.read_no_follow(str(fifo))
    # As a read of the step's record: refused, never parsed as an empty or garbled one.
    location = open_prefix(str(tmp_path))
    with pytest.raises(StorageError, match="not a regular file"):
        location.read_file(str(fifo))


_FILE_CALLS = {
    "open": "open", "read": "read", "write": "write", "close": "close", "fstat": "fstat",
    "lstat": "lstat", "stat": "stat", "mkdir": "mkdir", "makedirs": "makedirs",
    "rename": "rename", "replace": "rename", "remove": "unlink", "unlink": "unlink",
    "scandir": "scandir", "listdir": "listdir",
}  # fmt: skip
"""The ``os`` functions a local build reaches the file system through -> the system call they
make (``replace`` and ``rename`` are one, as are ``remove`` and ``unlink``)."""


def _file_calls(monkeypatch: pytest.MonkeyPatch, run: Callable[[], object]) -> dict[str, int]:
    """How many times ``run`` calls each of ``_FILE_CALLS`` and ``fcntl.flock``."""
    import collections
    import fcntl

    calls: collections.Counter[str] = collections.Counter()
    with monkeypatch.context() as patch:
        for module, names in ((os, _FILE_CALLS), (fcntl, {"flock": "flock"})):
            for name, call in names.items():
                real = getattr(module, name)

                def counted(*a: Any, _real: Any = real, _call: str = call, **k: Any) -> Any:
                    calls[_call] += 1
                    return _real(*a, **k)

                patch.setattr(module, name, counted)
        run()
    return dict(calls)


def test_the_same_file_system_calls_alone_are_the_calls_a_build_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmarks' floor for local builds (``commit_cost._syscalls_alone``: the row "the
    same file-system calls alone") is only a floor if it makes what a build makes: the same
    calls, as many times, for a first build and for one that reads an input's record."""
    from marin.execution.lazy import lower
    from marin.execution.plan.decide import Policy, plan_graph

    warm = open_prefix(str(tmp_path / "warm"))
    warm.check_writable()
    build_step(BuildRequest(lower([apply("warm", _noop, version="v0", out=OUT)], memo={})[0], warm))
    first = apply("s0", _noop_reader, version="v0", deps=[], out=OUT)
    second = apply("s1", _noop_reader, version="v0", deps=[first], out=OUT)
    specs = lower([first, second], memo={})
    plan = plan_graph(specs, specs[-1:], {}, Policy())
    location = open_prefix(str(tmp_path / "built"))
    location.check_writable()
    built: dict[str, ArtifactRecord] = {}

    def builds() -> None:
        for spec in specs:
            ups = plan.upstream(spec, built)
            outcome = build_step(BuildRequest(spec, location, decision=plan.of(spec), upstream=ups))
            built[spec.output_path] = outcome.record

    by_build = _file_calls(monkeypatch, builds)
    (tmp_path / "alone").mkdir()
    by_floor = _file_calls(
        monkeypatch, lambda: _commit_cost()._syscalls_alone(str(tmp_path / "alone"), 2, [0, 1])
    )
    assert by_build == by_floor
    assert by_build["read"] == 4  # the lease read back twice; the input's record twice
    assert "fstat" not in by_build
