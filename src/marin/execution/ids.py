"""Unique ids for builds, leases and temporary files, without a system call per id; and the
jitter of every backoff, from the same private generator.

``uuid.uuid4()`` reads ``os.urandom`` each time: a system call, which also hands the GIL to
another thread, on every build (twice: the build id and the lease token) and every local atomic
write. These ids must be unique, not secret (a lease token is stored in the lease file, which
every reader of the prefix sees), so a private generator seeded once from ``os.urandom`` does.

It is private so that no user code can reseed it: a step that calls ``random.seed(0)`` must not
make two processes draw the same lease tokens. A forked child reseeds it (``register_at_fork``),
so parent and child never share a sequence. The backoffs draw their jitter from it too: a
draw from the ``random`` module would move the global state that a step's ``fn`` may have
seeded for a reproducible experiment (another thread's retry would change what its next draw
returns), and after a ``random.seed(0)`` in every process, their retries would run in step.

The process id is kept the same way: ``os.getpid`` is a system call too (glibc does not cache
it), asked by the lease holder and the provenance of every build.
"""

from __future__ import annotations

import os
import random

_rng = random.Random()  # seeded from os.urandom
_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _pid
    _rng.seed()
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_pid() -> int:
    """``os.getpid()``, without the system call (a forked child has its own, set at the fork)."""
    return _pid


# A version 4 UUID is 128 random bits with six of them fixed (RFC 9562, section 5.4): the
# version nibble 0100 at bits 76-79 and the variant 10 at bits 62-63, counted from the right.
_FIXED_BITS = (0xF000 << 64) | (0xC000 << 48)
_VERSION_4 = (0x4000 << 64) | (0x8000 << 48)


def new_id() -> str:
    """32 hex digits: a random (version 4) UUID, as ``uuid.uuid4().hex`` spells it. The bits
    are set here, not by ``uuid.UUID(version=4)``, which took three times as long, twice per
    build."""
    return f"{_rng.getrandbits(128) & ~_FIXED_BITS | _VERSION_4:032x}"


def jitter() -> float:
    """A uniform draw in [0, 1), for a backoff's jitter; the global ``random`` state is neither
    read nor moved (see the module docstring)."""
    return _rng.random()
