"""The lease settings a run reads: its duration (``$MARIN_LEASE_TTL``) and the limits a stored
lease is judged against."""

from __future__ import annotations

import math
import os

from marin.execution.errors import ConfigError

TTL_ENV = "MARIN_LEASE_TTL"
CHECK_PID_ENV = "MARIN_LEASE_CHECK_PID"
DEFAULT_TTL_S = 60.0
MAX_TTL_S = 7 * 24 * 3600.0
"""A lease longer than a week is a mistake (or a garbled file): it would block a step for good."""
CLOCK_SKEW_S = 300.0
"""How far a lease's expiry may lie beyond now plus the lease's own TTL: the clock skew tolerated
between the hosts that share a prefix. Further ahead, the lease was written by a clock running
ahead, or planted, and it is taken over instead of blocking its step for days."""


def ttl_from_env() -> float:
    """``$MARIN_LEASE_TTL`` in seconds (default 60), checked: a positive, finite number."""
    raw = os.environ.get(TTL_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = math.nan
    if not (0 < ttl <= MAX_TTL_S):
        raise ConfigError(
            f"{TTL_ENV}={raw!r} is not a lease duration in seconds",
            f"set {TTL_ENV} to a number of seconds above 0 and at most {MAX_TTL_S:.0f} "
            f"(default {DEFAULT_TTL_S:.0f}), or unset it",
        )
    return ttl
