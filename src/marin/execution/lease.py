"""A lease: the cross-process, cross-runner lock that makes a build exactly-once.

The lease is a small JSON file beside the output (``<output>.marin/lease.json``) holding the
holder's id (host, pid, thread), a random token and an expiry. Every backend is reached through
one small interface, :class:`LeaseStore`, with four operations: an atomic **create-if-absent**, a
**read** that returns the content with a version, a compare-and-swap **replace** and a
conditional **delete** (both against that version), plus a **lock** that makes a read-check-write
sequence exclusive where the backend can. The stores:

=================  ==========================================  ================================
backend            create-if-absent                            replace / delete / commit
=================  ==========================================  ================================
local disk         write a temp file, ``link()`` it into        under ``flock`` on a guard file:
                   place (fails if present: ``O_EXCL``          compare, then rename into place
                   semantics, and the file is never seen
                   half-written)
``memory://``      under a process-wide lock (the store         under the same lock
                   lives in this process)
``s3://`` (s3fs)   ``PutObject`` with ``If-None-Match: *``      ``PutObject`` / ``DeleteObject``
                                                                with ``If-Match: <ETag>``
``gs://`` (gcsfs)  upload with ``ifGenerationMatch=0``          upload / delete with
                                                                ``ifGenerationMatch=<generation>``
anything else      ``pipe_file(mode="create")`` when the        read, compare, write: **not
                   backend supports it, else check-then-write   atomic** (the weaker fallback)
=================  ==========================================  ================================

With the fallback two runners that start a step in the same instant may both build it; each
still writes a complete record, so nothing half-written is ever served, but ``fn`` can run twice.

A lease whose expiry has passed is taken over. On Linux a lease on local disk whose holder
process is gone (same machine, same PID namespace, and that PID is dead or reused) is taken over
at once instead of after the TTL, so a runner killed by SIGKILL or the OOM killer does not stall
the next run. Set ``MARIN_LEASE_CHECK_PID=0`` to rely on the TTL alone.

While a step runs a heartbeat renews its lease. One shared thread renews every lease the process
holds. A holder that cannot renew has lost the lease and must not commit: :meth:`Lease.commit`
re-proves ownership and writes the record under the same lock (local disk, ``memory://``), or
right after a compare-and-swap renewal that extends the expiry by a whole TTL (S3, GCS).
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import heapq
import itertools
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from fsspec.asyn import sync
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from marin.execution import faults
from marin.execution.errors import ConfigError
from marin.execution.records import lease_path, write_atomic
from marin.execution.storage import Location, read_no_follow, with_retries

log = logging.getLogger("marin")

TTL_ENV = "MARIN_LEASE_TTL"
CHECK_PID_ENV = "MARIN_LEASE_CHECK_PID"
DEFAULT_TTL_S = 60.0
MAX_TTL_S = 7 * 24 * 3600.0
"""A lease longer than a week is a mistake (or a garbled file): it would block a step for good."""
CLOCK_SKEW_S = 300.0
"""How far a lease's expiry may lie beyond now plus the lease's own TTL: the clock skew tolerated
between the hosts that share a prefix. Further ahead, the lease was written by a clock running
ahead, or planted, and it is taken over instead of blocking its step for days."""


def ttl_from_env() -> float:
    """``$MARIN_LEASE_TTL`` in seconds (default 60), checked: a positive, finite number."""
    raw = os.environ.get(TTL_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = math.nan
    if not (0 < ttl <= MAX_TTL_S):
        raise ConfigError(
            f"{TTL_ENV}={raw!r} is not a lease duration in seconds",
            f"set {TTL_ENV} to a number of seconds above 0 and at most {MAX_TTL_S:.0f} "
            f"(default {DEFAULT_TTL_S:.0f}), or unset it",
        )
    return ttl


_MEMORY_LOCK = threading.RLock()
_held: set[Lease] = set()
"""The process's registry of the leases it holds."""
_held_lock = threading.Lock()
_enclosing: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "marin_enclosing_builds", default=frozenset()
)
"""Tokens of the leases held by the builds whose ``fn`` encloses this context (a ``run()``
called from inside ``fn`` copies the context into its worker threads)."""


@contextlib.contextmanager
def enclosing(lease: Lease) -> Iterator[None]:
    """While ``fn`` runs under ``lease``: any build started from inside it knows the lease is
    its own enclosing build's, and fails instead of waiting for it forever."""
    reset = _enclosing.set(_enclosing.get() | {lease.token})
    try:
        yield
    finally:
        _enclosing.reset(reset)


def held_by_enclosing_build(info: LeaseInfo) -> bool:
    """Whether ``info`` is the lease of a build whose ``fn`` is running this very code."""
    return bool(info.token) and info.token in _enclosing.get()


def release_all_held() -> int:
    """Release every lease this process holds: the Ctrl-C / SIGTERM path."""
    with _held_lock:
        leases = list(_held)
    for lease in leases:
        with contextlib.suppress(OSError):
            lease.release()
    return len(leases)


# -- who holds a lease ---------------------------------------------------------------------------


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _process_start(pid: int) -> str | None:
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # Field 22 (starttime) counted after the parenthesised command name, which may hold spaces.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def _machine() -> str | None:
    """This kernel boot and PID namespace: PIDs are comparable only within one."""
    boot = _read_text("/proc/sys/kernel/random/boot_id")
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{pidns}" if boot else None


_MACHINE = _machine()


_process_ids: dict[int, str | None] = {}


def _process_id() -> str | None:
    """``<boot>/<pidns>/<pid>/<start time>``: names this process and no other, ever.

    Looked up once per process (keyed by pid, so a forked child gets its own).
    """
    if _MACHINE is None:
        return None
    pid = os.getpid()
    if pid not in _process_ids:
        start = _process_start(pid)
        _process_ids[pid] = f"{_MACHINE}/{pid}/{start}" if start else None
    return _process_ids[pid]


def _holder_is_dead(process: str | None) -> bool:
    """True only when certain: same machine and PID namespace, and that process is gone."""
    if not process or _MACHINE is None or not process.startswith(_MACHINE + "/"):
        return False
    if os.environ.get(CHECK_PID_ENV, "1") in ("0", "false", "no"):
        return False
    pid, _, start = process[len(_MACHINE) + 1 :].partition("/")
    if not (pid.isascii() and pid.isdigit()):  # "²".isdigit(), but int("²") fails
        return False
    return _process_start(int(pid)) != start


@dataclass(frozen=True)
class LeaseInfo:
    """One lease as read from storage: who holds it, until when, and since when."""

    holder: str
    token: str
    expires_at: float
    process: str | None = None
    ttl: float | None = None
    """The holder's TTL (None in leases written before it was stored)."""
    started_at: str | None = None
    """When the holding attempt began (UTC, ISO 8601), if the lease says."""
    skewed: bool = False
    """Its expiry lies further beyond now than its TTL allows (``CLOCK_SKEW_S``): a clock
    running ahead, or a planted lease. It protects nothing, like an expired one."""
    raw: bytes = field(default=b"", repr=False, compare=False)
    """The bytes it was parsed from (what a conditional delete compares against)."""

    @property
    def expired(self) -> bool:
        return time.time() >= self.expires_at

    @property
    def holder_dead(self) -> bool:
        return _holder_is_dead(self.process)

    @property
    def on_this_machine(self) -> bool:
        """Held by a process of this machine and PID namespace (whose liveness is knowable)."""
        return bool(self.process and _MACHINE and self.process.startswith(_MACHINE + "/"))

    @property
    def live(self) -> bool:
        """Whether it still protects its step: readable, not expired or skewed, holder alive."""
        return not (self.garbled or self.skewed or self.expired or self.holder_dead)

    def describe(self) -> str:
        remaining = self.expires_at - time.time()
        return f"{self.holder} (expires in {remaining:.0f}s)"

    def who(self) -> str:
        """Host, pid and thread of the holder, and since when: for ``marin unlock``."""
        parts = self.holder.split(":")  # host:pid:thread, as ``_holder_id`` writes it
        host = ":".join(parts[:-2]) if len(parts) >= 3 else self.holder
        pid = parts[-2] if len(parts) >= 3 else "?"
        since = f", since {self.started_at}" if self.started_at else ""
        return f"host {host}, pid {pid}{since}"

    @property
    def garbled(self) -> bool:
        return self.holder == GARBLED

    @classmethod
    def parse(cls, raw: bytes, default_ttl: float = DEFAULT_TTL_S) -> LeaseInfo:
        """Any bytes: a well-formed lease, or a garbled one that counts as expired.

        A torn, foreign or hostile lease file protects nothing. Expiries that are not finite,
        not positive, or further ahead than the longest allowed TTL are garbled too: a lease
        expiring at NaN or 1e300 would otherwise be waited on forever. An expiry within that
        week but beyond now plus the lease's own TTL (``default_ttl``, the reader's, for leases
        that do not store theirs) and ``CLOCK_SKEW_S`` is ``skewed``: taken over like an
        expired one.
        """
        try:
            data = json.loads(raw.decode())
            holder, token, expires = data["holder"], data["token"], data["expires_at"]
            process = data.get("process")
            ttl = data.get("ttl")
            started_at = data.get("started_at")
        except (
            ValueError,
            KeyError,
            TypeError,
            UnicodeDecodeError,
            AttributeError,
            RecursionError,
        ):
            return cls(GARBLED, "", 0.0)
        if (
            not isinstance(holder, str)
            or not isinstance(token, str)
            or not token
            or not _is_number(expires)
            or not (process is None or isinstance(process, str))
            or not (ttl is None or (_is_number(ttl) and 0 < ttl <= MAX_TTL_S))
        ):
            return cls(GARBLED, "", 0.0)
        expires_at, now = float(expires), time.time()
        if not (0 < expires_at <= now + MAX_TTL_S):
            return cls(GARBLED, "", 0.0)
        own_ttl = default_ttl if ttl is None else float(ttl)
        skewed = expires_at > now + own_ttl + CLOCK_SKEW_S
        since = started_at if isinstance(started_at, str) else None
        return cls(holder, token, expires_at, process, ttl, since, skewed, raw)


def _is_number(value: Any) -> bool:
    """A finite int or float (not a bool). ``10**400`` is none: no float holds it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


GARBLED = "<unreadable>"
GARBLED_GRACE_S = 1.0
"""On a store whose create may be seen half done (``torn_create``), how long the same
unparsable lease must stay so before it is taken over: a competitor may still be writing it."""


def _unparsable(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return True
    return False


_garbled_seen: dict[str, tuple[bytes, float]] = {}
_garbled_lock = threading.Lock()


def _garbled_for_a_while(path: str, raw: bytes) -> bool:
    now = time.monotonic()
    with _garbled_lock:
        seen = _garbled_seen.get(path)
        if seen is None or seen[0] != raw:
            _garbled_seen[path] = (raw, now)
            return False
        if now - seen[1] < GARBLED_GRACE_S:
            return False
        del _garbled_seen[path]
        return True


_HOST = socket.gethostname()


def _holder_id() -> str:
    return f"{_HOST}:{os.getpid()}:{threading.get_ident()}"


# -- backends ------------------------------------------------------------------------------------


class LeaseStore(Protocol):
    """The operations a lease needs from a backend. ``version`` is opaque to callers."""

    kind: str
    atomic: bool
    """False for the check-then-write fallback."""
    torn_create: bool
    """True if a competitor may read a lease ``create`` has made but not yet filled."""

    def create(self, path: str, data: bytes) -> bool:
        """Write ``data`` at ``path`` if nothing is there; False if something is."""
        ...

    def read(self, path: str) -> tuple[bytes, Any] | None:
        """The content and its version, or None."""
        ...

    def replace(self, path: str, data: bytes, version: Any) -> bool:
        """Overwrite only if the content is still at ``version``."""
        ...

    def delete(self, path: str, version: Any) -> bool:
        """Delete only if the content is still at ``version``."""
        ...

    def lock(self, path: str) -> contextlib.AbstractContextManager[None]:
        """Make a read-compare-write sequence exclusive (a no-op where CAS does that)."""
        ...


class _CompareStore:
    """Stores whose replace/delete compare content under :meth:`lock` (the version is the bytes)."""

    kind = "generic"
    atomic = False
    torn_create = True
    """A competitor may read a lease this store is still creating (empty or half written)."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self.fs = location.fs

    def read(self, path: str) -> tuple[bytes, Any] | None:
        try:
            raw = with_retries(lambda: self.fs.cat_file(path), f"read {path}")
        except (FileNotFoundError, NotADirectoryError):
            return None
        return raw, raw

    def _current(self, path: str) -> bytes | None:
        found = self.read(path)
        return None if found is None else found[0]

    def replace(self, path: str, data: bytes, version: Any) -> bool:
        if self._current(path) != version:
            return False
        write_atomic(self.location, path, data)
        return True

    def delete(self, path: str, version: Any) -> bool:
        if self._current(path) != version:
            return False
        with contextlib.suppress(FileNotFoundError):
            with_retries(lambda: self.fs.rm_file(path), f"delete {path}")
        return True

    def lock(self, path: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def create(self, path: str, data: bytes) -> bool:
        try:
            with_retries(lambda: self.fs.pipe_file(path, data, mode="create"), f"create {path}")
        except FileExistsError:
            return self._current(path) == data  # ours, if a retried first attempt landed
        except (TypeError, NotImplementedError, ValueError):
            # No conditional create: the documented, weaker fallback (check, then write).
            if self._current(path) is not None:
                return False
            with_retries(lambda: self.fs.pipe_file(path, data), f"create {path}")
        # A backend that ignores mode="create" overwrites silently: trust only what reads back.
        return self._current(path) == data


class LocalLeaseStore(_CompareStore):
    """``O_CREAT | O_EXCL`` creates (atomic, fails if present), a ``flock`` guard for the rest.

    The create writes its bytes just after making the file, so a competitor may read it empty
    or half written: ``torn_create`` makes that read a short wait, not a takeover. (A temporary
    file hard-linked into place would hide that moment, for two more files per build.)
    """

    kind = "local"
    atomic = True
    torn_create = True

    def create(self, path: str, data: bytes) -> bool:
        # O_EXCL never follows a link at ``path``; the folders above it must not be links.
        self.location.check_no_links(os.path.dirname(path))
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
        try:
            fd = os.open(path, flags, 0o644)
        except FileExistsError:
            return False
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                fd = os.open(path, flags, 0o644)
            except FileExistsError:
                return False
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return True

    def read(self, path: str) -> tuple[bytes, Any] | None:
        try:
            raw = read_no_follow(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return raw, raw

    def replace(self, path: str, data: bytes, version: Any) -> bool:
        # Callers hold lock(path). No fsync: a lease lost to a power cut reads as expired.
        if self._current(path) != version:
            return False
        tmp = f"{path}.new-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True

    def delete(self, path: str, version: Any) -> bool:
        # Callers hold lock(path) and have just read ``version``: every writer needs that lock,
        # so it is still current, and a second read to compare would only cost a system call.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        try:
            guard = open(path + ".guard", "a")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:
            # Never re-created here: a lease whose folder vanished under its holder must read
            # as vanished (see Lease.folder_gone), not be answered from a fresh empty folder.
            raise MetadataFolderGone(path) from None
        with guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)


class MetadataFolderGone(FileNotFoundError):
    """The folder a local lease lives in is gone (deleted while the lease was held)."""


class MemoryLeaseStore(_CompareStore):
    kind = "memory"
    atomic = True
    torn_create = False

    def create(self, path: str, data: bytes) -> bool:
        with _MEMORY_LOCK:
            if self.location.has_file(path):
                return False
            self.location.put_file(path, data)
            return True

    def delete(self, path: str, version: Any) -> bool:
        # As on local disk: callers hold lock(path), which every writer needs, and just read it.
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)
        return True

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        with _MEMORY_LOCK:
            yield


class _PreconditionFailed(Exception):
    """A conditional request lost its race (HTTP 412); never retried."""


def _precondition_failed(exc: OSError) -> bool:
    cause = exc.__cause__
    code = getattr(cause, "response", {}).get("Error", {}).get("Code") if cause else None
    return code in ("PreconditionFailed", "412") or "pre-condition" in str(exc).lower()


class S3LeaseStore:
    """s3fs: ``If-None-Match: *`` to create, ``If-Match: <ETag>`` to replace and delete."""

    kind = "s3"
    atomic = True
    torn_create = False

    def __init__(self, location: Location) -> None:
        self.location = location
        self.fs: Any = location.fs

    def _key(self, path: str) -> tuple[str, str]:
        bucket, key, _ = self.fs.split_path(path)
        return bucket, key

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        bucket, key = self._key(path)

        def call() -> Any:
            try:
                return self.fs.call_s3(method, Bucket=bucket, Key=key, **kwargs)
            except FileExistsError:
                raise _PreconditionFailed() from None
            except OSError as exc:
                if _precondition_failed(exc):
                    raise _PreconditionFailed() from None
                raise

        return with_retries(call, f"{method} {path}")

    def create(self, path: str, data: bytes) -> bool:
        try:
            self._call("put_object", path, Body=data, IfNoneMatch="*")
            return True
        except _PreconditionFailed:
            pass
        # A retried PUT whose first attempt landed also fails: the lease is ours if it holds our
        # bytes.
        found = self.read(path)
        return found is not None and found[0] == data

    def read(self, path: str) -> tuple[bytes, Any] | None:
        bucket, key = self._key(path)

        async def get() -> tuple[bytes, str]:
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            body = response["Body"]
            try:
                return await body.read(), response["ETag"]
            finally:
                body.close()

        try:
            raw, etag = with_retries(lambda: sync(self.fs.loop, get), f"read {path}")
        except (FileNotFoundError, NotADirectoryError):
            return None
        return raw, etag

    def _conditional(self, method: str, path: str, version: Any, data: bytes | None) -> bool:
        kwargs: dict[str, Any] = {"IfMatch": version}
        if data is not None:
            kwargs["Body"] = data
        try:
            self._call(method, path, **kwargs)
            return True
        except FileNotFoundError:
            return False
        except _PreconditionFailed:
            if data is None:
                return False
            found = self.read(path)  # a retried PUT whose first attempt landed
            return found is not None and found[0] == data

    def replace(self, path: str, data: bytes, version: Any) -> bool:
        return self._conditional("put_object", path, version, data)

    def delete(self, path: str, version: Any) -> bool:
        return self._conditional("delete_object", path, version, None)

    def lock(self, path: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class GCSLeaseStore:
    """gcsfs: every write and delete carries a generation precondition (``ifGenerationMatch``).

    ``0`` creates only if absent; the generation read with the content replaces or deletes only
    that version, so two runners taking over one expired lease can't both win (GCS answers the
    loser with HTTP 412, which gcsfs raises as ``FileExistsError``).
    """

    kind = "gcs"
    atomic = True
    torn_create = False
    _BOUNDARY = "==marin-lease=="

    def __init__(self, location: Location) -> None:
        self.location = location
        self.fs: Any = location.fs

    def _key(self, path: str) -> tuple[str, str]:
        bucket, key, _ = self.fs.split_path(path)
        return bucket, key

    def _upload(self, path: str, data: bytes, generation: str) -> bool:
        """A one-request multipart upload that succeeds only if the object is at ``generation``."""
        bucket, key = self._key(path)
        boundary = self._BOUNDARY
        body = (
            (
                f"--{boundary}\nContent-Type: application/json; charset=UTF-8\n\n"
                f"{json.dumps({'name': key})}\n--{boundary}\n"
                "Content-Type: application/octet-stream\n\n"
            ).encode()
            + data
            + f"\n--{boundary}--".encode()
        )
        try:
            with_retries(
                lambda: self.fs.call(
                    "POST",
                    f"{self.fs._location}/upload/storage/v1/b/{{}}/o",
                    bucket,
                    uploadType="multipart",
                    ifGenerationMatch=generation,
                    headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
                    data=body,
                    json_out=True,
                ),
                f"write {path}",
            )
            return True
        except FileExistsError:
            # 412: someone else's version is there now. A retried request whose first attempt
            # landed also gets 412: the write is ours if the object holds our bytes.
            found = self.read(path)
            return found is not None and found[0] == data

    def create(self, path: str, data: bytes) -> bool:
        return self._upload(path, data, "0")

    def read(self, path: str) -> tuple[bytes, Any] | None:
        bucket, key = self._key(path)
        try:
            headers, raw = with_retries(
                lambda: self.fs.call("GET", "b/{}/o/{}", bucket, key, alt="media"), f"read {path}"
            )
        except (FileNotFoundError, NotADirectoryError):
            return None
        generation = headers.get("X-Goog-Generation")
        if not generation:
            # No generation, no compare-and-swap: a version nobody can match is the safe answer.
            return raw, "-1"
        return raw, str(generation)

    def replace(self, path: str, data: bytes, version: Any) -> bool:
        return self._upload(path, data, str(version))

    def delete(self, path: str, version: Any) -> bool:
        bucket, key = self._key(path)
        try:
            with_retries(
                lambda: self.fs.call(
                    "DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(version)
                ),
                f"delete {path}",
            )
        except (FileNotFoundError, FileExistsError):
            return False
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)
        return True

    def lock(self, path: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def lease_store(location: Location) -> LeaseStore:
    """The strongest lease store this backend supports."""
    fs = location.fs
    if isinstance(fs, LocalFileSystem):
        return LocalLeaseStore(location)
    if isinstance(fs, MemoryFileSystem):
        return MemoryLeaseStore(location)
    if type(fs).__module__.startswith("s3fs") and hasattr(fs, "call_s3"):
        return S3LeaseStore(location)
    if type(fs).__module__.startswith("gcsfs") and hasattr(fs, "call"):
        return GCSLeaseStore(location)
    return _CompareStore(location)


# -- the lease -----------------------------------------------------------------------------------


class Lease:
    def __init__(self, location: Location, output_path: str, ttl: float | None = None) -> None:
        self.location = location
        self.store = lease_store(location)
        self.path = location.path(lease_path(output_path))
        self.ttl = ttl_from_env() if ttl is None else ttl
        self.token = uuid.uuid4().hex
        self.holder = _holder_id()
        self.process = _process_id()
        self.renewed_at = 0.0
        """``time.monotonic()`` of the last write that proved we held the lease."""
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        """When this attempt began: the held lease is the step's RUNNING status."""
        self._written = b""
        """The last body made for this lease: bytes equal to it are ours, no parse needed."""
        self._released = False
        self.took_over = False
        """True once this lease replaced an expired, orphaned or garbled one: an attempt that
        passed its checks died here before (``build._earlier_attempt`` may clear its debris)."""
        self.vanished = False
        """True once a renewal or the commit found no lease file at all: it was deleted (the
        metadata folder removed, or ``marin unlock``), not taken over by another runner."""
        self.folder_gone = False
        """On local disk: the whole metadata folder was found gone, not just the lease."""

    def _body(self) -> bytes:
        info = {
            "holder": self.holder,
            "token": self.token,
            "expires_at": time.time() + self.ttl,
            "process": self.process,
            "started_at": self.started_at,
            "ttl": self.ttl,
        }
        self._written = json.dumps(info, sort_keys=True).encode()
        return self._written

    def _ours(self, raw: bytes) -> bool:
        return raw == self._written or LeaseInfo.parse(raw).token == self.token

    def read(self) -> LeaseInfo | None:
        found = self.store.read(self.path)
        return None if found is None else LeaseInfo.parse(found[0], self.ttl)

    # -- the protocol ---------------------------------------------------------------------------

    def try_acquire(self) -> LeaseInfo | None:
        """Take the lease; return None on success, else who holds it."""
        holder = self._try_acquire()
        if holder is None:
            self.renewed_at = time.monotonic()
            with _held_lock:
                _held.add(self)
        return holder

    def _try_acquire(self) -> LeaseInfo | None:
        if self.store.create(self.path, self._body()):
            return None
        try:
            with self.store.lock(self.path):
                return self._take_locked()
        except MetadataFolderGone:  # deleted since the create found a lease there: try again
            return None if self.store.create(self.path, self._body()) else self.read()

    def _take_locked(self) -> LeaseInfo | None:
        """Under the lock: take the lease if nobody holds it any more; else who holds it."""
        found = self.store.read(self.path)
        if found is None:
            if self.store.create(self.path, self._body()):
                return None
            return self.read()
        raw, version = found
        current = LeaseInfo.parse(raw, self.ttl)
        if current.token == self.token:
            return None
        if current.garbled:
            if (
                self.store.torn_create
                and _unparsable(raw)
                and not _garbled_for_a_while(self.path, raw)
            ):
                return current  # maybe a create still writing its bytes
            why = "unreadable (garbled) lease"
        elif current.expired:
            why = "expired lease"
        elif current.skewed:
            ahead = (current.expires_at - time.time()) / 3600
            why = (
                f"lease expiring {ahead:.1f} h ahead, far beyond its TTL of "
                f"{current.ttl or self.ttl:.0f}s (a clock running ahead, or a planted lease)"
            )
        elif current.holder_dead:
            why = "lease of a process that is gone"
        else:
            return current
        if not self.store.replace(self.path, self._body(), version):
            return self.read() or current  # someone else took it over first
        log.warning("taking over %s on %s from %s", why, self.path, current.holder)
        self.took_over = True
        return None

    def _renew_locked(self) -> bool:
        found = self.store.read(self.path)
        if found is None or not self._ours(found[0]):
            self.vanished = found is None
            return False
        if not self.store.replace(self.path, self._body(), found[1]):
            return False
        self.renewed_at = time.monotonic()
        return True

    def renew(self) -> bool:
        """Extend the expiry if we still hold the lease; False means it was lost."""
        try:
            with self.store.lock(self.path):
                return self._renew_locked()
        except MetadataFolderGone:
            self.vanished = self.folder_gone = True
            return False

    def commit(self, write: Callable[[], None], *, release: bool = False) -> bool:
        """Run ``write`` (the record write) only while provably holding the lease.

        On local disk and ``memory://`` the check and the write happen under the lock that every
        takeover also needs, so they are atomic; with ``release`` the lease is released under
        the same lock (one lock round and one read fewer than ``release()`` after). On object
        stores a compare-and-swap renewal just before the write gives the write a whole TTL; a
        write that takes longer than half a TTL is reported as lost (a takeover may have
        started), and the taker's record wins; ``release`` is then left to ``release()``.
        """
        try:
            with self.store.lock(self.path):
                if isinstance(self.store, (LocalLeaseStore, MemoryLeaseStore)):
                    # Every takeover needs this lock too, so a token check is proof enough.
                    found = self.store.read(self.path)
                    if found is None or not self._ours(found[0]):
                        self.vanished = found is None
                        return False
                    write()
                    if release:
                        self.store.delete(self.path, found[1])
                        self._released = True
                        with _held_lock:
                            _held.discard(self)
                    return True
                if not self._renew_locked():
                    return False
                write()
        except MetadataFolderGone:  # only the lock raises it: nothing was written
            self.vanished = self.folder_gone = True
            return False
        if time.monotonic() - self.renewed_at < self.ttl / 2:
            return True
        current = self.read()
        return current is not None and current.token == self.token

    def release(self) -> None:
        with _held_lock:
            _held.discard(self)
        if self._released:
            return
        try:
            with self.store.lock(self.path):
                found = self.store.read(self.path)
                if found is not None and self._ours(found[0]):
                    self.store.delete(self.path, found[1])
                    self._released = True
        except MetadataFolderGone:
            self._released = True  # its folder, and so the lease, is gone: nothing to release
        except OSError as exc:
            log.warning("could not release lease %s (it expires by itself): %s", self.path, exc)


def read_lease(location: Location, output_path: str, ttl: float | None = None) -> LeaseInfo | None:
    """The step's lease as it stands (None: no lease file), one read. ``ttl`` judges a lease
    that does not store its own (default: ``$MARIN_LEASE_TTL``)."""
    found = lease_store(location).read(location.path(lease_path(output_path)))
    if found is None:
        return None
    return LeaseInfo.parse(found[0], ttl_from_env() if ttl is None else ttl)


def break_lease(location: Location, output_path: str, info: LeaseInfo) -> bool:
    """Delete the step's lease if it is still the one ``info`` describes (``marin unlock``).

    The delete is conditional (the same compare as a takeover), so a lease renewed or taken
    over since ``info`` was read is left alone: False. The holder, if it lives, finds its lease
    gone at its next renewal or at its commit, and discards its result.
    """
    store = lease_store(location)
    path = location.path(lease_path(output_path))
    try:
        with store.lock(path):
            found = store.read(path)
            if found is None:
                return True
            if found[0] != info.raw:
                return False
            return store.delete(path, found[1])
    except MetadataFolderGone:
        return True  # the folder, and the lease with it, went meanwhile


# -- heartbeats: one shared renewal thread per process --------------------------------------------


class _Renewer:
    """Renews every held lease from one daemon thread, each at a third of its TTL."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Heartbeat]] = []
        self._active: set[Heartbeat] = set()
        self._beating: Heartbeat | None = None
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, beat: Heartbeat) -> None:
        with self._cond:
            self._active.add(beat)
            heapq.heappush(self._due, (time.monotonic() + beat.interval, next(self._order), beat))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="marin-lease-heartbeat", daemon=True
                )
                self._thread.start()
            elif self._due[0][2] is beat:
                self._cond.notify_all()  # only a new earliest deadline changes the thread's wait

    def remove(self, beat: Heartbeat) -> None:
        with self._cond:
            self._active.discard(beat)
            while self._beating is beat:  # never return while its renewal is in flight
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._due and self._due[0][2] not in self._active:
                        heapq.heappop(self._due)
                    if not self._due:
                        self._cond.wait()
                        continue
                    delay = self._due[0][0] - time.monotonic()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                _, _, beat = heapq.heappop(self._due)
                self._beating = beat
            keep = True
            try:
                keep = beat.beat()
            finally:
                with self._cond:
                    self._beating = None
                    if keep and beat in self._active:
                        heapq.heappush(
                            self._due,
                            (time.monotonic() + beat.interval, next(self._order), beat),
                        )
                    self._cond.notify_all()


_RENEWER = _Renewer()


class Heartbeat:
    """Renews a lease in the background while its step runs (on the shared renewal thread)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost = threading.Event()
        self.interval = max(lease.ttl / 3, 0.05)

    def beat(self) -> bool:
        """Renew once; False once the lease is lost (stop renewing)."""
        if faults.heartbeat_paused():
            return True
        try:
            if self.lease.renew():
                return True
        except OSError as exc:
            log.warning("could not renew lease %s: %s", self.lease.path, exc)
            return True
        with _held_lock:
            released = self.lease not in _held  # released under us (Ctrl-C): not a takeover
        if not released and self.lease.vanished:
            log.warning("lost lease %s: the lease file was deleted while the step ran",
                        self.lease.path)  # fmt: skip
        elif not released:
            log.warning("lost lease %s: another runner took it over", self.lease.path)
        self.lost.set()
        return False

    def __enter__(self) -> Heartbeat:
        _RENEWER.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _RENEWER.remove(self)
