"""A lease: the cross-process, cross-runner lock that makes a build exactly-once.

The lease is a small JSON file beside the output (``<output>.marin/lease.json``) holding the
holder's id, a random token and an expiry. It is created with an atomic create-if-absent:

- local disk: ``O_CREAT | O_EXCL``; renewal, takeover and release are serialised by ``flock`` on a
  guard file, so a renewal can never overwrite a takeover;
- ``memory://``: the same operations under a process-wide lock (the store lives in this process);
- other fsspec backends: ``pipe_file(mode="create")``, which s3fs sends as ``If-None-Match: *``.
  Where a backend cannot create conditionally we fall back to check-then-write, which narrows but
  does not close the race between two simultaneous first acquirers (documented in the README).

A holder that cannot renew has lost the lease and must not commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fsspec.implementations.memory import MemoryFileSystem

from marin.execution.records import lease_path, write_atomic
from marin.execution.storage import Location, with_retries

log = logging.getLogger("marin")

DEFAULT_TTL_S = float(os.environ.get("MARIN_LEASE_TTL", "60"))
_MEMORY_LOCK = threading.Lock()
_held: set[Lease] = set()
_held_lock = threading.Lock()


def release_all_held() -> int:
    """Release every lease this process holds: the Ctrl-C / SIGTERM path."""
    with _held_lock:
        leases = list(_held)
    for lease in leases:
        with contextlib.suppress(OSError):
            lease.release()
    return len(leases)


@dataclass(frozen=True)
class LeaseInfo:
    holder: str
    token: str
    expires_at: float

    @property
    def expired(self) -> bool:
        return time.time() >= self.expires_at

    def describe(self) -> str:
        remaining = self.expires_at - time.time()
        return f"{self.holder} (expires in {remaining:.0f}s)"


def _holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class Lease:
    def __init__(self, location: Location, output_path: str, ttl: float | None = None) -> None:
        self.location = location
        self.path = location.path(lease_path(output_path))
        self.ttl = DEFAULT_TTL_S if ttl is None else ttl
        self.token = uuid.uuid4().hex
        self.holder = _holder_id()

    # -- primitives ---------------------------------------------------------------------------

    def _body(self) -> bytes:
        info = {"holder": self.holder, "token": self.token, "expires_at": time.time() + self.ttl}
        return json.dumps(info, sort_keys=True).encode()

    def read(self) -> LeaseInfo | None:
        try:
            raw = with_retries(lambda: self.location.fs.cat_file(self.path), f"read {self.path}")
            data: dict[str, Any] = json.loads(raw.decode())
            return LeaseInfo(data["holder"], data["token"], float(data["expires_at"]))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            # A torn or foreign lease file protects nothing: treat it as expired.
            return LeaseInfo("<unreadable>", "", 0.0)

    def _create(self) -> bool:
        fs = self.location.fs
        if self.location.is_local:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(self._body())
            return True
        try:
            with_retries(
                lambda: fs.pipe_file(self.path, self._body(), mode="create"), f"create {self.path}"
            )
            return True
        except FileExistsError:
            return False
        except TypeError:  # backend without conditional create: the weaker fallback
            if fs.exists(self.path):
                return False
            fs.pipe_file(self.path, self._body())
            return True

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Serialise changes to an existing lease file (renew, takeover, release)."""
        if self.location.is_local:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path + ".guard", "a") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(guard, fcntl.LOCK_UN)
        elif isinstance(self.location.fs, MemoryFileSystem):
            with _MEMORY_LOCK:
                yield
        else:
            yield

    def _write(self) -> None:
        write_atomic(self.location, self.path, self._body())

    # -- the protocol ---------------------------------------------------------------------------

    def try_acquire(self) -> LeaseInfo | None:
        """Take the lease; return None on success, else who holds it."""
        holder = self._try_acquire()
        if holder is None:
            with _held_lock:
                _held.add(self)
        return holder

    def _try_acquire(self) -> LeaseInfo | None:
        if isinstance(self.location.fs, MemoryFileSystem):
            with _MEMORY_LOCK:
                if self._create():
                    return None
        elif self._create():
            return None
        with self._guard():
            current = self.read()
            if current is None:
                if self._create():
                    return None
                return self.read()
            if not current.expired:
                return current
            log.warning("taking over expired lease on %s from %s", self.path, current.holder)
            self._write()
            return None

    def renew(self) -> bool:
        """Extend the expiry if we still hold the lease; False means it was lost."""
        with self._guard():
            current = self.read()
            if current is None or current.token != self.token:
                return False
            self._write()
            return True

    def release(self) -> None:
        with _held_lock:
            _held.discard(self)
        with self._guard():
            current = self.read()
            if current is not None and current.token == self.token:
                with contextlib.suppress(FileNotFoundError):
                    self.location.fs.rm_file(self.path)


class Heartbeat:
    """Renews a lease in the background while its step runs."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name="marin-lease-heartbeat", daemon=True
        )

    def _beat(self) -> None:
        interval = max(self.lease.ttl / 3, 0.05)
        while not self._stop.wait(interval):
            try:
                if not self.lease.renew():
                    self.lost.set()
                    return
            except OSError as exc:
                log.warning("could not renew lease %s: %s", self.lease.path, exc)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
