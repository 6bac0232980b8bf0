"""The one run loop: every runner that schedules steps itself drives its plan through here.

``RunLoop.run`` takes a plan (``decide``'s), a ``RunReport`` to fill and an ``Executor``, and:

- drives the one ``Scheduler``: a step is handed to the executor the moment its last dependency
  finishes, at most ``max_concurrent`` at once, critical path first, and (given a
  ``ResourcePool``) only when its declared resources are free;
- collects completions through one inbox (the executor's callbacks and a queued Ctrl-C both
  land there: nothing polls);
- gives each step its dependencies' new records for lineage, as they are when it starts;
- re-checks a served dependency when its first dependent that builds starts (another process
  may have deleted it since the plan read it): a vanished one is built first (or fails);
- retries a failed attempt ``spec.retries`` times with a short backoff, unless the executor's
  engine retries by itself (Prefect);
- holds every step that cannot go on now in one structure (``run/waiting.py``), keyed by what
  wakes it: a retry's or a deferred step's deadline (a step another runner's live lease holds,
  with an executor whose builds return ``Pending``: drivers sharing one prefix; its slot is
  freed for other ready steps until it is made ready again, when its build serves the other
  runner's record, ``built-by-other``, or takes over a lease that expired), a remote job's end
  (posted to the inbox by the process's one poller), a served dependency's rebuild;
- on Ctrl-C starts nothing new and lets running steps finish (a second one abandons them, and
  gives up every build pending on its job: the job runs on);
- words every "not run" reason (``marin.execution.run.report``), for the caller to raise.

``StepRunner`` is this loop plus a ``ThreadExecutor``; the compiled Prefect flow is this loop
plus a ``PrefectExecutor``. The Airflow runtime has no loop: Airflow's scheduler is the loop.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import signal
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from marin.execution.builder.commit import mark_interrupted
from marin.execution.builder.lineage import pipeline_finished, pipeline_started
from marin.execution.builder.outcome import BuildOutcome, LeaseHeld, Pending
from marin.execution.builder.request import BuildRequest
from marin.execution.builder.step_logs import written_log_url
from marin.execution.errors import AbandonedError, is_final
from marin.execution.heap import frozen_heap
from marin.execution.pipeline.resources import Grant, ResourcePool
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.decide import Decision, Plan, Upstream
from marin.execution.plan.options import DEFAULT_MAX_REMOTE
from marin.execution.remote.call import running_jobs, warn_running_jobs
from marin.execution.remote.timing import record_timing
from marin.execution.run.executors import Completion, CompletionKind, Executor, StepJob
from marin.execution.run.remote_slots import Slots
from marin.execution.run.report import (
    INTERRUPTED_JOB_REASON,
    INTERRUPTED_REASON,
    INTERRUPTED_RUNNING_REASON,
    KEEP_GOING_CLI,
    RunInterrupted,
    RunReport,
    blocked_reason,
    stopped_reason,
)
from marin.execution.run.scheduler import Scheduler
from marin.execution.run.waiting import Waiting
from marin.execution.store.lease import release_all_held, ttl_from_env
from marin.execution.store.location import Location
from marin.execution.store.records import ArtifactRecord, read_record
from marin.execution.vocabulary import Action, BuildOutcomeKind

log = logging.getLogger("marin")

RETRY_FIRST_DELAY_S = 0.5
RETRY_MAX_DELAY_S = 10.0
"""The local retry backoff: 0.5 s, then doubling, at most 10 s (short: a step's own transient
error, not an outage; Prefect and Airflow use their engine's own delays)."""


class RunListener(Protocol):
    """Hooks for progress displays; called on the run loop's thread."""

    def on_plan(self, total: int, skipped: int) -> None: ...
    def on_start(self, spec: StepSpec) -> None: ...
    def on_finish(self, outcome: BuildOutcome) -> None: ...
    def on_fail(self, spec: StepSpec, error: BaseException) -> None: ...


def _launch_settings() -> tuple[float, str | None]:
    """The lease TTL and the working directory, read once per run: a fn that changes the
    environment cannot make a later step fail on a setting it never had, and the records name
    the checkout the run was launched from."""
    try:
        working_dir: str | None = os.getcwd()
    except OSError:  # deleted under the process: each build reports it, as before
        working_dir = None
    return ttl_from_env(), working_dir


@dataclass
class _ServedChecks:
    """Served steps re-checked when a step that reads them starts (their record may have
    vanished since the plan); the steps waiting for a rebuild are in ``Waiting``."""

    checked: set[str] = field(default_factory=set)
    """Served steps re-checked already (present, or rebuilt in this run)."""
    failed_as: dict[str, str] = field(default_factory=dict)
    """A step that could not run because its served dependency's rebuild failed -> it."""
    failed: set[str] = field(default_factory=set)
    """Vanished served steps whose rebuild failed."""


def _abandoned(spec: StepSpec) -> AbandonedError:
    """The end of a build the loop gives up while it waits for its job (the loop left)."""
    return AbandonedError(
        "abandoned after an interrupt while its job ran: nothing is committed; the job runs on",
        "run again: the next run reattaches to the job",
        spec.step_id,
    )


class _Interrupt:
    """Put in the inbox by a first or second Ctrl-C, which the loop handles between two items."""


@dataclass(frozen=True)
class _JobEnded:
    """Put in the inbox by the poller: the job of ``path``'s pending build ended."""

    path: str


_INTERRUPT = _Interrupt()
_Item = Completion | _Interrupt | _JobEnded


class RunLoop:
    """One run of a plan's steps to build, on one executor (see the module docstring).

    Made per run and used once. ``exit_on_interrupt`` is the CLI's choice: on Ctrl-C, mark
    running steps failed and release their leases at once, because the process exits right
    after. A library caller's process lives on, so by default a first Ctrl-C waits for the
    running steps and a second one abandons them (they keep their leases until their threads
    end, and never commit).
    """

    def __init__(
        self,
        plan: Plan,
        report: RunReport,
        executor: Executor,
        *,
        max_concurrent: int,
        max_remote: int = DEFAULT_MAX_REMOTE,
        keep_going: bool = False,
        resources: ResourcePool | None = None,
        order: str = "longest-path",
        region: str | None = None,
        listener: RunListener | None = None,
        exit_on_interrupt: bool = False,
        keep_going_hint: str = KEEP_GOING_CLI,
        retry_delay_s: float = RETRY_FIRST_DELAY_S,
        targets: Iterable[str] = (),
    ) -> None:
        """``targets``: the output paths the caller asked for; a served one is re-checked once
        the other steps are done, and built again if its record vanished meanwhile."""
        self.plan, self.report, self.executor = plan, report, executor
        self.keep_going, self.keep_going_hint = keep_going, keep_going_hint
        self.resources, self.region, self.listener = resources, region, listener
        self.exit_on_interrupt, self.retry_delay_s = exit_on_interrupt, retry_delay_s
        self.lease_ttl, self.working_dir = _launch_settings()
        self._decisions = plan.decisions
        self._to_build = plan.to_build
        self.scheduler = Scheduler(
            {p: [d.output_path for d in self._decisions[p].spec.deps] for p in self._to_build},
            keep_going=keep_going,
            order=order,
            label=lambda p: self._decisions[p].spec.step_id,
        )
        self.waiting = Waiting(self.scheduler)
        """Every step that waits: retries, deferred steps, pending jobs, served rebuilds."""
        self._inbox: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._taken: collections.deque[_Item] = collections.deque()
        """Taken from the inbox, not yet handled: the loop leaving meanwhile still sees them."""
        self._left, self._left_lock = False, threading.Lock()  # the loop has left (_post)
        self._abandon = threading.Event()
        self._run_token = uuid.uuid4().hex  # a forced step's retry resumes only this run's attempt
        self._interrupted = False
        self._started: dict[str, float] = {}
        self._grants: dict[str, Grant] = {}
        self._built: dict[str, ArtifactRecord] = {}
        """This run's new records, by output path: the lineage of what starts after them."""
        self.served = _ServedChecks()
        self._targets = list(targets)
        self._targets_checked = False
        self._slots = Slots.for_decisions(max_concurrent, max_remote, self._decisions)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Run every step to build and fill the report; then call ``raise_if_failed``.

        Raises here only ``KeyboardInterrupt`` (a second Ctrl-C, or the CLI's first), or a bug.
        The objects the run starts with (its lowered graph) are out of the garbage collector's
        scans meanwhile (``marin.execution.heap``).
        """
        with frozen_heap():
            self._run()

    def _run(self) -> None:
        self.scheduler.prepare()
        # The pipeline run's own OpenLineage START/end (None, and nothing sent, when lineage is
        # off or no pipeline run is named): the parent every build of this loop names.
        pipeline = pipeline_started(len(self._to_build))
        sigint = None if self.exit_on_interrupt else _QueuedInterrupts.install(self._inbox)
        try:
            self._dispatch()
            while self._active():
                try:
                    self._taken.extend(self._wait())
                    while self._taken:
                        self._handle(self._taken[0])
                        self._taken.popleft()
                    for job in self.waiting.due():
                        self._resubmit(job)
                    self._dispatch()
                except KeyboardInterrupt:
                    if sigint is not None:
                        raise  # from our handler: a second Ctrl-C
                    self._on_interrupt()  # Ctrl-C raised here: the SIGINT handler is not ours
            if sigint is not None and sigint.count:
                self._interrupted = True  # pressed as the last step finished: still one
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                self._word_interrupted()
            self._leave()
            pipeline_finished(pipeline, exc)  # ABORT (after its open builds' ABORTs), or FAIL
            raise
        finally:
            if sigint is not None:
                sigint.restore()
        self.executor.shutdown(wait=True)
        self._word_not_run()
        # After every build's own end event: the executor has shut down.
        pipeline_finished(
            pipeline,
            KeyboardInterrupt() if self._interrupted else None,
            failed=len(self.report.failures),
        )

    def raise_if_failed(self, *, not_run_in_message: bool = False) -> None:
        """The run's end as the caller sees it: its failure (``report.raise_failures``) if a
        step failed, else ``KeyboardInterrupt`` if a first Ctrl-C stopped it."""
        self.report.raise_failures(self.keep_going, not_run_in_message=not_run_in_message)
        if self._interrupted:
            self.report.interrupted = True
            raise RunInterrupted(self.report)

    def _active(self) -> bool:
        """Something runs, waits, or can start; once nothing does, the caller's served targets
        are re-checked (once): a vanished one is rebuilt, and the loop goes on for it."""
        if self.scheduler.is_active() or self.waiting.active:
            return True
        if self._targets_checked:
            return False
        self._targets_checked = True
        if self._interrupted or self.scheduler.outcome.stopped_by is not None:
            return False
        for path in self._targets:
            served = self._decisions[path].action == Action.SKIP
            if served and path not in self.served.checked and self._record_gone(path):
                self._rebuild_served(path, None)
        return bool(self.waiting.rebuilding)

    def _wait(self) -> list[_Item]:
        """Block until something ends (or the next deadline is due), then take all that has."""
        try:
            first = self._inbox.get(timeout=self.waiting.timeout())
        except queue.Empty:
            return []
        return [first, *self._drain()]

    def _handle(self, item: _Item) -> None:
        if isinstance(item, _Interrupt):
            self._on_interrupt()
        elif isinstance(item, _JobEnded):
            job = self.waiting.job_ended(item.path)
            if job is not None:  # its build goes on: collect the job, commit
                self.executor.submit(job, self._post)
        else:
            self._collect(item)

    def _post(self, item: _Item) -> None:
        """The executor's and the poller's callback: into the inbox, or, once the loop has
        left, a pending build given up at once (nobody would resume it)."""
        with self._left_lock:
            if not self._left:
                self._inbox.put(item)
                return
        if isinstance(item, Completion) and item.pending is not None:
            item.pending.release(_abandoned(item.pending.spec))

    def _leave(self) -> None:
        warn_running_jobs()
        with self._left_lock:
            self._left = True
        taken, self._taken = [*self._taken, *self._drain()], collections.deque()
        pending = [i for i in taken if isinstance(i, Completion) and i.pending]
        for done in pending:
            self.waiting.job_running(done.job, cast(Pending, done.pending))
        if (self.scheduler.running or self.waiting.rebuilding) and not self.exit_on_interrupt:
            # Leaving while fn still runs in this process (a second Ctrl-C, or any error here):
            # those builds keep their leases until fn returns, and never commit; builds pending
            # on a job give theirs up now (the job runs on: the next run reattaches to it).
            self._abandon.set()
            log.warning(
                "interrupted again: abandoning %d running step(s); they keep their leases "
                "until their threads end, and never commit",
                len(self.scheduler.running),
            )
            self.waiting.release_all(_abandoned)
        else:
            # The process exits now, ending every fn: leave nothing RUNNING, no lease held.
            mark_interrupted()
            release_all_held()
        self.executor.shutdown(wait=False)

    def _drain(self) -> list[_Item]:
        """Whatever the inbox holds now."""
        items = []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    def _on_interrupt(self) -> None:
        """A first Ctrl-C: start nothing new and let the running steps finish."""
        if self.exit_on_interrupt or self._interrupted:
            raise KeyboardInterrupt
        self._interrupted = True
        self.scheduler.stop()
        for job, error in self.waiting.stop():  # waiting to retry: their last attempt ends them
            self._fail(job.path, error or RuntimeError("interrupted before it could start"))
        if self.scheduler.running:
            log.warning(
                "interrupted: starting no more steps; waiting for %d running step(s) "
                "to finish (press Ctrl-C again to abandon them)",
                len(self.scheduler.running),
            )

    # -- starting steps ---------------------------------------------------------------------

    def _admit(self, path: str) -> bool:
        """Start a ready step only when its declared resources are free (the pool keeps the
        first step it refuses reserved, so a big step is not starved by small ones)."""
        if not self._slots.admit(path):
            return False
        spec = self._decisions[path].spec
        if self.resources is None or spec.remote is not None:
            return True  # a remote step's resources are its job's, placed by its backend
        if not spec.resources.amounts():
            return True  # asks for nothing: always fits, and a grant would hold no devices
        grant = self.resources.try_acquire(spec.step_id, spec.resources)
        if grant is None:
            self._slots.give_back(path)
            return False
        self._grants[path] = grant
        return True

    def _dispatch(self) -> None:
        free = self._slots.free(self.scheduler.running)
        for path in self.scheduler.get_ready(free, self._admit):
            resumed = self.waiting.resumed(path)
            if resumed is not None:  # deferred, and admitted again: the same attempt
                self._submit(path, resumed.attempt)
                continue
            spec = self._decisions[path].spec
            log.info("start %s", spec.step_id)
            if self.listener:
                self.listener.on_start(spec)
            self._started[path] = time.perf_counter()
            lost = next((d for d in spec.deps if d.output_path in self.served.failed), None)
            if lost is not None:  # a served dependency vanished, and its rebuild failed
                self.served.failed_as[path] = lost.output_path
                self._release(path)
                self.scheduler.failed(path)
                continue
            vanished = self._vanished_deps(spec)
            if vanished:
                for dep in vanished:
                    self._rebuild_served(dep, path)
                continue
            self._submit(path, 1)

    def _submit(self, path: str, attempt: int) -> None:
        decision = self._decisions[path]
        spec = decision.spec
        if path in self.waiting.rebuilding:  # a vanished served step: decided again from storage
            request = self._build_request(spec, None, None, self._devices_for(path))
        else:
            upstream = self.plan.upstream(spec, self._built)
            request = self._build_request(spec, decision, upstream, self._devices_for(path))
        self.report.attempts[path] = attempt
        self.executor.submit(StepJob(path, spec, attempt, request), self._post)

    def _resubmit(self, job: StepJob) -> None:
        """A job whose deadline is due, in its slot: a retry, or a served step's rebuild."""
        self.report.attempts[job.path] = job.attempt
        if job.attempt > 1:
            log.info("start %s (attempt %d of %d)", job.spec.step_id, job.attempt,
                     job.spec.retries + 1)  # fmt: skip
        self.executor.submit(job, self._post)

    def _devices_for(self, path: str) -> tuple[int, ...]:
        grant = self._grants.get(path)
        held = self.waiting.rebuilding.get(path)
        if grant is None and held:  # a served step's rebuild runs in its first dependent's slot
            grant = self._grants.get(held[0])
        return grant.devices if grant is not None else ()

    def _build_request(
        self,
        spec: StepSpec,
        decision: Decision | None,
        upstream: list[Upstream] | None,
        devices: tuple[int, ...],
    ) -> BuildRequest:
        return BuildRequest(
            spec,
            self.report.location,
            self.plan.policy,
            self.region,
            decision,
            upstream,
            self._abandon,
            self.executor.wait,
            self.lease_ttl,
            self.working_dir,
            devices,
            run=self._run_token,
        )

    # -- served steps, re-checked when served -----------------------------------------------

    def _vanished_deps(self, spec: StepSpec) -> list[str]:
        """``spec``'s served dependencies whose record is gone now (each read once a run).

        Only a step that builds asks, so a run that builds nothing reads nothing more."""
        vanished = []
        for dep in spec.deps:
            path = dep.output_path
            if path in self.served.checked or path in self.waiting.rebuilding:
                if path in self.waiting.rebuilding:
                    vanished.append(path)
                continue
            if self._decisions[path].action == Action.SKIP and self._record_gone(path):
                vanished.append(path)
        return list(dict.fromkeys(vanished))

    def _record_gone(self, path: str) -> bool:
        """Read a served step's record again (once a run): True if it is gone now."""
        self.served.checked.add(path)
        return record_gone(self.report.location, self._decisions[path])

    def _rebuild_served(self, path: str, held: str | None) -> None:
        """Build a served step whose record vanished, for ``held`` (a step waiting for it), or
        for the caller (``None``: a requested target)."""
        if not self.waiting.rebuild(path, held):
            return
        spec = self._decisions[path].spec
        log.warning(
            "build %s: planned to be served, but its record is gone (deleted since the plan)",
            spec.step_id,
        )
        self._started[path] = time.perf_counter()
        if self.listener:
            self.listener.on_start(spec)
        self._submit(path, 1)

    def _served_ended(self, path: str, error: BaseException | None) -> None:
        if error is not None:
            self.served.failed.add(path)
        for held in self.waiting.rebuilt(path, ok=error is None):
            if error is None:
                self._submit(held, 1)
                continue
            self.served.failed_as[held] = path
            self._release(held)
            self.scheduler.failed(held)

    # -- completions ------------------------------------------------------------------------

    def _collect(self, done: Completion) -> None:
        job = done.job
        if done.kind == CompletionKind.PENDING:
            self._pending(job, cast(Pending, done.pending))
            return
        if done.kind == CompletionKind.FAILED:
            assert done.error is not None
            if self._retry(job, done.error):
                return
            self._fail(job.path, done.error)
            return
        assert done.outcome is not None
        path, outcome = job.path, done.outcome
        duration = time.perf_counter() - self._started[path]
        self.report.durations[path] = duration
        self.report.outcomes[path] = outcome
        self._built[path] = outcome.record
        built = outcome.action == BuildOutcomeKind.BUILT and outcome.record is not None
        if built and log.isEnabledFor(logging.INFO):
            timing = record_timing(outcome.record, duration)  # a reattached job's own time
            log.info("finish %s in %.2fs%s", job.spec.step_id, timing.duration_s,
                     timing.note and f" ({timing.note})")  # fmt: skip
        if self.listener:
            self.listener.on_finish(outcome)
        if path in self.waiting.rebuilding:
            self._served_ended(path, None)
            return
        self._release(path)
        self.scheduler.done(path)

    def _pending(self, job: StepJob, pending: Pending) -> None:
        """``job``'s build waits: for another runner's lease (a deadline; its slot is freed,
        unless a served step's rebuild holds its dependent's), or for its job's end."""
        why = pending.why
        if isinstance(why, LeaseHeld):
            keep_slot = job.path in self.waiting.rebuilding
            if not keep_slot:
                self._release(job.path)
            self.waiting.lease_held(job, why, keep_slot=keep_slot)
            return
        self.waiting.job_running(job, pending)
        why.when_ended(lambda: self._post(_JobEnded(job.path)))

    def _retry(self, job: StepJob, error: BaseException) -> bool:
        """Schedule another attempt if the step has retries left and the loop owns retries."""
        if (
            self.executor.retries_steps
            or job.attempt > job.spec.retries
            or self._interrupted
            or not isinstance(error, Exception)
            or is_final(error)  # not fn's error: a cancelled job, an abandoned build
        ):
            return False
        delay = min(RETRY_MAX_DELAY_S, self.retry_delay_s * 2 ** (job.attempt - 1))
        log.warning(
            "retry %s (attempt %d of %d) in %.1fs: attempt %d failed: %s: %s",
            job.spec.step_id,
            job.attempt + 1,
            job.spec.retries + 1,
            delay,
            job.attempt,
            type(error).__name__,
            error,
        )
        self.waiting.retry(StepJob(job.path, job.spec, job.attempt + 1, job.request), delay, error)
        return True

    def _fail(self, path: str, error: BaseException) -> None:
        spec = self._decisions[path].spec
        duration = time.perf_counter() - self._started[path]
        self.report.durations[path] = duration
        self.report.failures[path] = error
        written = written_log_url(self.report.location, spec.output_path)  # None: refused
        log.error(
            "fail %s after %.2fs: %s: %s%s",
            spec.step_id,
            duration,
            type(error).__name__,
            error,
            "" if written is None else f" (log: {written})",
        )
        if self.listener:
            self.listener.on_fail(spec, error)
        if path in self.waiting.rebuilding:
            self._served_ended(path, error)
            return
        self._release(path)
        self.scheduler.failed(path)

    def _release(self, path: str) -> None:
        grant = self._grants.pop(path, None)
        if grant is not None and self.resources is not None:
            self.resources.release(grant)

    # -- how it ended -----------------------------------------------------------------------

    def _word_interrupted(self) -> None:
        """A Ctrl-C ends the run here: each step to build that did not end says why (a step
        whose job runs on, one cut short, one never started)."""
        self.report.interrupted = True
        jobs = running_jobs()
        report = self.report
        for path in self._to_build:
            if path in report.outcomes or path in report.failures or path in report.not_run:
                continue
            if self._decisions[path].spec.step_id in jobs:
                report.not_run[path] = INTERRUPTED_JOB_REASON
            elif path in self._started:
                report.not_run[path] = INTERRUPTED_RUNNING_REASON
            else:
                report.not_run[path] = INTERRUPTED_REASON

    def _word_not_run(self) -> None:
        outcome = self.scheduler.finish()
        names = {p: d.spec.step_id for p, d in self._decisions.items()}
        for path in self.served.failed_as:
            self.report.not_run[path] = blocked_reason([names[self.served.failed_as[path]]])
        for path, roots in outcome.blocked.items():
            failed = [names[self.served.failed_as.get(r, r)] for r in roots]
            self.report.not_run[path] = blocked_reason(list(dict.fromkeys(failed)))
        for path in outcome.not_started:
            if self._interrupted:
                self.report.not_run[path] = INTERRUPTED_REASON
            elif outcome.stopped_by is not None:
                stopped = names[self.served.failed_as.get(outcome.stopped_by, outcome.stopped_by)]
                self.report.not_run[path] = stopped_reason(stopped, self.keep_going_hint)


def record_gone(location: Location, decision: Decision) -> bool:
    """Read a served step's record again: True if it is gone (or unreadable) now."""
    try:
        return read_record(location, decision.spec.output_path) is None
    except Exception as exc:  # unreadable now: what needs it cannot trust it either
        log.warning("skip %s: its record cannot be read now: %s", decision.spec.step_id, exc)
        return True


def served_targets_gone(plan: Plan, location: Location, targets: Iterable[str]) -> bool:
    """Whether a served target's record is gone now (one record read per served target): a run
    that builds nothing asks before it reports success, and runs the loop, which rebuilds it,
    if one is. (A run that builds something has the loop re-check its targets at its end.)"""
    decisions = [plan.decisions[path] for path in dict.fromkeys(targets)]
    return any(d.action == Action.SKIP and record_gone(location, d) for d in decisions)


class _QueuedInterrupts:
    """The run loop's SIGINT handler while steps run: a first and a second Ctrl-C are queued,
    a third raises where it lands.

    Raised where it lands, a ``KeyboardInterrupt`` could cut the loop's bookkeeping in half: a
    first one, a step handed to a worker but not yet counted as running (then taken for the
    second, abandoning steps the user meant to let finish); a second one, a build pending on its
    job taken from the inbox but not yet waiting (its lease then held until the process ends).
    Queued, each is handled between two items; a third is the way out of a loop that hangs.
    Installed only from the main thread and over Python's own handler: a caller's handler wins.
    """

    def __init__(self, inbox: queue.SimpleQueue[_Item]) -> None:
        self.count = 0
        self._inbox = inbox

    @classmethod
    def install(cls, inbox: queue.SimpleQueue[_Item]) -> _QueuedInterrupts | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return None
        handler = cls(inbox)
        signal.signal(signal.SIGINT, handler._on_sigint)
        return handler

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 2:
            raise KeyboardInterrupt
        self._inbox.put(_INTERRUPT)  # SimpleQueue.put is safe to call from a signal handler

    def restore(self) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
