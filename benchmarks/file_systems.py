"""Which local file systems the benchmarks can measure on here (no Marin import: ``run.py`` and
the workers both ask)."""

from __future__ import annotations

import contextlib

TMPFS = "/dev/shm"
"""Where the ``tmpfs`` backend's prefixes go: a local path in memory, with no disk below it."""


def tmpfs_available() -> bool:
    """Whether ``TMPFS`` is a tmpfs mount here (read from the kernel's mount table)."""
    with contextlib.suppress(OSError), open("/proc/self/mounts") as mounts:
        return any(line.split()[1:3] == [TMPFS, "tmpfs"] for line in mounts)
    return False
