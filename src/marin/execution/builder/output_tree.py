"""The output digest of a step: one hash of everything a reader of it can consume, for early cutoff.

A reader gets four things from a dependency: its output tree, the value its ``fn`` returned
(the record's ``result``, read through ``ctx.resolved(dep).result``), its artifact type and
its config (``ctx.resolved(dep).record.config``, which its fingerprint covers). The digest
covers all four: the artifact type, the result as canonical JSON, the fingerprint, and the
relative name, kind and content of every entry at or under the output path. When a rebuilt
step's new digest equals the one its dependents consumed, nothing they can read changed and
they need not be rebuilt. Comparing is only safe in one direction, so everything that is
not certain makes the digest **unknown** (no cutoff, the cascade happens as today).

- **Local disk** hashes the content (SHA-256), each file's and folder's permission bits, and
  every folder (an empty one too). A symbolic link anywhere in the output, or an output path
  that is itself a link, makes the digest unknown: what a reader finds behind a link is outside
  the output, and is never followed. Files are opened with ``O_NOFOLLOW``, so a link swapped in
  after the listing is not read either. FIFOs, sockets and devices make it unknown too (never
  opened: a reader's bytes from them cannot be known).
  A sparse file's holes are hashed by their length, never read.
- **Object stores** use the checksums the store already keeps, from one literal listing
  (``fs.find(path, detail=True)``): S3's ``ETag``, GCS's ``md5Hash`` (else ``crc32c``: 32 bits,
  so two different contents of one size match by chance once in four billion), with each
  object's size. No data is read back. Objects have no modes and folders no existence of their
  own: a zero-byte folder marker (a key ending in ``/``) holds nothing and is skipped; one that
  holds bytes makes the digest unknown. A multipart S3 upload's ETag depends on its part size,
  so the same bytes uploaded differently do not match: a missed cutoff, never a wrong one. A
  store that keeps no checksum gives an unknown digest.
- **memory://** hashes the bytes it holds (they are in this process already), and counts its
  empty folders.

A result with no canonical JSON form makes the digest unknown. Paths are literal (``find``
lists by prefix; only the path itself and paths under ``path/`` are kept, never a sibling that
shares a prefix). The scheme (``tree3:``) is part of every digest, so a digest of an older
scheme (``tree2:`` had no config, ``tree1:`` covered the files only) never equals a new one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from typing import Any

from marin.execution.digest.output import SCHEME, OutputDigest
from marin.execution.digest.output import is_output_digest as is_output_digest
from marin.execution.digest.output import same_digest as same_digest
from marin.execution.digest.output import same_output as same_output
from marin.execution.errors import StorageError
from marin.execution.store.location import Location, with_retries

_CHUNK = 1 << 20


def output_digest(
    location: Location,
    path: str,
    *,
    result: Any = None,
    artifact_type: str = "artifact",
    fingerprint: str = "",
) -> OutputDigest:
    """The digest of what a reader of the build at ``path`` consumes: the artifact type, the
    returned value ``result`` (canonical JSON), the config (its ``fingerprint``) and
    everything at or under ``path`` (the file system's syntax), literally.

    A path with nothing there has the digest of an empty tree (a step may write nothing).
    Storage that fails, a file with no checksum, a link, or a result with no canonical JSON
    gives an unknown digest, never an error: the digest only ever allows skipping work, so not
    knowing it is always safe.
    """
    try:
        header = _reader_view(result, artifact_type, fingerprint)
        if location.is_local:
            entries = list(_local_entries(path))
        elif location.is_memory:  # a scan of the process-wide store, unless nothing is there
            entries = _memory_entries(location, path) if location.exists(path) else []
        else:
            entries = _store_entries(location, path)
    except _Unknown as exc:
        return OutputDigest(None, unknown=str(exc))
    except (OSError, StorageError) as exc:
        return OutputDigest(None, unknown=f"the output could not be read ({exc})")
    entries.sort()
    h = hashlib.sha256(SCHEME.encode())
    h.update(header)
    total = files = 0
    kinds = set()
    for name, token, size in entries:
        h.update(json.dumps(name).encode() + b" " + token.encode() + b"\n")
        total += size
        kind = token.split(":", 1)[0]
        files += kind != _DIR
        kinds.add(kind)
    kinds &= {"sha256", "etag", "md5", "crc32c"}
    return OutputDigest(f"{SCHEME}:{h.hexdigest()}", files, total, None, "+".join(sorted(kinds)))


def _reader_view(result: Any, artifact_type: str, fingerprint: str) -> bytes:
    """The artifact type, the result and the config's fingerprint, as the digest's first line:
    a reader gets all three through ``ctx.resolved(dep)``. Entry lines start with a quoted
    name, so the two cannot be confused."""
    try:
        text = json.dumps(
            [artifact_type, result, fingerprint],
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
        return b"reader " + text.encode() + b"\n"
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise _Unknown(f"the step's returned value has no canonical JSON form ({exc})") from None


class _Unknown(Exception):
    """The digest cannot be known: a file the store keeps no checksum for."""


# --- local disk ---------------------------------------------------------------------------------


_DIR = "dir"


def _local_entries(root: str) -> Iterator[tuple[str, str, int]]:
    """``(relative name, token, size)`` of every file and folder (the output's own too)."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        yield _local_entry(root, "", st)
        return
    yield "", f"{_DIR}:{stat.S_IMODE(st.st_mode):o}", 0
    folders = [(root, "")]
    while folders:
        folder, rel = folders.pop()
        with os.scandir(folder) as scan:
            for entry in scan:
                name = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    folders.append((entry.path, name))
                    yield name, f"{_DIR}:{stat.S_IMODE(st.st_mode):o}", 0
                else:
                    yield _local_entry(entry.path, name, st)


def _local_entry(path: str, name: str, st: os.stat_result) -> tuple[str, str, int]:
    if not stat.S_ISREG(st.st_mode):
        raise _not_a_file(path, st)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a link after the listing
            raise _Unknown(f"{path} is a symbolic link (readers would follow it)") from None
        raise
    with os.fdopen(fd, "rb", buffering=0) as f:
        opened = os.fstat(f.fileno())
        if not stat.S_ISREG(opened.st_mode):
            raise _not_a_file(path, opened)
        token = _content_token(f, opened.st_size)
    mode = stat.S_IMODE(opened.st_mode)
    return name, f"{token}:{opened.st_size}:{mode:o}", opened.st_size


def _not_a_file(path: str, st: os.stat_result) -> _Unknown:
    """A link, FIFO, socket or device in an output: what a reader gets from it is unknown."""
    if stat.S_ISLNK(st.st_mode):
        return _Unknown(f"{path} is a symbolic link (readers would follow it)")
    return _Unknown(f"{path} is not a regular file or folder (mode {stat.S_IFMT(st.st_mode):o})")


def _content_token(f: Any, size: int) -> str:
    """The SHA-256 of a regular file's bytes. A sparse file (a preallocated 6 GiB checkpoint)
    is hashed by its extents instead, each data extent's length and bytes and each hole's
    length only, so its holes are never read: a distinct token (the same bytes written
    densely do not match it: a missed cutoff, never a wrong one)."""
    try:
        extents = _extents(f.fileno(), size)
    finally:
        os.lseek(f.fileno(), 0, os.SEEK_SET)  # probing moved the offset; hashing reads from 0
    if extents is None:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
    h = hashlib.sha256()
    for start, end, data in extents:
        h.update(b"%s%d\n" % (b"D" if data else b"H", end - start))
        offset = start
        while data and offset < end:
            chunk = os.pread(f.fileno(), min(_CHUNK, end - offset), offset)
            if not chunk:
                raise OSError(errno.EIO, "the file shrank while it was read")
            h.update(chunk)
            offset += len(chunk)
    return "sha256:holes:" + h.hexdigest()


def _extents(fd: int, size: int) -> list[tuple[int, int, bool]] | None:
    """``(start, end, is data)`` covering the file, or None when it has no hole (or the file
    system cannot say: then every byte is read)."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None or size == 0:
        return None
    try:
        if os.lseek(fd, 0, seek_hole) >= size:
            return None
    except OSError:  # EINVAL: no hole support here
        return None
    extents, position = [], 0
    while position < size:
        try:
            data = min(os.lseek(fd, position, seek_data), size)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: only a hole up to the end
                raise
            data = size
        if data > position:
            extents.append((position, data, False))
        if data >= size:
            break
        position = min(os.lseek(fd, data, seek_hole), size)
        extents.append((data, position, True))
    return extents


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- memory:// and object stores ---------------------------------------------------------------


def _memory_entries(location: Location, path: str) -> list[tuple[str, str, int]]:
    base = path.rstrip("/")
    store: dict[str, Any] = location.fs.store
    out = []
    for key, file in list(store.items()):
        name = _relative(key, base)
        if name is None:
            continue
        data = bytes(file.getvalue())
        out.append((name, f"sha256:{_sha(data)}:{len(data)}", len(data)))
    return out + _empty_memory_folders(location, base, [name for name, _, _ in out])


def _empty_memory_folders(
    location: Location, base: str, files: list[str]
) -> list[tuple[str, str, int]]:
    """The folders ``makedirs`` made under ``base`` that hold nothing: a reader lists them. (A
    folder holding files shows in their names, whether or not it was made explicitly.)"""
    folders = [n for d in list(location.fs.pseudo_dirs) if (n := _relative(d, base)) is not None]
    names = files + folders
    return [
        (folder, f"{_DIR}:", 0)
        for folder in folders
        if not any(n != folder and (not folder or n.startswith(folder + "/")) for n in names)
    ]


def _relative(key: str, base: str) -> str | None:
    """``key``'s name relative to ``base``: "" for ``base`` itself, None for anything else."""
    key = key.rstrip("/") if key.endswith("/") and key.rstrip("/") == base else key
    if key == base:
        return ""
    if key.startswith(base + "/"):
        return key[len(base) + 1 :]
    return None


def _store_entries(location: Location, path: str) -> list[tuple[str, str, int]]:
    base = path.rstrip("/")
    try:
        found = with_retries(
            lambda: location.fs.find(base, withdirs=False, detail=True), f"list {base}"
        )
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for key, info in dict(found).items():
        name = _relative(key, base)
        if name is None:
            continue
        if key.endswith("/"):
            if isinstance(info, dict) and type(info.get("size")) is int and info["size"] == 0:
                continue  # an empty folder marker: folders are not content on a store
            raise _Unknown(f"the folder marker {key} may hold bytes")
        size = _size(info)
        out.append((name, f"{_checksum(info, key)}:{size}", size))
    if not out:
        _confirm_empty(location, base)
    return out


def _size(info: Any) -> int:
    size = info.get("size") if isinstance(info, dict) else None
    return size if type(size) is int and size >= 0 else 0


def _confirm_empty(location: Location, base: str) -> None:
    """Raise unless nothing is at ``base``: an empty listing may be a failed one.

    fsspec's ``find`` (through ``walk``) and ``exists`` swallow errors, so a store that fails
    looks empty; ``info`` does not. Only a ``FileNotFoundError`` (or an existing folder with
    no files) confirms an output that holds nothing.
    """
    try:
        with_retries(lambda: location.fs.info(base), f"check {base}")
    except FileNotFoundError:
        return


def _checksum(info: Any, key: str) -> str:
    """The content checksum the store keeps for an object, tagged with its kind.

    GCS's ``md5Hash`` (absent on composite objects), S3's ``ETag`` (the MD5 of a single-part
    upload, a digest of the parts' MD5s otherwise), GCS's ``crc32c``. Never GCS's lowercase
    ``etag``: it names a generation, not content, so it changes when the same bytes are
    rewritten.
    """
    if isinstance(info, dict):
        for field, kind in (("md5Hash", "md5"), ("ETag", "etag"), ("crc32c", "crc32c")):
            value = info.get(field)
            if isinstance(value, str) and value.strip('"'):
                return f"{kind}:{value.strip(chr(34))}"
    raise _Unknown(f"the store keeps no content checksum for {key}")
