"""Whether a folder exists on ``memory://``, in one lookup rather than a scan of the store.

fsspec's memory store is one flat dict of file paths, so a folder that holds only files exists
only as the prefix of their keys: finding it scans every key. ``build_step`` asks that of each
folder above every output (another step's ``.marin`` folder there is refused), which made a run
on ``memory://`` cost N². ``IndexedStore`` is that dict, with a count of the entries of every
folder that holds a key beside it, updated under one lock by every method that changes the
keys: before a key is added, after one is removed. A reader therefore never sees a key without
its folders, and the index never answers "absent" for a folder that holds a key, whoever wrote
it (fsspec's ``pipe_file`` or ``open``, another driver in this process, Marin straight into the
dict). It is not a cache: nothing is remembered that a write can make stale. A write costs a
lock and, for a key in a folder that already holds one, a dict update.

``index_store`` swaps a file system's plain dict for one holding the same entries. The
process-wide store is swapped when this module is imported, before any of Marin's threads
writes to it; a store replaced later by a plain dict is scanned, as before, until the next
``Location`` on it indexes it again.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from fsspec.implementations.memory import MemoryFileSystem

_SWAP_LOCK = threading.Lock()


class IndexedStore(dict[str, Any]):
    """fsspec's memory store that also counts the keys below every folder (see the module)."""

    __slots__ = ("_below", "_lock")

    def __init__(self, entries: Mapping[str, Any] = ()) -> None:  # type: ignore[assignment]
        super().__init__()
        self._below: dict[str, int] = {}
        self._lock = threading.RLock()
        self.update(entries)

    def __reduce__(self) -> tuple[Any, ...]:
        # Made empty, then filled key by key (as pickle fills a dict), so the cycle from each
        # MemoryFile back to its file system, which holds this store, unpickles.
        return (IndexedStore, (), None, None, iter(dict(self).items()))

    def has_folder(self, folder: str) -> bool:
        """Whether some key lies below ``folder`` (a trailing ``/`` ignored)."""
        return folder.rstrip("/") in self._below

    def _added(self, key: str) -> None:
        # A folder counts its entries: files, and folders that hold something. A folder that
        # had entries before is in its parent's count already: the walk stops there.
        below = self._below
        while True:
            folder, slash, _ = key.rpartition("/")
            count = below.get(folder, 0)
            if not slash:
                return
            below[folder] = count + 1
            if count:
                return
            key = folder

    def _removed(self, key: str) -> None:
        below = self._below
        while True:
            folder, slash, _ = key.rpartition("/")
            if not slash:
                return
            count = below[folder] - 1
            if count:
                below[folder] = count
                return
            del below[folder]  # empty now: one entry fewer in its own parent
            key = folder

    def __setitem__(self, key: str, value: Any) -> None:
        with self._lock:
            if key not in self:
                self._added(key)  # first: the folders are never missing for a key
            super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        with self._lock:
            super().__delitem__(key)
            self._removed(key)

    def pop(self, key: str, *default: Any) -> Any:
        with self._lock:
            if key not in self:
                return super().pop(key, *default)  # the default, or KeyError
            value = super().pop(key)
            self._removed(key)
            return value

    def popitem(self) -> tuple[str, Any]:
        with self._lock:
            key, value = super().popitem()
            self._removed(key)
            return key, value

    def setdefault(self, key: str, default: Any = None) -> Any:
        with self._lock:
            if key not in self:
                self[key] = default
            return self[key]

    def update(self, *others: Any, **more: Any) -> None:
        with self._lock:
            for key, value in dict(*others, **more).items():
                self[key] = value

    def __ior__(self, other: Any) -> IndexedStore:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        with self._lock:
            super().clear()
            self._below.clear()


def index_store(fs: MemoryFileSystem) -> None:
    """Make ``fs``'s store an ``IndexedStore`` holding the same entries, where the store lives:
    the file system itself (``global_store=False``) or the class that holds the shared one."""
    with _SWAP_LOCK:
        if isinstance(fs.store, IndexedStore):
            return
        owner: Any = fs
        if "store" not in vars(fs):
            owner = next(c for c in type(fs).__mro__ if "store" in vars(c))
        owner.store = IndexedStore(fs.store)


def folder_exists(fs: MemoryFileSystem, folder: str) -> bool:
    """Whether some key of ``fs``'s store lies below ``folder``: a lookup on an indexed store,
    a scan of every key on any other."""
    store = fs.store
    if isinstance(store, IndexedStore):
        return store.has_folder(folder)
    prefix = folder.rstrip("/") + "/"
    return any(key.startswith(prefix) for key in list(store))


index_store(MemoryFileSystem())  # the process-wide store, before any of Marin's threads runs
