"""Leases on ``memory://``, made atomic by one lock of this process."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from marin.execution.store.lease.store import _CompareStore

_MEMORY_LOCK = threading.RLock()
"""The ``memory://`` store lives in this process: this lock makes each lease operation atomic."""


class MemoryLeaseStore(_CompareStore):
    """Leases on ``memory://``: the store lives in this process, so one lock makes every
    operation atomic."""

    kind = "memory"
    atomic = True
    torn_create = False
    lock_excludes_writers = True

    def create(self, path: str, data: bytes) -> bool:
        with _MEMORY_LOCK:
            if self.location.has_file(path):
                return False
            self.location.put_file(path, data)
            return True

    def delete(self, path: str, version: Any) -> bool:
        with _MEMORY_LOCK:  # the compare and the delete as one step
            if self._current(path) != version:
                return False
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)
            return True

    def delete_held(self, path: str) -> None:
        with _MEMORY_LOCK, contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        with _MEMORY_LOCK:
            yield
