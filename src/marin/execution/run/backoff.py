"""What a run waits on, beside the ``Scheduler``: attempts waiting for a retry, and deferred
steps waiting for another runner's lease.

The scheduler knows which steps may start; this queue knows *when* a step that could not go on
comes back: a failed attempt after its retry backoff, a deferred step (``Scheduler.defer``)
after a bounded backoff that never outlasts the holder's lease. The run loop only asks it for
the next deadline (``timeout``) and for what is due (``due``). Dagster keeps its
``_waiting_to_retry`` in its execution state the same way.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time

from marin.execution.build.commit import LEASE_WAIT_FIRST_DELAY_S, LEASE_WAIT_MAX_DELAY_S
from marin.execution.errors import Deferred
from marin.execution.run.executors import StepJob
from marin.execution.run.scheduler import Scheduler

log = logging.getLogger("marin")


class Backoff:
    """Jobs waiting for a deadline: retries (still counted running by the scheduler, or a
    served step's rebuild) and deferred steps (parked in the scheduler until due)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._retries: list[tuple[float, int, StepJob]] = []
        """Attempts waiting for their backoff: (due time, tie-break, job)."""
        self._parked: list[tuple[float, int, StepJob]] = []
        """Deferred steps (another runner held them), out of their slots: (due, tie, job)."""
        self._resumed: dict[str, StepJob] = {}
        """Deferred steps ready again: their next dispatch resubmits the same attempt."""
        self._last_errors: dict[str, BaseException] = {}
        """A step waiting to retry -> its last attempt's error (its end, if not retried)."""
        self._deferrals: dict[str, int] = {}
        self._holders: dict[str, str] = {}
        """A deferred step -> the holder last logged for it (each new holder logged once)."""
        self._sequence = itertools.count()

    @property
    def pending(self) -> bool:
        """Something waits for a deadline (deferred steps of a stopped run stay not started)."""
        if self._parked and self._scheduler.stopped:
            self._parked.clear()
        return bool(self._retries or self._parked)

    def timeout(self) -> float | None:
        """Seconds until the next deadline; None when nothing waits."""
        due = [heap[0][0] for heap in (self._retries, self._parked) if heap]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def retry(self, job: StepJob, delay: float, error: BaseException) -> None:
        """Submit ``job`` (the next attempt) again after ``delay`` seconds; ``error`` is the
        last attempt's, the step's end if the run stops meanwhile."""
        self._last_errors[job.path] = error
        self.later(job, delay)

    def later(self, job: StepJob, delay: float) -> None:
        """Submit ``job`` again after ``delay`` seconds, keeping its slot."""
        heapq.heappush(self._retries, (time.monotonic() + delay, next(self._sequence), job))

    def deferral_delay(self, job: StepJob, why: BaseException | None) -> float:
        """How long a deferred ``job`` waits: 0.02 s doubling to 1 s (as a build waiting for a
        lease polls), or less if the holder's lease (``why``, a ``Deferred``) expires first.
        Each new holder is logged once."""
        path = job.path
        count = self._deferrals[path] = self._deferrals.get(path, 0) + 1
        delay = float(min(LEASE_WAIT_MAX_DELAY_S, LEASE_WAIT_FIRST_DELAY_S * 2 ** (count - 1)))
        if not isinstance(why, Deferred):
            return delay
        # Never 0: a clock skewed against the holder's must not make this a busy loop.
        until_expiry = why.expires_at - time.time()
        if self._holders.get(path) != why.holder:
            self._holders[path] = why.holder
            log.info(
                "wait %s: lease held by %s (expires in %.0fs); going on with other steps",
                job.spec.step_id,
                why.holder,
                max(0.0, until_expiry),
            )
        return float(max(LEASE_WAIT_FIRST_DELAY_S, min(delay, until_expiry)))

    def park(self, job: StepJob, delay: float) -> None:
        """Free a deferred ``job``'s slot (``Scheduler.defer``) and make it ready again after
        ``delay`` seconds. Raises ``ValueError`` if the scheduler does not count it running."""
        self._scheduler.defer(job.path)
        heapq.heappush(self._parked, (time.monotonic() + delay, next(self._sequence), job))

    def due(self) -> list[StepJob]:
        """Resume the deferred steps now due (ready again in the scheduler) and return the
        retries now due, to submit."""
        now = time.monotonic()
        while self._parked and self._parked[0][0] <= now:
            _, _, job = heapq.heappop(self._parked)
            self._resumed[job.path] = job
            self._scheduler.resume(job.path)
        jobs = []
        while self._retries and self._retries[0][0] <= now:
            _, _, job = heapq.heappop(self._retries)
            self._last_errors.pop(job.path, None)
            jobs.append(job)
        return jobs

    def resumed(self, path: str) -> StepJob | None:
        """The attempt a resumed deferred step takes up again; None for a fresh start."""
        return self._resumed.pop(path, None)

    def stop(self) -> list[tuple[StepJob, BaseException | None]]:
        """The run stops (an interrupt): deferred steps stay not started, and the jobs waiting
        to retry are returned with their last errors (their end)."""
        self._parked.clear()
        waiting, self._retries = self._retries, []
        return [(job, self._last_errors.pop(job.path, None)) for _, _, job in waiting]
