"""Waiting out a live lease: this step's own before it builds, or an input's being rebuilt.

Bounded, jittered backoff, logging who holds the lease; a lease held by the build whose ``fn``
asked is a ``ReentrantBuildError`` at once, never a hang.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from marin.execution.errors import ReentrantBuildError
from marin.execution.ids import jitter
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.store.lease import LeaseInfo, held_by_enclosing_build

log = logging.getLogger("marin")

LEASE_WAIT_FIRST_DELAY_S = 0.02
LEASE_WAIT_MAX_DELAY_S = 1.0
"""Backoff while a lease is held: from the first delay, doubling up to the most."""
LEASE_WAIT_LOG_EVERY_S = 30.0


def wait_out(
    spec: StepSpec,
    waited_for: str,
    probe: Callable[[], LeaseInfo | None],
    what: str,
    *,
    here: bool = True,
) -> LeaseInfo | None:
    """Call ``probe`` until it returns None (no live holder), with bounded, jittered backoff,
    logging who holds the lease. A lease held by the build whose ``fn`` made this very call
    would never be released: that is a ``ReentrantBuildError`` at once, not a hang. Not
    ``here``: another runner's live lease is returned at once instead of waited out."""
    delay = LEASE_WAIT_FIRST_DELAY_S
    last_holder: str | None = None
    last_log = 0.0
    while True:
        holder = probe()
        if holder is None:
            return None
        if held_by_enclosing_build(holder):
            raise ReentrantBuildError(
                f"{waited_for} is being built by the very build whose fn asked for it "
                "(run() called from inside its own fn): waiting for its lease would never end",
                "don't run a step, or anything that reads it, from inside its own fn; make the "
                "other steps its dependencies, or run them after it",
                spec.step_id,
            )
        if not here:
            return holder
        now = time.monotonic()
        if holder.holder != last_holder or now - last_log > LEASE_WAIT_LOG_EVERY_S:
            log.info("wait %s: %s %s", spec.step_id, what, holder.describe())
            last_holder, last_log = holder.holder, now
        time.sleep(delay * (0.5 + jitter() / 2))
        delay = min(delay * 2, LEASE_WAIT_MAX_DELAY_S)
