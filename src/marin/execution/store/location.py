"""Where artifacts live: a prefix opened through fsspec.

Everything the engine reads or writes goes through a ``Location``, so local paths, ``file://``,
``memory://``, ``gs://`` and ``s3://`` behave alike. Local outputs are handed to ``fn`` as plain
paths, so user code can use ``pathlib``; other backends get full URLs for ``fsspec.open``.

Paths are literal. fsspec treats ``*``, ``?`` and ``[...]`` in a path as a glob pattern in
``rm``, ``glob``, ``expand_path``, ``copy`` and ``get``/``put`` on ``memory://``, ``s3://`` and
``gs://`` (a step once named ``**`` deleted every sibling's output). The engine therefore never
calls those: it deletes with :meth:`Location.remove_tree`, which lists with the literal ``find``
and removes the files it found one by one, keeping only paths at or under the literal path. The
operations it does call (``exists``, ``info``, ``isfile``, ``ls``, ``find``, ``du``,
``cat_file``, ``pipe_file``, ``rm_file``) were checked to be literal on local disk, ``memory://``,
s3fs and gcsfs (``tests/reliability/test_storage_safety.py`` keeps checking it). The prefix, which
a user or a trigger chooses, may hold those characters too: it is part of every literal path.

Symbolic links are never followed below the prefix on local disk (object stores have none). The
prefix itself may be a link (users point it at a bigger disk); every component below it that
Marin walks through to reach a metadata file or an output, and every metadata file, must be
real: :meth:`Location.check_no_links` walks the folders once per run (``lstat``, cached; a
folder it finds missing answers for all below it, and one Marin just made with ``mkdir`` needs
no look), and the files are opened with ``O_NOFOLLOW``, replaced by ``rename`` and deleted by
``unlink``, none of which follow a link. A link is refused with a ``SymlinkError`` naming it.
``fn`` may make links inside its own output: clearing an output deletes such links, never what
they point to.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

from marin.execution.errors import NotRegularFileError, StorageError, SymlinkError, one_line
from marin.execution.ids import jitter
from marin.execution.store.memory_folders import folder_exists, index_store
from marin.execution.store.prefix_policy import check_prefix

log = logging.getLogger("marin")
T = TypeVar("T")

PREFIX_ENV = "MARIN_PREFIX"
DEFAULT_PREFIX = "marin-artifacts"
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}

# Errors that retrying cannot fix: the answer is already definite.
_PERMANENT = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)
DURABLE_ENV = "MARIN_DURABLE"
RETRY_ATTEMPTS = 5
RETRY_BASE_DELAY = 0.05


def durable() -> bool:
    """``MARIN_DURABLE=1``: fsync outputs and records, so a built step survives a power cut.

    Without it a build is still atomic against process crashes (the record is renamed into place
    after ``fn`` returned), but after a power cut the file system may keep a record whose output
    blocks never reached the disk. Durable mode costs an fsync per output file.
    """
    return os.environ.get(DURABLE_ENV, "0") not in ("", "0", "false", "no")


def open_no_follow(path: str, flags: int) -> int:
    """``os.open`` that refuses a symbolic link as the file itself (``O_NOFOLLOW``).

    Raises:
        SymlinkError: ``path`` is a symbolic link.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise symlink_refused(path) from None
        raise


def open_local(path: str, mode: str) -> IO[Any]:
    """``open`` for Marin's own files: never through a symbolic link at ``path``, and creating
    missing parent folders only when it has to.

    Metadata files are written several times per step; a ``makedirs`` before each write costs a
    ``mkdir`` system call that fails with EEXIST almost every time.
    """
    try:
        return open(path, mode, opener=open_no_follow)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, mode, opener=open_no_follow)


_FIRST_READ = 32 * 1024
"""Bytes asked for by a metadata read's first ``read``: more than a record usually holds (a
no-op step's is about 2 KiB), so one read answers, with no ``fstat`` for the size first."""


def read_no_follow(path: str) -> bytes:
    """A local metadata file's bytes, never through a symbolic link (``SymlinkError``).

    ``O_NONBLOCK`` so a FIFO planted under a metadata file's name cannot hang the reader. A
    folder there is refused as a FIFO is (``not_a_regular_file``): never "no such file".

    One ``read`` in the common case, with no ``fstat`` before it (every system call hands the
    GIL to another thread, and each build reads its inputs' records twice): a regular file's
    read that returns less than it asked for has reached the file's end. Only an answer that
    says nothing (an empty read, a FIFO with nothing in it) or one that fills the whole read is
    looked at further: a file that is not a regular one is then refused, and a large one read
    on. A FIFO whose writer has already put bytes in reads like a planted file: those bytes,
    untrusted data like any metadata file's.
    """
    fd = open_no_follow(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        try:
            data = os.read(fd, _FIRST_READ)
        except IsADirectoryError:
            raise not_a_regular_file(path) from None
        except BlockingIOError:  # a FIFO with a writer and nothing written yet
            data = b""
        if 0 < len(data) < _FIRST_READ:
            return data
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise not_a_regular_file(path)
        chunks = [data]
        while data and (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def not_a_regular_file(path: str) -> NotRegularFileError:
    """The one refusal of a metadata file that is a folder, a FIFO or a device, wherever it is
    met (a read, or a listing of the step folder): ``marin plan`` and a run say the same."""
    return NotRegularFileError(
        f"{path} is not a regular file",
        "remove it: Marin's metadata files are plain files it writes itself",
    )


def symlink_refused(path: str) -> SymlinkError:
    return SymlinkError(
        f"{path} is a symbolic link; Marin never follows a link below the prefix to anything "
        "it reads, writes or deletes",
        "replace the link by the real folder or file (move what it points to into place), or "
        "point --prefix at the real location (the prefix itself may be a link)",
    )


def resolve_prefix(prefix: str | None = None) -> str:
    """The prefix argument, else ``$MARIN_PREFIX``, else ``./marin-artifacts``, in one spelling.

    Every spelling of one location resolves to one string, so that it is one prefix (one set of
    artifacts, one lease per step). A local path, also spelled ``file://``, ``file:`` or
    ``local://`` as fsspec allows, becomes a plain absolute path (``os.path.abspath`` folds
    ``.``, ``..`` and ``//``). An object-store URL loses its empty and ``.`` segments:
    ``memory://m/./``, ``memory:///m`` and ``memory://m//`` are ``memory://m``, and ``s3://b/./x``
    no longer writes keys with a literal ``.`` segment. A ``..`` there is refused rather than
    folded (an object store has no parent folders, and folding text must never move a prefix
    out of an allowed root). So is anything fsspec would read as more than a path: ``::`` (a
    chain of file systems), a second ``://``, and the object-version markers, ``?`` on
    ``s3://``, ``?`` and ``#`` on ``gs://``; and credentials (``ftp://user:pw@host``, or a
    token in an ``http(s)://`` query or fragment), which Marin would show wherever it names an
    artifact. (Checked against the source of fsspec 2026.9, s3fs and gcsfs: nothing else in a
    path string is interpreted; ``{}`` and ``%`` are literal.)

    Raises:
        StorageError: the prefix holds credentials (also an ``http(s)://`` query or fragment),
            a NUL byte, ``::``, a second ``://``, an object-version marker or a ``..`` segment
            in a URL, text before ``://`` that is not a URL scheme, or names no bucket; the
            message says what to give instead.
    """
    chosen = prefix or os.environ.get(PREFIX_ENV) or DEFAULT_PREFIX
    refuse_credentials(chosen)  # first: every other error below prints the prefix
    refuse_query(chosen)
    if "\x00" in chosen:  # refused before any I/O (os calls fail late with a ValueError)
        raise StorageError(
            f"prefix {chosen!r} contains a NUL byte, which no file system allows in a path",
            "remove it from the prefix",
        )
    if "::" in chosen:
        raise StorageError(
            f"prefix {chosen!r} contains '::', which fsspec reads as a chain of file systems "
            "(every path under it would open somewhere else)",
            "give a local path or a single URL such as s3://bucket/path",
        )
    local = _local_path(chosen)
    if local is None:
        return _normalise_url(chosen)
    resolved = os.path.abspath(os.path.expanduser(local))
    if resolved.startswith("//"):  # POSIX lets '//' mean something else; Linux and macOS don't
        resolved = "/" + resolved.lstrip("/")
    return resolved


def refuse_credentials(prefix: str) -> None:
    """Refuse ``scheme://user:password@host/...``: fsspec would log in with it, and Marin would
    print, log and send the secret wherever it names an artifact (lineage, assets, ``marin
    show``, plans, errors). The message shows the prefix without it."""
    scheme, sep, rest = prefix.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return
    shown = f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"
    raise StorageError(
        f"prefix {shown!r} holds credentials (user or password before '@')",
        "remove them from the prefix and give them through the file system's own credential "
        "settings (its environment variables, config file or ~/.netrc): Marin shows the prefix "
        "in logs, plans and lineage",
    )


_QUERY_SCHEMES = frozenset({"http", "https"})
"""URLs whose query (``?token=...``) and fragment fsspec's HTTP file system sends or keeps."""


def _before_marker(url: str, markers: str) -> str:
    """``url`` up to its first character of ``markers``, the rest shown as ``***``: what
    follows a ``?`` or ``#`` may be a token, never repeated in an error."""
    cut = min((i for i in (url.find(m) for m in markers) if i >= 0), default=-1)
    return url if cut < 0 else f"{url[: cut + 1]}***"


def refuse_query(prefix: str) -> None:
    """Refuse an ``http(s)://`` prefix with a query or a fragment: a token there
    (``?token=...``, ``#access_token=...``) would be sent with every request and shown
    wherever Marin names an artifact. The message shows the prefix without it."""
    scheme, sep, rest = prefix.partition("://")
    if not sep or scheme.lower() not in _QUERY_SCHEMES or not any(c in rest for c in "?#"):
        return
    raise StorageError(
        f"prefix {_before_marker(prefix, '?#')!r} holds a query or a fragment ('?' or '#'), "
        "which may carry a token",
        "give the prefix without it, and pass a token through the file system's own settings "
        "(headers in its storage options, or its environment): Marin shows the prefix in "
        "logs, plans and lineage",
    )


_LOCAL_SPELLINGS = ("file://", "local://", "file:", "local:")
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# s3fs cuts a key at "?versionId=" and gcsfs reads "?generation=" and "#<n>" as an object
# version: in a prefix they would cut every path under it short.
_VERSION_MARKERS = {"s3": "?", "s3a": "?", "gs": "?#", "gcs": "?#"}


def _local_path(prefix: str) -> str | None:
    """The path of a local prefix in any of fsspec's spellings, or None for another scheme."""
    for spelling in _LOCAL_SPELLINGS:
        if prefix.startswith(spelling):
            return prefix[len(spelling) :] or "/"
    return None if "://" in prefix else prefix


def _normalise_url(url: str) -> str:
    """``scheme://a/b``: empty and ``.`` segments dropped; what fsspec would misread refused."""
    scheme, _, rest = url.partition("://")
    if not _URL_SCHEME.fullmatch(scheme):
        raise StorageError(
            f"prefix {url!r} has {scheme!r} before '://', which is not a URL scheme",
            "give a local path without '://' or a URL such as s3://bucket/path",
        )
    if "://" in rest:
        raise StorageError(
            f"prefix {url!r} holds a second '://'", "give a single URL such as s3://bucket/path"
        )
    marker = next((c for c in _VERSION_MARKERS.get(scheme, "") if c in rest), None)
    if marker is not None:
        raise StorageError(
            f"prefix {_before_marker(url, marker)!r} contains {marker!r}, which {scheme}:// "
            "reads as the start of an object version, not as part of the path",
            f"give the prefix without {marker!r}, e.g. {scheme}://bucket/path",
        )
    segments = rest.split("/")
    if ".." in segments:
        raise StorageError(
            f"prefix {url!r} has a '..' segment",
            f"an object store has no parent folders; give the prefix without it, e.g. "
            f"{scheme}://bucket/path",
        )
    kept = [segment for segment in segments if segment not in ("", ".")]
    if not kept:
        raise StorageError(
            f"prefix {url!r} names no bucket or folder", f"add one, e.g. {scheme}://bucket/path"
        )
    return f"{scheme}://{'/'.join(kept)}"


def with_retries(op: Callable[[], T], what: str) -> T:
    """Run an I/O operation, retrying transient ``OSError``s with jittered exponential backoff.

    Definite answers (not found, exists, permission denied, a ``StorageError``) pass through at
    once.

    Raises:
        StorageError: an ``OSError`` that persisted through every attempt, naming the
            operation, with the last error as its cause.
    """
    for attempt in range(RETRY_ATTEMPTS):
        try:
            return op()
        except (*_PERMANENT, StorageError):
            raise
        except OSError as exc:
            if attempt == RETRY_ATTEMPTS - 1:
                raise StorageError(
                    f"storage kept failing: could not {what} after {RETRY_ATTEMPTS} attempts "
                    f"({type(exc).__name__}: {exc})",
                    "check that the storage is reachable and writable, then run again; "
                    "nothing was committed for this step",
                ) from exc
            delay = RETRY_BASE_DELAY * (2**attempt) * (1 + jitter())
            log.warning("retrying %s after %s (attempt %d)", what, exc, attempt + 1)
            time.sleep(delay)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Location:
    """A prefix opened through fsspec: every path Marin reads, writes or deletes goes through it,
    literally, and (on local disk) never through a symbolic link below the prefix."""

    url: str
    """The prefix as users see it: an absolute local path, or ``protocol://...``."""
    fs: fsspec.AbstractFileSystem
    root: str
    """The prefix in the file system's own path syntax."""
    _real_dirs: set[str] = field(default_factory=set, compare=False, repr=False)
    """Local folders below the prefix already seen to be real folders, not links (this run's)."""
    manifests_read: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The registry's manifests already read and trusted, by path (``registry.registered_at``):
    a manifest is written once, by conditional create, and never changed."""
    is_local: bool = field(init=False, compare=False, repr=False)
    """Local disk: links are checked, and writes are a temporary file renamed into place."""
    is_memory: bool = field(init=False, compare=False, repr=False)
    """``memory://``: one process-wide store, read and written straight through its dict."""

    _reads_store: bool = field(init=False, compare=False, repr=False)
    """``memory://`` whose reads are fsspec's own: read straight from its dict (a subclass
    that overrides ``cat_file``, such as the benchmarks' latency store, is called instead)."""

    def __post_init__(self) -> None:
        # Asked several times per storage call: worked out once per Location.
        object.__setattr__(self, "is_local", isinstance(self.fs, LocalFileSystem))
        object.__setattr__(self, "is_memory", isinstance(self.fs, MemoryFileSystem))
        reads_store = self.is_memory and type(self.fs).cat_file is MemoryFileSystem.cat_file
        object.__setattr__(self, "_reads_store", reads_store)
        if self.is_memory:
            index_store(self.fs)  # a folder's existence in one lookup (memory_folders)

    @property
    def reads_in_process(self) -> bool:
        """``memory://`` read straight from its dict: no I/O for threads to overlap."""
        return self._reads_store

    def check_no_links(self, path: str) -> bool:
        """Refuse (``SymlinkError``) when ``path`` or a folder on the way to it, below the
        prefix, is a symbolic link. Local disk only: object stores have no links. False when the
        walk found a folder on the way missing (so nothing is at ``path`` either), else True.

        One ``lstat`` per folder the first time this ``Location`` walks through it (a run opens
        one, so that is once per step per run); a folder seen real is remembered, so a step's
        later calls cost a set lookup. What does not exist yet stops the walk: nothing below it
        exists either, and Marin creates it as a real folder. The prefix itself is not checked.
        A link swapped in after the check is caught only where the final open or rename cannot
        follow links (see the module docstring); a folder swapped in between is a race against
        a writer who can already alter the prefix (docs/reliability.md, threat model).

        Raises:
            SymlinkError: naming the first link on the way.
        """
        if not self.is_local:
            return True
        known = self._real_dirs
        if path in known:
            return True
        root = self.root.rstrip("/")
        if not path.startswith(root + "/"):
            return True  # the prefix itself, which may be a link
        current = root
        for part in path[len(root) + 1 :].split("/"):
            current = f"{current}/{part}"
            if current in known:
                continue
            try:
                mode = os.lstat(current).st_mode
            except FileNotFoundError:
                return False
            except NotADirectoryError:
                return True  # below a file: the caller's own call says so
            if stat.S_ISLNK(mode):
                raise symlink_refused(current)
            if not stat.S_ISDIR(mode):
                return True
            known.add(current)
        return True

    def non_folder_on_the_way(self, relative: str) -> str | None:
        """The first entry at ``relative`` (a path below the prefix, relative to it) or on the
        way to it that is there but is neither a folder nor a link (links are
        ``check_no_links``'s), relative to the prefix, or None. Local disk: one ``lstat`` of
        the path; the folders above it are walked only when that ``lstat`` says one of them is
        not a folder (``ENOTDIR``). ``memory://``: a key at the path or above it (one dict
        lookup each), which fsspec's own writes below it refuse. None elsewhere: on an object
        store a key is in no folder's way."""
        if not relative or not (self.is_local or self.is_memory):
            return None
        parts = relative.split("/")
        on_the_way = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        if self.is_memory:
            return next((p for p in on_the_way if self.path(p) in self.fs.store), None)
        try:
            mode = os.lstat(self.path(relative)).st_mode
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            for part in on_the_way:
                try:
                    mode = os.lstat(self.path(part)).st_mode
                except OSError:
                    return None  # gone since: nothing in the way now
                if not stat.S_ISDIR(mode):
                    return None if stat.S_ISLNK(mode) else part
            return None
        return None if stat.S_ISDIR(mode) or stat.S_ISLNK(mode) else relative

    def _check_parent(self, path: str) -> bool:
        """``check_no_links`` of ``path``'s folder: False when that folder is not there."""
        parent = path.rpartition("/")[0]
        return parent in self._real_dirs or self.check_no_links(parent)

    def made_real_dir(self, path: str) -> None:
        """``path`` is a folder this process just made with ``mkdir`` (which never follows a
        link at the name it makes): a real folder, so ``check_no_links`` need not look at it."""
        if self.is_local:
            self._real_dirs.add(path)

    def read_file(self, path: str) -> bytes:
        """A metadata file's bytes. On local disk never through a link (the file itself is
        opened with ``O_NOFOLLOW``).

        Raises:
            FileNotFoundError: nothing is at ``path``.
            SymlinkError: ``path``, or a folder on the way to it, is a symbolic link.
            NotRegularFileError: ``path`` is not a regular file (a folder, a FIFO, a device:
                local disk).
            StorageError: storage kept failing.
        """
        if self._reads_store:
            # Straight from the store, as put_file writes it (cat_file's protocol stripping and
            # retries are for real backends; this dict cannot fail transiently).
            try:
                return bytes(self.fs.store[path].getbuffer())
            except KeyError:
                raise FileNotFoundError(errno.ENOENT, "No such file", path) from None
        if not self.is_local:
            data: bytes = with_retries(lambda: self.fs.cat_file(path), f"read {path}")
            return data
        if not self._check_parent(path):  # no folder, so no file: no open to find out
            raise FileNotFoundError(errno.ENOENT, "No such file", path)
        return read_no_follow(path)

    def rm_file(self, path: str) -> None:
        """Delete one metadata file. ``unlink`` deletes a link, never what it points to; the
        folders above are checked first.

        Raises:
            FileNotFoundError: nothing is at ``path``.
            SymlinkError: a folder between the prefix and ``path`` is a symbolic link (local
                disk).
            StorageError: storage kept failing.
        """
        if not self.is_local:
            with_retries(lambda: self.fs.rm_file(path), f"delete {path}")
            return
        self._check_parent(path)
        os.unlink(path)

    def has_file(self, path: str) -> bool:
        """Whether a metadata file exists (one lookup on ``memory://``).

        Raises:
            SymlinkError: a folder between the prefix and ``path`` is a symbolic link (local
                disk).
            StorageError: storage kept failing.
        """
        if self.is_memory:
            return path in self.fs.store
        if self.is_local:
            if not self._check_parent(path):
                return False
            try:
                return stat.S_ISREG(os.lstat(path).st_mode)
            except (FileNotFoundError, NotADirectoryError):
                return False
        return bool(with_retries(lambda: self.fs.isfile(path), f"check {path}"))

    def put_file(self, path: str, data: bytes) -> None:
        """Write a whole metadata file in one put (atomic on object stores and ``memory://``).

        On ``memory://`` the file goes straight into the store: ``pipe_file`` checks every parent
        folder with a scan of the whole store, which makes building N steps cost N².

        Raises:
            StorageError: storage kept failing.
        """
        if self.is_memory:
            self.fs.store[path] = MemoryFile(self.fs, path, data)
        else:
            with_retries(lambda: self.fs.pipe_file(path, data), f"write {path}")

    def exists(self, path: str) -> bool:
        """Whether anything (a file or a folder) is at ``path``, read literally.

        Raises:
            SymlinkError: a folder between the prefix and ``path`` is a symbolic link (local
                disk).
            StorageError: storage kept failing.
        """
        if self.is_local:
            # A missing folder on the way answers without a second look (a first build's output).
            return self._check_parent(path) and os.path.lexists(path)
        if self.is_memory:
            fs = self.fs
            return path in fs.store or path in fs.pseudo_dirs or folder_exists(fs, path)
        return bool(with_retries(lambda: self.fs.exists(path), f"check {path}"))

    def list_folder(self, path: str, *, detail: bool = False) -> list[Any]:
        """One listing of the folder ``path`` on an object store or ``memory://``, as
        ``fs.ls`` gives it, never served from nor left in the file system's listing cache: a
        later look in this process (the lease holder's, a run after a plan) must see what other
        runners wrote since (s3fs and gcsfs answer ``isfile`` from a cached parent listing).

        Raises:
            FileNotFoundError: no such folder.
            StorageError: storage kept failing.
        """
        invalidate = getattr(self.fs, "invalidate_cache", None)
        try:
            if invalidate is not None:
                invalidate(path)
            return list(with_retries(lambda: self.fs.ls(path, detail=detail), f"list {path}"))
        finally:
            if invalidate is not None:
                invalidate(path)

    def list_tree(self, path: str) -> list[str]:
        """Every file at or under ``path`` (literal), in the file system's syntax.

        ``find`` lists by prefix on every backend we support; the filter keeps only ``path``
        itself and paths under ``path/``, so a sibling that merely shares a prefix never appears.

        Raises:
            SymlinkError: a folder between the prefix and ``path`` is a symbolic link (local
                disk).
            StorageError: storage kept failing.
        """
        if self.is_local:
            self._check_parent(path)
            if not os.path.isdir(path) or os.path.islink(path):
                return [path] if os.path.lexists(path) else []
            return [os.path.join(root, name) for root, _, files in os.walk(path) for name in files]
        base = path.rstrip("/")
        try:
            found = with_retries(lambda: self.fs.find(base, withdirs=False), f"list {base}")
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [f for f in found if f.rstrip("/") == base or f.startswith(base + "/")]

    def remove_tree(self, path: str) -> None:
        """Delete ``path`` and everything under it, treating ``path`` literally on every backend.

        Never ``fs.rm(path, recursive=True)``: fsspec expands glob characters there. On local
        disk a link at ``path`` or inside it (``fn`` may make links in its output) is deleted
        itself, never followed (``shutil.rmtree`` on Linux works through folder descriptors).

        Raises:
            SymlinkError: a folder between the prefix and ``path`` is a symbolic link (local
                disk).
            StorageError: storage kept failing.
        """
        if self.is_local:
            self._check_parent(path)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.unlink(path)
            return
        for file in self.list_tree(path):
            with contextlib.suppress(FileNotFoundError):
                with_retries(lambda f=file: self.fs.rm_file(f), f"delete {file}")  # type: ignore[misc]
        if self.is_memory:  # folders made with makedirs are entries of their own there
            base = path.rstrip("/")
            for folder in [d for d in self.fs.pseudo_dirs if d == base or d.startswith(base + "/")]:
                self.fs.pseudo_dirs.remove(folder)
        invalidate = getattr(self.fs, "invalidate_cache", None)
        if invalidate is not None:
            invalidate(path)

    def path(self, relative: str) -> str:
        """A path inside the prefix, in the file system's syntax (for ``self.fs`` calls)."""
        return f"{self.root.rstrip('/')}/{relative}" if relative else self.root

    def url_for(self, relative: str) -> str:
        """A path inside the prefix as user code should see it."""
        return f"{self.url.rstrip('/')}/{relative}" if relative else self.url

    def check_writable(self) -> None:
        """Fail early, before any step runs, when the prefix cannot hold artifacts.

        Raises:
            StorageError: the prefix cannot be created, or (on local disk) is not writable.
        """
        try:
            self.fs.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"prefix {self.url} cannot be created ({exc.strerror or exc})",
                "choose a writable prefix with --prefix or MARIN_PREFIX",
            ) from exc
        if self.is_local and not os.access(self.root, os.W_OK | os.X_OK):
            raise StorageError(
                f"prefix {self.url} is not writable",
                "choose a writable prefix with --prefix or MARIN_PREFIX, or fix its permissions",
            )


def open_prefix(prefix: str | None = None) -> Location:
    """The prefix ``prefix`` (else ``$MARIN_PREFIX``, else ``./marin-artifacts``), opened.

    Raises:
        StorageError: the prefix is refused as text (``resolve_prefix``) or lies outside
            ``$MARIN_ALLOWED_PREFIXES``, before any I/O; or its protocol is unknown, its fsspec
            backend is not installed, or its storage cannot be reached.
    """
    given = prefix or os.environ.get(PREFIX_ENV)  # so the allow-list sees a '..' it spelled
    url = check_prefix(resolve_prefix(prefix), given)  # MARIN_ALLOWED_PREFIXES, before any I/O
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except ImportError as exc:
        extra = _EXTRAS.get(protocol)
        fix = (
            f"pip install 'marin-execution[{extra}]'"
            if extra
            else f"install the fsspec backend package for {protocol}:// ({exc})"
        )
        raise StorageError(f"no storage backend installed for {protocol}://", fix) from exc
    except ValueError as exc:
        raise StorageError(
            f"unknown storage protocol {protocol!r} in prefix {url}",
            "use a local path, memory://, gs://bucket/path or s3://bucket/path",
        ) from exc
    except OSError as exc:  # a file system that connects when made (ftp://, sftp://)
        raise StorageError(
            f"storage for {url} cannot be reached: {one_line(exc)}",
            "check the network, the host and the port, then run again",
        ) from exc
    return Location(url=url, fs=fs, root=root)
