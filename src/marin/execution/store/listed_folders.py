"""Whether paths below a prefix exist, answered from one listing per folder, each listed once.

A plan's advisory look at the steps it builds (``builder/clearing.py``'s rules, asked before a
run) asks about the folders above every new step's output: thousands of steps share a few of
them, so a folder is listed once and every question about an entry of it is answered from
that listing. A folder that is not there is never listed (nothing below it is there either):
on a new prefix, one listing of the prefix answers every question. ``memory://`` is asked
directly (a dict lookup each; a listing there scans the whole store).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future

from marin.execution.store.location import Location


class ListedFolders:
    """``exists(relative)`` for paths below one prefix, memoized by folder; thread-safe (each
    folder is listed once, whichever thread asks first; the others wait for its answer)."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self._listed: dict[str, Future[frozenset[str]]] = {}
        self._lock = threading.Lock()

    def exists(self, relative: str) -> bool:
        """Whether anything (a file or a folder) is at ``relative`` (below the prefix).

        Raises:
            OSError: a listing failed (``StorageError`` once retries are spent).
        """
        if self.location.is_memory:
            return self.location.exists(self.location.path(relative))
        folder, _, name = relative.rpartition("/")
        return name in self.names(folder)

    def names(self, folder: str) -> frozenset[str]:
        """The names of the entries of ``folder`` (below the prefix; "" is the prefix itself),
        empty when it is not there: listed the first time it is asked about."""
        with self._lock:
            listed = self._listed.get(folder)
            first = listed is None
            if listed is None:
                listed = self._listed[folder] = Future()
        if first:
            try:
                there = not folder or self.exists(folder)
                listed.set_result(self._list(folder) if there else frozenset())
            except BaseException as exc:  # every thread waiting on it sees the failure
                listed.set_exception(exc)
        return listed.result()

    def _list(self, folder: str) -> frozenset[str]:
        """One listing of ``folder``: its direct entries' names."""
        location = self.location
        path = location.path(folder)
        if location.is_local:
            if not location.check_no_links(path):  # a link below the prefix: SymlinkError
                return frozenset()
            try:
                return frozenset(os.listdir(path))
            except (FileNotFoundError, NotADirectoryError):
                return frozenset()
        try:
            found = location.list_folder(path)
        except (FileNotFoundError, NotADirectoryError):
            return frozenset()
        base = path.rstrip("/") + "/"
        names = (str(entry).rstrip("/") for entry in found)
        # Only direct children: a file lists as itself, and a key spelled with '//' is no entry.
        return frozenset(
            n[len(base) :] for n in names if n.startswith(base) and "/" not in n[len(base) :]
        )
