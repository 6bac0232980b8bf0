"""The lease format: ``lease.json``'s fields, parsed as untrusted data (``LeaseInfo.parse``),
and how a reader judges a lease: expired, skewed, garbled, or held by a process that is gone."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from marin.execution.store.lease.holder import _MACHINE, _holder_is_dead
from marin.execution.store.lease.settings import CLOCK_SKEW_S, DEFAULT_TTL_S, MAX_TTL_S


@dataclass(frozen=True)
class LeaseInfo:
    """One lease as read from storage: who holds it, until when, and since when."""

    holder: str
    token: str
    expires_at: float
    process: str | None = None
    ttl: float | None = None
    """The holder's TTL (None in leases written before it was stored)."""
    started_at: str | None = None
    """When the holding attempt began (UTC, ISO 8601), if the lease says."""
    skewed: bool = False
    """Its expiry lies further beyond now than its TTL allows (``CLOCK_SKEW_S``): a clock
    running ahead, or a planted lease. It protects nothing, like an expired one."""
    raw: bytes = field(default=b"", repr=False, compare=False)
    """The bytes it was parsed from (what a conditional delete compares against)."""

    @property
    def expired(self) -> bool:
        return time.time() >= self.expires_at

    @property
    def holder_dead(self) -> bool:
        return _holder_is_dead(self.process)

    @property
    def on_this_machine(self) -> bool:
        """Held by a process of this machine and PID namespace (whose liveness is knowable)."""
        return bool(self.process and _MACHINE and self.process.startswith(_MACHINE + "/"))

    @property
    def live(self) -> bool:
        """Whether it still protects its step: readable, not expired or skewed, holder alive."""
        return not (self.garbled or self.skewed or self.expired or self.holder_dead)

    def describe(self) -> str:
        remaining = self.expires_at - time.time()
        return f"{self.holder} (expires in {remaining:.0f}s)"

    def who(self) -> str:
        """Host, pid and thread of the holder, and since when: for ``marin unlock``."""
        parts = self.holder.split(":")  # host:pid:thread, as ``_holder_id`` writes it
        host = ":".join(parts[:-2]) if len(parts) >= 3 else self.holder
        pid = parts[-2] if len(parts) >= 3 else "?"
        since = f", since {self.started_at}" if self.started_at else ""
        return f"host {host}, pid {pid}{since}"

    @property
    def garbled(self) -> bool:
        return self.holder == GARBLED

    @classmethod
    def parse(cls, raw: bytes, default_ttl: float = DEFAULT_TTL_S) -> LeaseInfo:
        """Any bytes: a well-formed lease, or a garbled one that counts as expired.

        A torn, foreign or hostile lease file protects nothing. Expiries that are not finite,
        not positive, or further ahead than the longest allowed TTL are garbled too: a lease
        expiring at NaN or 1e300 would otherwise be waited on forever. An expiry within that
        week but beyond now plus the lease's own TTL (``default_ttl``, the reader's, for leases
        that do not store theirs) and ``CLOCK_SKEW_S`` is ``skewed``: taken over like an
        expired one.
        """
        try:
            data = json.loads(raw.decode())
            holder, token, expires = data["holder"], data["token"], data["expires_at"]
            process = data.get("process")
            ttl = data.get("ttl")
            started_at = data.get("started_at")
        except (
            ValueError,
            KeyError,
            TypeError,
            UnicodeDecodeError,
            AttributeError,
            RecursionError,
        ):
            return cls(GARBLED, "", 0.0)
        if (
            not isinstance(holder, str)
            or not isinstance(token, str)
            or not token
            or not _is_number(expires)
            or not (process is None or isinstance(process, str))
            or not (ttl is None or (_is_number(ttl) and 0 < ttl <= MAX_TTL_S))
        ):
            return cls(GARBLED, "", 0.0)
        expires_at, now = float(expires), time.time()
        if not (0 < expires_at <= now + MAX_TTL_S):
            return cls(GARBLED, "", 0.0)
        own_ttl = default_ttl if ttl is None else float(ttl)
        skewed = expires_at > now + own_ttl + CLOCK_SKEW_S
        since = started_at if isinstance(started_at, str) else None
        return cls(holder, token, expires_at, process, ttl, since, skewed, raw)


def _is_number(value: Any) -> bool:
    """A finite int or float (not a bool). ``10**400`` is none: no float holds it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


GARBLED = "<unreadable>"
GARBLED_GRACE_S = 1.0
"""On a store whose create may be seen half done (``torn_create``), how long the same
unparsable lease must stay so before it is taken over: a competitor may still be writing it."""


def _unparsable(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return True
    return False


_garbled_seen: dict[str, tuple[bytes, float]] = {}
_garbled_lock = threading.Lock()


def _garbled_for_a_while(path: str, raw: bytes) -> bool:
    now = time.monotonic()
    with _garbled_lock:
        seen = _garbled_seen.get(path)
        if seen is None or seen[0] != raw:
            _garbled_seen[path] = (raw, now)
            return False
        if now - seen[1] < GARBLED_GRACE_S:
            return False
        del _garbled_seen[path]
        return True
