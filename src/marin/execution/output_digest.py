"""The output digest of a step: one hash of its output tree, for early cutoff.

A digest covers the relative name and the content of every file at or under the output path.
When a rebuilt step's new digest equals the one its dependents consumed, their inputs did not
change and they need not be rebuilt. Comparing is only safe in one direction, so everything
that is not certain makes the digest **unknown** (no cutoff, the cascade happens as today).

- **Local disk** hashes the content (SHA-256). Symbolic links inside an output are never
  followed: a link is hashed by the text it points to, so a link to data outside the output
  cannot hide a change there, nor make Marin read a file it was not given. Files are opened
  with ``O_NOFOLLOW`` so a link swapped in after the listing is not read either; FIFOs, sockets
  and devices count by their kind, never opened.
  A sparse file's holes are hashed by their length, never read.
- **Object stores** use the checksums the store already keeps, from one literal listing
  (``fs.find(path, detail=True)``): S3's ``ETag``, GCS's ``md5Hash`` (else ``crc32c``: 32 bits,
  so two different contents of one size match by chance once in four billion), with each
  object's size. No data is read back. A multipart S3 upload's ETag depends on its part
  size, so the same bytes uploaded differently do not match: a missed cutoff, never a wrong one.
  A store that keeps no checksum gives an unknown digest.
- **memory://** hashes the bytes it holds (they are in this process already).

Paths are literal (``find`` lists by prefix; only the path itself and paths under ``path/`` are
kept, never a sibling that shares a prefix).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from marin.execution.errors import StorageError
from marin.execution.storage import Location, with_retries

SCHEME = "tree1"
_CHECKSUMS = re.compile(r"^[a-z0-9+]{0,40}$")
_HEX64 = re.compile(r"[0-9a-f]{64}")
"""The 64 hex digits after ``tree1:`` (``fullmatch``: nothing more, no trailing newline)."""
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class OutputDigest:
    """The digest of one output tree; ``digest`` is None when it cannot be known (``unknown``)."""

    digest: str | None
    files: int = 0
    bytes: int = 0
    unknown: str | None = None
    checksums: str = ""
    """How the files were summarised: ``sha256`` (content hashed), ``etag``, ``md5``,
    ``crc32c`` (the store's), joined by ``+`` when mixed; shown, never compared."""

    def to_record(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "files": self.files,
            "bytes": self.bytes,
            "unknown": self.unknown,
            "checksums": self.checksums,
        }

    @classmethod
    def from_record(cls, data: Any) -> OutputDigest:
        """A stored digest, validated: anything malformed loads as unknown, never raises."""
        if data is None:
            return cls(None, unknown="the record has no output digest (written before them)")
        if not isinstance(data, dict):
            return cls(None, unknown="the stored output digest is unreadable")
        digest, files, size = data.get("digest"), data.get("files"), data.get("bytes")
        unknown, checksums = data.get("unknown"), data.get("checksums", "")
        valid = (
            (digest is None or is_output_digest(digest))
            and type(files) is int
            and files >= 0
            and type(size) is int
            and size >= 0
            and (unknown is None or (isinstance(unknown, str) and len(unknown) <= 1000))
            and isinstance(checksums, str)
            and _CHECKSUMS.match(checksums) is not None
        )
        if not valid:
            return cls(None, unknown="the stored output digest is unreadable")
        assert isinstance(files, int) and isinstance(size, int)
        return cls(digest, files, size, unknown if digest is None else None, checksums)


def is_output_digest(value: Any) -> bool:
    """Whether ``value`` is a well-formed stored output digest (``tree1:`` and 64 hex digits)."""
    if not isinstance(value, str) or not value.startswith(SCHEME + ":"):
        return False
    return _HEX64.fullmatch(value, len(SCHEME) + 1) is not None


def same_output(consumed: OutputDigest | None, rebuilt: OutputDigest | None) -> bool:
    """Whether a rebuild produced exactly what a dependent consumed: both known and equal."""
    return (
        consumed is not None
        and rebuilt is not None
        and consumed.digest is not None
        and consumed.digest == rebuilt.digest
    )


def same_digest(consumed: str | None, rebuilt: OutputDigest) -> bool:
    """Whether a rebuild's output has the digest a dependent consumed (both known)."""
    return consumed is not None and consumed == rebuilt.digest


def output_digest(location: Location, path: str) -> OutputDigest:
    """The digest of everything at or under ``path`` (the file system's syntax), literally.

    A path with nothing there has the digest of an empty tree (a step may write nothing).
    Storage that fails, or a file with no checksum, gives an unknown digest, never an error:
    the digest only ever allows skipping work, so not knowing it is always safe.
    """
    try:
        if location.is_local:
            entries = list(_local_entries(path))
        elif location.is_memory:
            entries = _memory_entries(location, path)
        else:
            entries = _store_entries(location, path)
    except _Unknown as exc:
        return OutputDigest(None, unknown=str(exc))
    except (OSError, StorageError) as exc:
        return OutputDigest(None, unknown=f"the output could not be read ({exc})")
    entries.sort()
    h = hashlib.sha256(SCHEME.encode())
    total = 0
    kinds = set()
    for name, token, size in entries:
        h.update(json.dumps(name).encode() + b" " + token.encode() + b"\n")
        total += size
        kinds.add(token.split(":", 1)[0])
    kinds &= {"sha256", "etag", "md5", "crc32c"}
    return OutputDigest(
        f"{SCHEME}:{h.hexdigest()}", len(entries), total, None, "+".join(sorted(kinds))
    )


class _Unknown(Exception):
    """The digest cannot be known: a file the store keeps no checksum for."""


# --- local disk ---------------------------------------------------------------------------------


def _local_entries(root: str) -> Iterator[tuple[str, str, int]]:
    """``(relative name, token, size)`` of every entry, links and special files by kind."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        yield _local_entry(root, "", st)
        return
    folders = [(root, "")]
    while folders:
        folder, rel = folders.pop()
        with os.scandir(folder) as scan:
            for entry in scan:
                name = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    folders.append((entry.path, name))
                else:
                    yield _local_entry(entry.path, name, st)


def _local_entry(path: str, name: str, st: os.stat_result) -> tuple[str, str, int]:
    if stat.S_ISLNK(st.st_mode):
        return name, "link:" + _sha(os.fsencode(os.readlink(path))), 0
    if not stat.S_ISREG(st.st_mode):
        return name, f"special:{stat.S_IFMT(st.st_mode):o}", 0
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a link after the listing: hash it as one
            return name, "link:" + _sha(os.fsencode(os.readlink(path))), 0
        raise
    with os.fdopen(fd, "rb", buffering=0) as f:
        opened = os.fstat(f.fileno())
        if not stat.S_ISREG(opened.st_mode):
            return name, f"special:{stat.S_IFMT(opened.st_mode):o}", 0
        token = _content_token(f, opened.st_size)
    return name, f"{token}:{opened.st_size}", opened.st_size


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
    return out


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
        if key.endswith("/"):
            continue  # a folder marker object: folders are not content
        name = _relative(key, base)
        if name is None:
            continue
        size = info.get("size") if isinstance(info, dict) else None
        size = size if type(size) is int and size >= 0 else 0
        out.append((name, f"{_checksum(info, key)}:{size}", size))
    if not out:
        _confirm_empty(location, base)
    return out


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
