"""The output digest (issue 25's early cutoff), on local disk, memory://, S3 and GCS emulators.

Same bytes give the same digest; one byte, one name or one file more gives another; paths are
literal; a symbolic link makes the digest unknown, never followed; local modes and folders count;
object stores are not read back; anything uncertain is unknown (which only ever costs a rebuild).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from hypothesis import example, given, settings
from hypothesis import strategies as st

from marin.execution.builder.output_tree import SCHEME, OutputDigest, output_digest, same_output
from marin.execution.store.location import Location, open_prefix

from .faulty_fs import FAULTS

TREE = {"part-0.txt": b"alpha\n", "sub/part-1.txt": b"beta\n", "sub/deeper/x.bin": b"\x00\x01"}


def write_tree(location: Location, relative: str, files: dict[str, bytes]) -> str:
    base = location.path(relative)
    for name, data in files.items():
        location.fs.makedirs(os.path.dirname(f"{base}/{name}"), exist_ok=True)
        location.fs.pipe_file(f"{base}/{name}", data)
    return base


def digest_of(location: Location, relative: str, files: dict[str, bytes]) -> OutputDigest:
    base = write_tree(location, relative, files)
    return output_digest(location, base)


def test_the_same_bytes_give_the_same_digest_and_one_byte_another(store_prefix: str) -> None:
    location = open_prefix(store_prefix)
    first = digest_of(location, "a/v1", TREE)
    again = digest_of(location, "b/v1", dict(TREE))  # another path, the same tree
    assert first.digest is not None and first.files == 3
    assert first.bytes == sum(len(v) for v in TREE.values())
    assert again == first
    assert same_output(first, again)
    one_byte = digest_of(location, "c/v1", {**TREE, "sub/part-1.txt": b"betb\n"})
    renamed = digest_of(
        location, "d/v1", {"part-0.txt": b"alpha\n", "sub/part-2.txt": b"beta\n", "sub/deeper/x.bin": b"\x00\x01"}
    )
    extra = digest_of(location, "e/v1", {**TREE, "more.txt": b""})
    digests = {first.digest, one_byte.digest, renamed.digest, extra.digest}
    assert len(digests) == 4
    assert not same_output(first, one_byte)


def test_a_rewrite_of_the_same_bytes_keeps_the_digest(store_prefix: str) -> None:
    """A rebuild writes its output again: the checksums a store keeps follow the content."""
    location = open_prefix(store_prefix)
    first = digest_of(location, "a/v1", TREE)
    location.remove_tree(location.path("a/v1"))
    assert digest_of(location, "a/v1", TREE) == first


def test_paths_are_literal_and_siblings_never_count(store_prefix: str) -> None:
    location = open_prefix(store_prefix)
    alone = digest_of(location, "x/[ab]", {"f": b"1"})
    write_tree(location, "x/a", {"f": b"other"})
    write_tree(location, "x/[ab]x", {"f": b"shares a prefix"})
    write_tree(location, "x/[ab].marin", {"record.json": b"{}"})
    assert output_digest(location, location.path("x/[ab]")) == alone
    assert alone.files == 1


def test_a_single_file_output_and_a_missing_one(store_prefix: str) -> None:
    location = open_prefix(store_prefix)
    location.fs.makedirs(location.path("s"), exist_ok=True)
    location.fs.pipe_file(location.path("s/v1"), b"one file")
    single = output_digest(location, location.path("s/v1"))
    assert single.digest is not None and single.files == 1 and single.bytes == 8
    missing = output_digest(location, location.path("nothing/here"))
    assert missing.digest is not None and missing.files == 0
    assert missing.digest != single.digest


def test_local_disk_and_memory_hash_the_same_content(tmp_path: Path) -> None:
    local = digest_of(open_prefix(str(tmp_path / "p")), "a/v1", TREE)
    memory = digest_of(open_prefix("memory://digest-agree"), "a/v1", TREE)
    open_prefix("memory://digest-agree").remove_tree("/digest-agree")
    assert local.digest is not None and memory.digest is not None
    assert (local.files, local.bytes, local.checksums) == (memory.files, memory.bytes, "sha256")


def test_a_symbolic_link_in_an_output_makes_it_unknown(tmp_path: Path) -> None:
    """A reader follows a link to whatever is behind it, outside the output: not seen, so
    unknown (never followed, never "unchanged")."""
    location = open_prefix(str(tmp_path / "p"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("first")
    for link, to in (("file-link", outside / "secret.txt"), ("sub/dir-link", outside)):
        base = write_tree(location, f"{link}/v1", {"data.txt": b"x", "sub/y": b"y"})
        os.symlink(to, f"{base}/{link}")
        digest = output_digest(location, base)
        assert digest.digest is None and not same_output(digest, digest)
        assert digest.unknown is not None and "symbolic link" in digest.unknown


def test_an_output_that_is_a_link_is_unknown_and_not_followed(tmp_path: Path) -> None:
    location = open_prefix(str(tmp_path / "p"))
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "big.bin").write_bytes(b"y" * 100)
    os.makedirs(location.path("a"))
    os.symlink(target, location.path("a/v1"))
    os.symlink(target / "big.bin", location.path("a/v2"))
    for version in ("v1", "v2"):
        digest = output_digest(location, location.path(f"a/{version}"))
        assert digest.digest is None and digest.unknown is not None
        assert "symbolic link" in digest.unknown


def test_a_fifo_is_unknown_and_never_opened(tmp_path: Path) -> None:
    location = open_prefix(str(tmp_path / "p"))
    base = write_tree(location, "a/v1", {"data.txt": b"x"})
    os.mkfifo(f"{base}/pipe")  # opening it for reading would block forever
    digest = output_digest(location, base)
    assert digest.digest is None and digest.unknown is not None
    assert "not a regular file" in digest.unknown


def test_modes_and_folders_are_part_of_a_local_digest(tmp_path: Path) -> None:
    location = open_prefix(str(tmp_path / "p"))
    first = digest_of(location, "a/v1", TREE)
    same = digest_of(location, "b/v1", TREE)
    assert first == same
    for name in ("part-0.txt", "sub"):  # a file's mode, a folder's mode
        path = location.path(f"b/v1/{name}")
        mode = os.stat(path).st_mode
        os.chmod(path, 0o700)
        assert output_digest(location, location.path("b/v1")) != first
        os.chmod(path, mode)
        assert output_digest(location, location.path("b/v1")) == first
    os.mkdir(location.path("b/v1/empty"))
    with_empty = output_digest(location, location.path("b/v1"))
    assert with_empty.digest != first.digest and with_empty.files == first.files
    os.makedirs(location.path("c/v1"))  # an empty folder is not nothing
    assert output_digest(location, location.path("c/v1")) != output_digest(
        location, location.path("d/v1")
    )


def test_the_result_and_the_artifact_type_are_part_of_the_digest(store_prefix: str) -> None:
    """What a reader gets through ``ctx.resolved(dep)`` besides the files."""
    location = open_prefix(store_prefix)
    base = write_tree(location, "a/v1", TREE)
    plain = output_digest(location, base)
    assert plain.digest is not None
    assert output_digest(location, base, result=None, artifact_type="artifact") == plain
    scored = output_digest(location, base, result={"ppl": 12.5})
    assert scored.digest is not None and scored != plain
    assert output_digest(location, base, result={"ppl": 12.5}) == scored
    assert output_digest(location, base, result={"ppl": 13.0}) != scored
    assert output_digest(location, base, result=[1, "a"]) != output_digest(
        location, base, result=[1, "b"]
    )
    assert output_digest(location, base, artifact_type="model").digest not in (None, plain.digest)
    no_json = output_digest(location, base, result=float("nan"))
    assert no_json.digest is None and no_json.unknown is not None
    assert "canonical JSON" in no_json.unknown


def test_a_digest_of_the_older_scheme_never_matches(tmp_path: Path) -> None:
    digest = digest_of(open_prefix(str(tmp_path / "p")), "a/v1", TREE)
    assert digest.digest is not None and digest.digest.startswith(SCHEME + ":")
    older = OutputDigest.from_record({**digest.to_record(), "digest": "tree1:" + "a" * 64})
    assert older.digest is None and not same_output(older, digest)


def _bytes_read() -> int:
    """The bytes this process passed through read()/pread() so far (Linux: /proc/self/io)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def _sparse(path: str, size: int, data: dict[int, bytes]) -> None:
    with open(path, "wb") as f:
        f.truncate(size)  # a preallocated checkpoint: all hole but what is written
        for offset, chunk in data.items():
            f.seek(offset)
            f.write(chunk)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts reads in /proc/self/io")
def test_a_sparse_file_is_digested_without_reading_its_holes(tmp_path: Path) -> None:
    location = open_prefix(str(tmp_path / "p"))
    base = write_tree(location, "a/v1", {"data.txt": b"x"})
    size, end = 6 << 30, (6 << 30) - (1 << 20)
    _sparse(f"{base}/ckpt.bin", size, {0: b"head" * 1024, end: b"tail" * 1024})
    with open(f"{base}/ckpt.bin", "rb") as f:
        if os.lseek(f.fileno(), 0, getattr(os, "SEEK_HOLE", 0)) >= size:
            pytest.skip("this file system does not report holes")
    before = _bytes_read()
    digest = output_digest(location, base)
    assert _bytes_read() - before < 16 << 20  # the data extents, never 6 GiB of holes
    assert digest.digest is not None and digest.bytes == size + 1
    again = output_digest(location, base)
    assert again.digest == digest.digest
    _sparse(f"{base}/ckpt.bin", size, {0: b"head" * 1024, end: b"tail" * 1024, 3 << 30: b"!"})
    assert output_digest(location, base).digest != digest.digest  # a byte in a hole counts
    _sparse(f"{base}/ckpt.bin", size, {0: b"head" * 1024, end: b"tail" * 1023 + b"TAIL"})
    assert output_digest(location, base).digest != digest.digest  # and one in a data extent


class _NoReads:
    """Wraps a real object-store file system: listing works, reading any data fails."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        if name in ("open", "_open", "cat", "cat_file", "_cat_file", "get", "get_file", "read_block"):
            raise AssertionError(f"the output digest read data back ({name})")
        return getattr(self._fs, name)


@pytest.mark.parametrize("backend", ["s3", pytest.param("gs", marks=pytest.mark.slow)])
def test_object_stores_use_their_checksums_and_read_nothing_back(
    backend: str, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue("s3_server" if backend == "s3" else "gcs_server")
    prefix = f"{'s3' if backend == 's3' else 'gs'}://marin-tests/nr-{os.getpid()}-{id(request)}"
    location = open_prefix(prefix)
    base = write_tree(location, "a/v1", TREE)
    wrapped = Location(location.url, _NoReads(location.fs), location.root)  # type: ignore[arg-type]
    digest = output_digest(wrapped, base)
    assert digest.digest is not None and digest.files == 3
    assert digest.checksums == {"s3": "etag", "gs": "md5"}[backend]
    assert digest == output_digest(location, base)
    location.remove_tree(location.path(""))


def test_a_store_without_checksums_is_unknown(tmp_path: Path) -> None:
    """A backend whose listing carries no content checksum: not guessed, not read back."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.txt").write_text("x")
    fs = DirFileSystem(path=str(tmp_path), fs=fsspec.filesystem("file"))
    digest = output_digest(Location("dir://", fs, ""), "a")
    assert digest.digest is None
    assert digest.unknown is not None and "no content checksum" in digest.unknown
    assert not same_output(digest, digest)


def test_storage_that_keeps_failing_gives_unknown_not_an_error(tmp_path: Path) -> None:
    FAULTS.clear()
    FAULTS.add("ls info", r"/out", times=None)
    try:
        location = open_prefix(f"faulty://{tmp_path}")
        digest = output_digest(location, location.path("out"))
    finally:
        FAULTS.clear()
    assert digest.digest is None
    assert digest.unknown is not None and "could not be read" in digest.unknown


# --- stored digests are untrusted data ----------------------------------------------------------


def test_a_stored_output_digest_round_trips(tmp_path: Path) -> None:
    digest = digest_of(open_prefix(str(tmp_path / "p")), "a/v1", TREE)
    assert OutputDigest.from_record(json.loads(json.dumps(digest.to_record()))) == digest
    assert OutputDigest.from_record(None).digest is None


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
VALID = {"digest": SCHEME + ":" + "a" * 64, "files": 2, "bytes": 10, "unknown": None, "checksums": "etag"}


def _check(field: str, value: Any) -> None:
    loaded = OutputDigest.from_record({**VALID, field: value})
    assert isinstance(loaded, OutputDigest)
    if loaded.digest is not None:  # only a well-formed digest is ever compared
        assert loaded.digest.startswith(SCHEME + ":") and len(loaded.digest) == 70
        assert type(loaded.files) is int and type(loaded.bytes) is int


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(VALID)), _JSON)
@example("files", True)  # bool is an int in Python: not a count
@example("digest", SCHEME + ":" + "A" * 64)
@example("digest", "tree1:" + "a" * 64)  # the older scheme
@example("bytes", -1)
@example("checksums", "\x1b[31m")  # shown to people: no terminal escapes
def test_a_corrupt_stored_output_digest_loads_as_unknown_or_valid(field: str, value: Any) -> None:
    _check(field, value)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(sorted(VALID)), _JSON)
def test_a_corrupt_stored_output_digest_random_run(field: str, value: Any) -> None:
    _check(field, value)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(_JSON)
def test_any_json_loads_as_an_output_digest(value: Any) -> None:
    assert isinstance(OutputDigest.from_record(value), OutputDigest)


def test_an_s3_folder_marker_hides_nothing(s3_server: dict[str, str]) -> None:
    """A zero-byte key ending in ``/`` (what consoles make for a folder) holds nothing and is
    skipped; a key ending in ``/`` that holds bytes makes the digest unknown."""
    import boto3

    location = open_prefix(f"s3://marin-tests/marker-{os.getpid()}")
    base = write_tree(location, "a/v1", TREE)
    before = output_digest(location, base)
    client = boto3.client("s3", endpoint_url=s3_server["FSSPEC_S3_ENDPOINT_URL"])
    key = base.split("/", 1)[1]
    client.put_object(Bucket="marin-tests", Key=f"{key}/sub/", Body=b"")
    location.fs.invalidate_cache()
    assert output_digest(location, base) == before
    client.put_object(Bucket="marin-tests", Key=f"{key}/sub/", Body=b"hidden bytes")
    location.fs.invalidate_cache()
    marked = output_digest(location, base)
    assert marked.digest is None and marked.unknown is not None
    location.remove_tree(location.path(""))
