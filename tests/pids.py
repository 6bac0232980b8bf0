"""Waiting for a process that is not this one's child to end, as an event (no polling)."""

from __future__ import annotations

import os
import select


def exits_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has exited, or does within ``seconds``: its pidfd becomes
    readable when it exits (an event, no polling); no such process means it is gone already."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], seconds)
        return bool(readable)
    finally:
        os.close(fd)
