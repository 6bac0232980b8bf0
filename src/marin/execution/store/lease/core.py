"""The lease protocol: take, renew, commit under and release a step's lease; the registry of
leases this process holds (which Ctrl-C releases); reading and breaking a lease by hand."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator

from marin.execution.ids import new_id
from marin.execution.store.lease.backends import lease_store
from marin.execution.store.lease.holder import _holder_id, _process_id
from marin.execution.store.lease.info import LeaseInfo, _garbled_for_a_while, _unparsable
from marin.execution.store.lease.local_store import MetadataFolderGone
from marin.execution.store.lease.settings import ttl_from_env
from marin.execution.store.location import Location
from marin.execution.store.records import lease_path
from marin.execution.store.step_folder import ADOPTION, OWNER_FIELD

log = logging.getLogger("marin")

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


class Lease:
    """A cross-process lock on one step's output: ``lease.json`` beside it, holding a token,
    its holder and an expiry that a ``Heartbeat`` renews.

    Only its holder (the token) may renew, commit under, or release it; an expired one, or
    one whose local holder died, is taken over. A held lease is the RUNNING status."""

    def __init__(
        self,
        location: Location,
        output_path: str,
        ttl: float | None = None,
        adoption: str | None = None,
    ) -> None:
        self.location = location
        self.adoption = adoption
        """An adopted step's source: written into the lease, so that a crash's leftovers say
        the attempt never wrote the output path (a build never clears it, gc never deletes it)."""
        self.store = lease_store(location)
        self.path = location.path(lease_path(output_path))
        self.output_path = output_path
        """Written into the lease: a crash's leftovers name their step (``marin gc``)."""
        self.ttl = ttl_from_env() if ttl is None else ttl
        self.token = new_id()
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
        self.displaced: LeaseInfo | None = None
        """The lease this one took over (its holder, TTL and process), if it took one over."""
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
            OWNER_FIELD: self.output_path,
            "token": self.token,
            "expires_at": time.time() + self.ttl,
            "process": self.process,
            "started_at": self.started_at,
            "ttl": self.ttl,
        }
        if self.adoption is not None:
            info[ADOPTION] = self.adoption
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
        self.took_over, self.displaced = True, current
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
                if self.store.lock_excludes_writers:
                    # Every takeover needs this lock too, so a token check is proof enough.
                    found = self.store.read(self.path)
                    if found is None or not self._ours(found[0]):
                        self.vanished = found is None
                        return False
                    write()
                    if release:
                        # Read under this very lock, which every writer needs: still ours.
                        self.store.delete_held(self.path)
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

    @property
    def held_here(self) -> bool:
        """Whether this process took the lease and has not released it since (a Ctrl-C
        releases every held lease under running builds: ``release_all_held``)."""
        with _held_lock:
            return self in _held

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
