"""The ``LeaseStore`` interface every backend implements, and the generic store: the weaker
check-then-write fallback for a file system with no conditional create."""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from marin.execution.store.location import Location, with_retries
from marin.execution.store.records import write_atomic


class LeaseStore(Protocol):
    """The operations a lease needs from a backend. ``version`` is opaque to callers."""

    kind: str
    atomic: bool
    """False for the check-then-write fallback."""
    torn_create: bool
    """True if a competitor may read a lease ``create`` has made but not yet filled."""
    lock_excludes_writers: bool
    """True if every write of the lease (a takeover, a renewal, a delete) happens under
    :meth:`lock`: then, under it, a token check proves ownership and the commit needs no
    compare-and-swap renewal first."""

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

    def delete_held(self, path: str) -> None:
        """Delete the lease at ``path``, which the caller, holding :meth:`lock`, has just read
        and found its own. Only where ``lock_excludes_writers``: nothing can have written it
        since that read, so the compare of :meth:`delete` would only read it again."""
        ...

    def lock(self, path: str) -> contextlib.AbstractContextManager[None]:
        """Make a read-compare-write sequence exclusive (a no-op where CAS does that)."""
        ...


def no_held_delete(kind: str) -> NotImplementedError:
    """What ``delete_held`` raises on a store (of ``kind``) whose lock does not exclude writers."""
    return NotImplementedError(
        f"the {kind} lease store's lock does not exclude writers: use delete(path, version)"
    )


class _StoreOn:
    """A lease store on one prefix's ``Location``; its lock excludes no writer."""

    lock_excludes_writers = False

    def __init__(self, location: Location) -> None:
        self.location = location
        self.fs: Any = location.fs


class ConditionalObjectStore(_StoreOn):
    """Object stores (S3, GCS) whose create, replace and delete are conditional requests: the
    store itself refuses a write that lost its race, so no lock is needed and none excludes
    writers (``delete_held`` is refused: delete by version). Subclasses make the requests."""

    kind = "object-store"
    atomic = True
    torn_create = False

    def _key(self, path: str) -> tuple[str, str]:
        bucket, key, _ = self.fs.split_path(path)
        return bucket, key

    def delete_held(self, path: str) -> None:
        raise no_held_delete(self.kind)

    def lock(self, path: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _CompareStore(_StoreOn):
    """Stores whose replace/delete compare content under :meth:`lock` (the version is the bytes)."""

    kind = "generic"
    atomic = False
    torn_create = True
    """A competitor may read a lease this store is still creating (empty or half written)."""

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

    def delete_held(self, path: str) -> None:
        if not self.lock_excludes_writers:
            raise no_held_delete(self.kind)
        with contextlib.suppress(FileNotFoundError):
            with_retries(lambda: self.fs.rm_file(path), f"delete {path}")

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
