"""Every step of a run that cannot go on now, in one place, keyed by what wakes it.

The ``Scheduler`` knows which steps may start and which run; this structure holds the ones that
wait, as Dagster's ``ActiveExecution`` holds its steps waiting to retry. What wakes a step:

- **a deadline**: a failed attempt's retry, after its backoff (the step keeps its slot); a step
  another runner's live lease holds (``LeaseHeld``: its slot is freed, and it is made ready
  again after a bounded backoff that never outlasts the holder's lease);
- **a job's end**: a build pending while its remote job runs (``JobRunning``: the step keeps
  its job slot); the process's one poller posts the end to the run loop's inbox, and
  ``job_ended`` hands back the build's ``resume``;
- **a served dependency's rebuild**: a step whose served dependency's record vanished waits, in
  its slot, for the rebuild (which runs in that slot too).

The run loop asks for the next deadline (``timeout``) and for what is due (``due``), and gives
every pending build up if it leaves early (``release_all``). No threads, no I/O.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import time
from collections.abc import Callable

from marin.execution.builder.lease_wait import LEASE_WAIT_FIRST_DELAY_S, LEASE_WAIT_MAX_DELAY_S
from marin.execution.builder.outcome import LeaseHeld, Pending
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.run.executors import StepJob
from marin.execution.run.scheduler import Scheduler

log = logging.getLogger("marin")


class Waiting:
    """The waiting steps of one run (see the module docstring); made by the run loop."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._deadlines: list[tuple[float, int, StepJob, bool]] = []
        """(due time, tie-break, job, whether it left its slot): retries and deferred steps."""
        self._sequence = itertools.count()
        self._resumed: dict[str, StepJob] = {}
        """Deferred steps ready again: their next dispatch resubmits the same attempt."""
        self._last_errors: dict[str, BaseException] = {}
        """A step waiting to retry -> its last attempt's error (its end, if not retried)."""
        self._deferrals: dict[str, int] = {}
        self._holders: dict[str, str] = {}
        """A deferred step -> the holder last logged for it (each new holder logged once)."""
        self._jobs: dict[str, tuple[StepJob, Pending]] = {}
        """A step whose build is pending while its job runs -> that build."""
        self.rebuilding: dict[str, list[str]] = {}
        """A vanished served step being rebuilt -> the steps that wait for it."""
        self._held: dict[str, set[str]] = {}
        """A step -> the served dependencies whose rebuild it waits for."""

    @property
    def active(self) -> bool:
        """Something waits (deferred steps of a stopped run stay not started: dropped)."""
        if self._scheduler.stopped and any(left for *_, left in self._deadlines):
            self._deadlines = [entry for entry in self._deadlines if not entry[3]]
            heapq.heapify(self._deadlines)
        return bool(self._deadlines or self._jobs or self.rebuilding)

    # -- deadlines ------------------------------------------------------------------------

    def timeout(self) -> float | None:
        """Seconds until the next deadline; None when none is set."""
        if not self._deadlines:
            return None
        return max(0.0, self._deadlines[0][0] - time.monotonic())

    def retry(self, job: StepJob, delay: float, error: BaseException) -> None:
        """Submit ``job`` (the next attempt) again after ``delay`` seconds, in its slot;
        ``error`` is the last attempt's, the step's end if the run stops meanwhile."""
        self._last_errors[job.path] = error
        self._push(job, delay, left_slot=False)

    def lease_held(self, job: StepJob, held: LeaseHeld, *, keep_slot: bool) -> None:
        """Another runner's lease holds ``job``'s step: try again after 0.02 s doubling to 1 s
        (as a build waiting for a lease polls), or sooner if the lease expires first, freeing
        the step's slot meanwhile unless ``keep_slot`` (a served step's rebuild keeps its
        dependent's). Each new holder is logged once."""
        path = job.path
        count = self._deferrals[path] = self._deferrals.get(path, 0) + 1
        delay = float(min(LEASE_WAIT_MAX_DELAY_S, LEASE_WAIT_FIRST_DELAY_S * 2 ** (count - 1)))
        until_expiry = held.expires_at - time.time()
        if self._holders.get(path) != held.holder:
            self._holders[path] = held.holder
            log.info(
                "wait %s: lease held by %s (expires in %.0fs); going on with other steps",
                job.spec.step_id,
                held.holder,
                max(0.0, until_expiry),
            )
        # Never 0: a clock skewed against the holder's must not make this a busy loop.
        delay = max(LEASE_WAIT_FIRST_DELAY_S, min(delay, until_expiry))
        if not keep_slot:
            self._scheduler.defer(path)
        self._push(job, delay, left_slot=not keep_slot)

    def _push(self, job: StepJob, delay: float, *, left_slot: bool) -> None:
        due = time.monotonic() + delay
        heapq.heappush(self._deadlines, (due, next(self._sequence), job, left_slot))

    def due(self) -> list[StepJob]:
        """Make the deferred steps now due ready again (in the scheduler), and return the jobs
        now due in their slots, to submit."""
        now, jobs = time.monotonic(), []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, job, left_slot = heapq.heappop(self._deadlines)
            if left_slot:
                self._resumed[job.path] = job
                self._scheduler.resume(job.path)
            else:
                self._last_errors.pop(job.path, None)
                jobs.append(job)
        return jobs

    def resumed(self, path: str) -> StepJob | None:
        """The attempt a deferred step ready again takes up; None for a fresh start."""
        return self._resumed.pop(path, None)

    def stop(self) -> list[tuple[StepJob, BaseException | None]]:
        """The run stops (an interrupt): deferred steps stay not started, and the jobs waiting
        to retry are returned with their last errors (their end)."""
        waiting, self._deadlines = self._deadlines, []
        return [(job, self._last_errors.pop(job.path, None)) for *_, job, left in waiting
                if not left]  # fmt: skip

    # -- jobs -------------------------------------------------------------------------------

    def job_running(self, job: StepJob, pending: Pending) -> None:
        """``job``'s build is pending while its remote job runs (it keeps its slot)."""
        self._jobs[job.path] = (job, pending)

    def job_ended(self, path: str) -> StepJob | None:
        """The attempt that goes on now that ``path``'s job ended: the build's ``resume``
        (None if the build was given up meanwhile)."""
        found = self._jobs.pop(path, None)
        if found is None:
            return None
        job, pending = found
        return dataclasses.replace(job, resume=pending.resume)

    def release_all(self, error: Callable[[StepSpec], BaseException]) -> None:
        """The run leaves with builds pending (a second Ctrl-C, an error): each gives up its
        lease, heartbeat and log, records its ``error`` and never commits; its job runs on."""
        jobs, self._jobs = self._jobs, {}
        for _, pending in jobs.values():
            try:
                pending.release(error(pending.spec))
            except Exception as exc:  # the others must still be released
                log.warning("could not release %s: %s", pending.spec.step_id, exc)

    # -- served dependencies rebuilt ----------------------------------------------------------

    def rebuild(self, dep: str, holder: str | None) -> bool:
        """``holder`` (None: the caller, for a requested target) waits for the served step
        ``dep``'s rebuild; True when that rebuild is to start now (the first to ask)."""
        if holder is not None:
            self._held.setdefault(holder, set()).add(dep)
        if dep in self.rebuilding:
            self.rebuilding[dep].extend([holder] if holder is not None else [])
            return False
        self.rebuilding[dep] = [holder] if holder is not None else []
        return True

    def rebuilt(self, dep: str, ok: bool) -> list[str]:
        """``dep``'s rebuild ended: the steps that go on now (``ok``, and nothing else to wait
        for), or every step that waited for it (not ``ok``: they cannot run)."""
        freed = []
        for holder in self.rebuilding.pop(dep):
            waiting = self._held.get(holder)
            if waiting is None:
                continue  # it cannot run already: another dependency's rebuild failed
            waiting.discard(dep)
            if not ok or not waiting:
                self._held.pop(holder)
                freed.append(holder)
        return freed
