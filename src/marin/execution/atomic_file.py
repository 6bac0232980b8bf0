"""The one atomic write of a local file: a temporary sibling, renamed into place.

Readers see the old bytes or the new, never a prefix of them, and the temporary file is
removed on every error path (a full disk, an I/O error, an interrupt), so a failed write leaves
nothing behind. Object stores and ``memory://`` make a single put atomic and need none of this.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import IO

from marin.execution.ids import new_id

TMP_MARK = ".tmp-"
"""What a temporary sibling's name adds to the final name (``record.json.tmp-<hex>``)."""


def write_file_atomically(
    path: str,
    data: bytes,
    *,
    fsync: bool = False,
    make_parents: bool = False,
    on_open: Callable[[IO[bytes]], None] | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically.

    ``fsync`` flushes the file to disk before the rename (durable mode). ``make_parents``
    creates missing parent folders. ``on_open`` is called with the open temporary file before
    ``data`` is written: the fault hooks use it to leave a torn temporary file.
    """
    tmp = f"{path}{TMP_MARK}{new_id()}"
    try:
        with _create(tmp, make_parents) as f:
            if on_open is not None:
                on_open(f)
            view = memoryview(data)
            while view:  # an unbuffered write may be short: write the rest
                view = view[f.write(view) :]
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _create(tmp: str, make_parents: bool) -> IO[bytes]:
    # Parents are made only after a failed open: the common case costs no mkdir call.
    # Unbuffered: one whole write needs no buffer, and skips the tty and position probes a
    # buffered file makes when it opens (two system calls per metadata write).
    try:
        return open(tmp, "xb", buffering=0)
    except FileNotFoundError:
        if not make_parents:
            raise
        os.makedirs(os.path.dirname(tmp) or ".", exist_ok=True)
        return open(tmp, "xb", buffering=0)
