"""Leases on local disk: ``O_EXCL`` creates, and a ``flock`` guard for compare-and-write."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from typing import Any

from marin.execution.atomic_file import write_file_atomically
from marin.execution.store.lease.store import _CompareStore
from marin.execution.store.location import open_no_follow, read_no_follow


class LocalLeaseStore(_CompareStore):
    """``O_CREAT | O_EXCL`` creates (atomic, fails if present), a ``flock`` guard for the rest.

    The create writes its bytes just after making the file, so a competitor may read it empty
    or half written: ``torn_create`` makes that read a short wait, not a takeover. (A temporary
    file hard-linked into place would hide that moment, for two more files per build.)
    """

    kind = "local"
    atomic = True
    torn_create = True
    lock_excludes_writers = True

    def create(self, path: str, data: bytes) -> bool:
        # O_EXCL never follows a link at ``path``; the folders above it must not be links. A
        # folder the check found missing (a first build) is made before the one create: an
        # open there could only fail.
        folder = os.path.dirname(path)
        if not self.location.check_no_links(folder):
            self._make_folders(folder)
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
        try:
            fd = os.open(path, flags, 0o644)
        except FileExistsError:
            return False
        except FileNotFoundError:
            self._make_folders(folder)  # gone since this location last saw it there
            try:
                fd = os.open(path, flags, 0o644)
            except FileExistsError:
                return False
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return True

    def _make_folders(self, folder: str) -> None:
        """``os.makedirs(folder, exist_ok=True)``, telling the location which folders it made.

        A first build's lease folder (``<output>.marin``) and its parent (the step's folder) are
        both missing: they are made top-down, two ``mkdir`` calls and no ``stat``. Each folder
        ``mkdir`` makes here is a real folder (it never follows a link at the name it makes; one
        found there is ``FileExistsError``, left to the link checks), so the listing right
        after the lease needs no ``lstat`` of them. The folders above were checked for links
        just before. Deeper missing folders (a new group's first step) take ``makedirs``.
        """
        for made in (os.path.dirname(folder), folder):
            try:
                os.mkdir(made)
            except FileExistsError:
                continue  # there already, or made by a racing runner: not known real
            except FileNotFoundError:
                os.makedirs(folder, exist_ok=True)
                return
            self.location.made_real_dir(made)

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
        write_file_atomically(path, data)
        return True

    def delete(self, path: str, version: Any) -> bool:
        # Callers hold lock(path), which every writer needs: the compare is then a formality,
        # but it is what the interface promises (one small read, only at release).
        if self._current(path) != version:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True

    def delete_held(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        # A bare descriptor (flock needs nothing more), opened for writing because flock on NFS
        # needs that, never through a link; a Python file object would add four system calls.
        try:
            guard = open_no_follow(path + ".guard", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except FileNotFoundError:
            # Never re-created here: a lease whose folder vanished under its holder must read
            # as vanished (see Lease.folder_gone), not be answered from a fresh empty folder.
            raise MetadataFolderGone(path) from None
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)
        finally:
            os.close(guard)


class MetadataFolderGone(FileNotFoundError):
    """The folder a local lease lives in is gone (deleted while the lease was held)."""
