"""Fault hooks for crash and lease tests, switched on only by environment variables.

The engine calls :func:`crash_point` at the moments a crash matters (before the lease, after the
output, while writing the record, ...). ``MARIN_FAULT_CRASH`` is read once, when this module
is imported, so each call costs next to nothing. Tests set it in a child process to kill that
process with SIGKILL at an exact point, so crash tests never depend on sleeping and hoping:

    MARIN_FAULT_CRASH=after-output@chain/3   # SIGKILL after fn returned, before the record
    MARIN_FAULT_CRASH=record-write           # SIGKILL half-way through the first record write

``MARIN_FAULT_PAUSE_HEARTBEAT=1`` stops this process renewing its leases (a stalled holder), so a
test can let a lease expire under a live holder and check the holder then refuses to commit;
``until:<file>`` resumes renewing once that file exists.

The points, in the order a build reaches them: ``before-lease``, ``after-lease`` (lease held,
nothing written), ``after-output`` (``fn`` returned, no record), ``record-write`` (half of the
record's bytes written: to the temporary file on local disk, where the rename makes the write
atomic), ``record-torn`` (half of the record written at its final path, as a non-atomic store
could), ``after-record`` (record committed; on local disk and ``memory://`` the lease is released
with it, elsewhere it is still held). A remote step also passes ``after-submit`` (not in
``CRASH_POINTS``, which every build passes): its job submitted and named in ``job.json``; a
rebuild over a record or leftovers passes ``before-clear``: the record deleted, the output
not yet cleared.
``marin register`` passes ``register-before-manifest``: its freeze mark written, no manifest.

``MARIN_FAULT_HOLD=<point>:<folder>`` holds this process at ``hold_point(point)`` (a remote
step's ``before-resubmit``: its job was lost, not yet submitted again; ``before-submit``: it
holds the lease, and no job is recorded yet): it creates
``<folder>/held`` and waits until ``<folder>/go`` exists, so a test acts in that window.
"""

from __future__ import annotations

import os
import signal
import time

CRASH_ENV = "MARIN_FAULT_CRASH"
PAUSE_HEARTBEAT_ENV = "MARIN_FAULT_PAUSE_HEARTBEAT"
HOLD_ENV = "MARIN_FAULT_HOLD"
CRASH_POINTS = (
    "before-lease",
    "after-lease",
    "after-output",
    "record-write",
    "record-torn",
    "after-record",
)


_WANTED = os.environ.get(CRASH_ENV)
"""Read once, at import: the tests set it in a child's environment, and a build passes six
crash points, each of which would otherwise look the variable up."""


def should_crash(point: str, step: str) -> bool:
    """Whether ``MARIN_FAULT_CRASH`` asks for a crash at ``point`` (optionally ``@step``)."""
    wanted = _WANTED
    if not wanted:
        return False
    at, _, only = wanted.partition("@")
    return at == point and (not only or only in (step, step.rsplit("@", 1)[0]))


def crash_now() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_point(point: str, step: str) -> None:
    if should_crash(point, step):
        crash_now()


def hold_point(point: str) -> None:
    """Wait at ``point`` while ``MARIN_FAULT_HOLD`` asks (see the module docstring)."""
    at, _, folder = os.environ.get(HOLD_ENV, "").partition(":")
    if at != point or not folder:
        return
    open(os.path.join(folder, "held"), "w").close()
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.01)  # a test hook: the test creates the file


def heartbeat_paused() -> bool:
    """``MARIN_FAULT_PAUSE_HEARTBEAT=1`` pauses renewals for good; ``until:<file>`` until that
    file exists (a holder that stalls, then wakes up to find its lease taken over)."""
    value = os.environ.get(PAUSE_HEARTBEAT_ENV, "")
    if value.startswith("until:"):
        return not os.path.exists(value[len("until:") :])
    return value not in ("", "0")
