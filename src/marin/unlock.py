"""``marin unlock STEP``: break a step's lease by hand.

A lease normally ends by itself: its holder releases it, or it expires (its TTL), or, on one
machine, its holder's process is provably gone. A lease whose holder died with a long TTL, or
that was planted, can still block a step until it expires; this removes it, after saying who
held it. A lease that still protects a build (``LeaseInfo.live``) is refused unless forced: its
holder would lose it, discard its result, and a second build could start beside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from marin.execution.errors import InvalidStepError, MarinError
from marin.execution.names import validate_name, validate_version
from marin.execution.pipeline.scope import current_user
from marin.execution.remote.view import job_note
from marin.execution.store.lease import LeaseInfo, break_lease, read_lease
from marin.execution.store.location import Location
from marin.execution.store.records import (
    FAILED,
    USERS_FOLDER,
    lease_path,
    read_record,
    write_status,
)
from marin.terminal_text import safe_text


@dataclass(frozen=True)
class UnlockResult:
    """What ``unlock`` did: the text for the user and whether the lease is gone."""

    message: str
    unlocked: bool


def step_output_path(step: str) -> str:
    """``name@version`` -> its output path, with both parts checked by the name grammar."""
    if not isinstance(step, str) or "@" not in step:
        raise InvalidStepError(
            f"{step!r} is not name@version",
            "give the step as name@version, as `marin plan` and `marin ls` print it",
        )
    name, _, version = step.rpartition("@")
    validate_name(name)
    validate_version(version, name)
    return f"{name}/{version}"


def describe_lease(info: LeaseInfo) -> str:
    """Who held the lease, since when, and in what state it is: one phrase."""
    if info.garbled:
        return "an unreadable (garbled) lease, which protects nothing"
    remaining = info.expires_at - time.time()
    if info.skewed:
        hours = remaining / 3600
        state = f"expiring {hours:.1f} h ahead, beyond its TTL: a skewed clock or a planted lease"
    elif info.expired:
        state = f"expired {-remaining:.0f}s ago"
    elif info.holder_dead:
        state = "its process is gone"
    elif info.on_this_machine:
        state = f"a live process on this machine, expires in {remaining:.0f}s"
    else:
        state = (
            f"expires in {remaining:.0f}s; on another machine, so Marin cannot tell whether "
            "it still runs"
        )
    return f"held by {info.who()} ({state})"


def _user_hint(location: Location, output_path: str, step: str) -> str:
    """Where the lease is when ``step`` is placed in the current user's folder (``--scope
    user``; red team r21-2): ``; the lease of its build in your folder is at ...: marin unlock
    users/<user>/<step>``, or "" (no such lease)."""
    try:
        user = current_user()
    except InvalidStepError:
        return ""
    if user is None:
        return ""
    placed = f"{USERS_FOLDER}/{user}/{output_path}"
    try:
        there = location.has_file(location.path(lease_path(placed)))
    except MarinError:
        return ""
    if not there:
        return ""
    name, _, version = step.rpartition("@")
    return (
        f"; the lease of its build in your folder is at {location.url_for(lease_path(placed))}: "
        f"marin unlock {USERS_FOLDER}/{user}/{name}@{version}"
    )


def unlock(location: Location, output_path: str, step: str, *, force: bool) -> UnlockResult:
    """Remove ``step``'s lease under ``location`` unless it is live and not ``force``d.

    A broken lease of an unbuilt step leaves a FAILED status naming the holder, so ``marin ls``
    says what happened and the next build knows an attempt worked there (and clears its debris).
    """
    url = location.url_for(lease_path(output_path))
    info = read_lease(location, output_path)
    if info is None:
        hint = _user_hint(location, output_path, step)
        return UnlockResult(f"{step} has no lease ({url}): nothing to unlock{hint}", True)
    held = safe_text(describe_lease(info))
    if info.live and not force:
        return UnlockResult(
            f"error: refusing to unlock {step}: its lease is {held}; it is probably building "
            "now: wait for it or stop that process, or pass --force to break the lease anyway "
            "(that build then discards its result when it finds its lease gone)",
            False,
        )
    if not break_lease(location, output_path, info):
        return UnlockResult(
            f"error: the lease of {step} changed while unlocking it (renewed or taken over): "
            "run `marin unlock` again to see who holds it now",
            False,
        )
    if read_record(location, output_path) is None:
        write_status(
            location,
            output_path,
            FAILED,
            error=f"interrupted: lease broken by `marin unlock` ({describe_lease(info)})",
        )
    note = job_note(location, output_path)
    note = f"; {safe_text(note)}" if note else ""
    return UnlockResult(f"unlocked {step}: removed its lease ({url}), {held}{note}", True)
