"""The one atomic write of a local file: a temporary sibling, renamed into place.

Readers see the old bytes or the new, never a prefix of them, and the temporary file is
removed on every error path (a full disk, an I/O error, an interrupt), so a failed write leaves
nothing behind. Object stores and ``memory://`` make a single put atomic and need none of this.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from marin.execution.ids import new_id

TMP_MARK = ".tmp-"
"""What a temporary sibling's name adds to the final name (``record.json.tmp-<hex>``)."""


def write_file_atomically(
    path: str,
    data: bytes,
    *,
    fsync: bool = False,
    make_parents: bool = False,
    on_open: Callable[[int], None] | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically.

    ``fsync`` flushes the file to disk before the rename (durable mode). ``make_parents``
    creates missing parent folders. ``on_open`` is called with the temporary file's descriptor
    before ``data`` is written: the fault hooks use it to leave a torn temporary file.
    """
    tmp = f"{path}{TMP_MARK}{new_id()}"
    try:
        fd = _create(tmp, make_parents)
        try:
            if on_open is not None:
                on_open(fd)
            view = memoryview(data)
            while view:  # a write may be short: write the rest
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
"""A new file only (``O_EXCL`` never follows a link at the name, nor reuses a file)."""


def _create(tmp: str, make_parents: bool) -> int:
    # Parents are made only after a failed open: the common case costs no mkdir call.
    # A bare descriptor: a Python file object would add an fstat (and, buffered, the tty and
    # position probes) to every metadata write, for one whole write that needs none of them.
    try:
        return os.open(tmp, _CREATE, 0o666)
    except FileNotFoundError:
        if not make_parents:
            raise
        os.makedirs(os.path.dirname(tmp) or ".", exist_ok=True)
        return os.open(tmp, _CREATE, 0o666)
