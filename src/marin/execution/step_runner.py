"""``StepRunner``: the embedded, threaded executor.

A run has two phases. First the plan: every step's record is read (in parallel when storage is
slow) and ``marin.execution.decide`` decides each step, exactly as ``marin plan`` does. Then the
steps to build run under the one ``Scheduler``: each is dispatched the moment its last dependency
finishes (a completion queue wakes the loop; nothing polls or sleeps), at most ``max_concurrent``
at once, critical path first. Every build goes through ``build_step``.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from marin.execution.artifact import Artifact
from marin.execution.build import (
    BuildOutcome,
    build_step,
    mark_interrupted,
    warn_if_served_stale,
)
from marin.execution.context import assigned_devices
from marin.execution.decide import BUILD, PRUNE, SKIP, Plan, Policy, Upstream
from marin.execution.errors import (
    InvalidStepError,
    PipelineFailedError,
    StepFailedError,
    step_failed,
)
from marin.execution.inspect import plan_run
from marin.execution.lease import release_all_held, ttl_from_env
from marin.execution.records import ArtifactRecord, log_path
from marin.execution.resources import Grant, ResourcePool, Resources, capacity_from, check_fits
from marin.execution.scheduler import READY_ORDERS, Scheduler
from marin.execution.step_spec import StepSpec
from marin.execution.storage import Location, open_prefix

log = logging.getLogger("marin")

# What happened to each step in a run (``marin run --json``).
BUILT, SKIPPED, PRUNED, FAILED_STEP, BLOCKED, BUILT_BY_OTHER = (
    "built",
    "skipped",
    "pruned",
    "failed",
    "blocked",
    "built-by-other",
)
RUN_ACTIONS = (BUILT, SKIPPED, PRUNED, FAILED_STEP, BLOCKED, BUILT_BY_OTHER)
RUN_REPORT_SCHEMA = 1


class RunListener(Protocol):
    """Hooks for progress displays; called on the scheduler thread."""

    def on_plan(self, total: int, skipped: int) -> None: ...
    def on_start(self, spec: StepSpec) -> None: ...
    def on_finish(self, outcome: BuildOutcome) -> None: ...
    def on_fail(self, spec: StepSpec, error: BaseException) -> None: ...


@dataclass(frozen=True)
class StepResult:
    """One step of a finished run, in the vocabulary of ``marin run --json``."""

    spec: StepSpec
    action: str
    """``built``, ``skipped``, ``pruned``, ``failed``, ``blocked`` or ``built-by-other``."""
    reason: str
    output_url: str
    duration_s: float | None = None


@dataclass
class RunReport:
    location: Location
    plan: Plan | None = None
    outcomes: dict[str, BuildOutcome] = field(default_factory=dict)
    """By output path: the steps built (or found built by another runner) in this run."""
    failures: dict[str, BaseException] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    """Steps to build that never started -> why (a failed dependency, fail-fast, an interrupt)."""
    durations: dict[str, float] = field(default_factory=dict)

    @property
    def to_build(self) -> list[str]:
        return self.plan.paths(BUILD) if self.plan else []

    @property
    def skipped(self) -> list[str]:
        return self.plan.paths(SKIP) if self.plan else []

    @property
    def pruned(self) -> list[str]:
        return self.plan.paths(PRUNE) if self.plan else []

    @property
    def blocked(self) -> list[str]:
        return sorted(self.not_run)

    def artifact(self, spec: StepSpec) -> Artifact:
        url = self.location.url_for(spec.output_path)
        outcome = self.outcomes.get(spec.output_path)
        if outcome is not None:
            return Artifact(spec, url, outcome.record)
        decision = self.plan.decisions.get(spec.output_path) if self.plan else None
        return Artifact(
            spec, url, decision.record if decision and decision.action == SKIP else None
        )

    def results(self) -> list[StepResult]:
        """Every step of the run, dependencies first."""
        if self.plan is None:
            return []
        out = []
        for path, decision in self.plan.decisions.items():
            url = self.location.url_for(path)
            spec = decision.spec
            if path in self.outcomes:
                outcome = self.outcomes[path]
                action = BUILT if outcome.action == "built" else BUILT_BY_OTHER
                out.append(StepResult(spec, action, outcome.reason or decision.reason, url,
                                      self.durations.get(path)))  # fmt: skip
            elif path in self.failures:
                error = self.failures[path]
                out.append(StepResult(spec, FAILED_STEP, f"{type(error).__name__}: {error}", url,
                                      self.durations.get(path)))  # fmt: skip
            elif path in self.not_run:
                out.append(StepResult(spec, BLOCKED, self.not_run[path], url))
            elif decision.action == SKIP:
                out.append(StepResult(spec, SKIPPED, decision.reason, url))
            elif decision.action == PRUNE:
                out.append(StepResult(spec, PRUNED, decision.reason, url))
            else:  # planned to build, and the run ended first (a dry run)
                out.append(StepResult(spec, BLOCKED, "not started", url))
        return out

    def to_json(self) -> dict[str, Any]:
        """``marin run --json`` (documented in docs/run-json.md)."""
        results = self.results()
        counts = {a: sum(1 for r in results if r.action == a) for a in RUN_ACTIONS}
        policy = self.plan.policy if self.plan else Policy()
        return {
            "schema": RUN_REPORT_SCHEMA,
            "prefix": self.location.url,
            "ok": not self.failures,
            "options": {
                "on_drift": policy.on_drift,
                "force": sorted(policy.force),
                "cascade": policy.cascade,
            },
            "summary": {"total": len(results), **counts},
            "steps": [
                {
                    "step": r.spec.step_id,
                    "action": r.action,
                    "reason": r.reason,
                    "duration_s": None if r.duration_s is None else round(r.duration_s, 6),
                    "output_path": r.output_url,
                }
                for r in results
            ],
        }


class StepRunner:
    ready_order: str = "longest-path"
    """Which ready step starts first when a slot frees: ``longest-path`` (the step with the
    longest chain of dependents after it, so the critical path never queues behind short side
    branches) or ``fifo`` (the order steps became ready). The benchmarks compare the two."""

    exit_on_interrupt: bool = False
    """The CLI's choice: on Ctrl-C, mark running steps failed and release their leases at once,
    because the process exits right after (which ends their ``fn``). A library caller's process
    lives on, so by default a first Ctrl-C waits for the running steps and a second one abandons
    them: their leases stay held until their threads end, and they never commit."""

    def __init__(
        self,
        max_concurrent: int = 8,
        prefix: str | None = None,
        *,
        on_drift: str = "warn",
        cascade: bool = True,
        region: str | None = None,
        listener: RunListener | None = None,
        resources: Resources | Mapping[str, Any] | str | None = None,
    ) -> None:
        """``resources``: the machine's capacity for steps' declared resources (default: this
        machine's CPUs, memory and visible GPUs; see ``marin.execution.resources``). A step
        starts only when its resources are free, besides ``max_concurrent``."""
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise InvalidStepError(
                f"max_concurrent={max_concurrent!r}", "use a whole number >= 1 (default 8)"
            )
        self.max_concurrent = max_concurrent
        self.prefix = prefix
        Policy(on_drift, cascade=cascade)  # validates both now, not at run time
        self.on_drift = on_drift
        self.cascade = cascade
        self.region = region
        self.listener = listener
        self.capacity = capacity_from(resources)

    def plan(
        self, steps: StepSpec | Sequence[StepSpec], *, force: Iterable[str] = ()
    ) -> tuple[Plan, Location]:
        """What ``run`` with the same arguments would do (``marin plan`` is this)."""
        targets = [steps] if isinstance(steps, StepSpec) else list(steps)
        location = open_prefix(self.prefix)
        plan = plan_run(
            targets, location, on_drift=self.on_drift, force=force, cascade=self.cascade
        )
        return plan, location

    def run(
        self,
        steps: StepSpec | Sequence[StepSpec],
        *,
        dry_run: bool = False,
        keep_going: bool = False,
        force: Iterable[str] = (),
    ) -> RunReport:
        if self.ready_order not in READY_ORDERS:
            raise InvalidStepError(
                f"ready_order={self.ready_order!r}", f"use one of {', '.join(READY_ORDERS)}"
            )
        # Engine settings are read once, here: a fn that changes the environment can't make a
        # later step fail on a setting it never had.
        lease_ttl = ttl_from_env()
        plan, location = self.plan(steps, force=force)
        report = RunReport(location, plan)
        for decision in plan.decisions.values():
            if decision.action == SKIP:
                warn_if_served_stale(decision)
                log.info("skip %s: %s", decision.spec.step_id, decision.reason)
        if report.pruned:
            log.info("skip %d step(s): pruned (not built, and not needed)", len(report.pruned))
            for path in report.pruned:
                log.debug("skip %s: pruned", plan.decisions[path].spec.step_id)
        total = len(plan.decisions)
        if self.listener:
            self.listener.on_plan(total, total - len(report.to_build))
        if dry_run:
            for path in report.to_build:
                decision = plan.decisions[path]
                log.info("would build %s: %s", decision.spec.step_id, decision.reason)
            return report
        if report.to_build:
            pool = ResourcePool(self.capacity)
            check_fits(pool, [plan.decisions[p].spec for p in report.to_build])
            location.check_writable()
            self._execute(report, plan, keep_going, pool, lease_ttl)
        return report

    def _execute(
        self,
        report: RunReport,
        plan: Plan,
        keep_going: bool,
        resources: ResourcePool,
        lease_ttl: float,
    ) -> None:
        decisions = plan.decisions
        to_build = set(report.to_build)
        scheduler = Scheduler(
            {p: [d.output_path for d in decisions[p].spec.deps] for p in report.to_build},
            keep_going=keep_going,
            order=self.ready_order,
            label=lambda p: decisions[p].spec.step_id,
        )
        scheduler.prepare()
        done: queue.SimpleQueue[_Done] = queue.SimpleQueue()
        caller_context = contextvars.copy_context()
        started: dict[str, float] = {}
        abandon = threading.Event()
        interrupted = False

        built: dict[str, ArtifactRecord] = {}  # this run's new records, for lineage

        grants: dict[str, Grant] = {}

        def admit(path: str) -> bool:
            """Start a ready step only when its declared resources are free (the pool keeps
            the first step it refuses reserved, so a big step is not starved by small ones)."""
            grant = resources.try_acquire(
                decisions[path].spec.step_id, decisions[path].spec.resources
            )
            if grant is None:
                return False
            grants[path] = grant
            return True

        def build(spec: StepSpec, ups: list[Upstream], devices: tuple[int, ...]) -> BuildOutcome:
            with assigned_devices(devices):
                return build_step(
                    spec,
                    report.location,
                    policy=plan.policy,
                    region=self.region,
                    lease_ttl=lease_ttl,
                    decision=decisions[spec.output_path],
                    upstream=ups,
                    abandon=abandon,
                )

        pool = _StepPool(self.max_concurrent, "marin-step", done)

        def dispatch() -> None:
            free = self.max_concurrent - len(scheduler.running)
            for path in scheduler.get_ready(free, admit):
                spec = decisions[path].spec
                log.info("start %s", spec.step_id)
                if self.listener:
                    self.listener.on_start(spec)
                started[path] = time.perf_counter()
                devices = grants[path].devices
                ups = plan.upstream(spec, built)
                pool.submit(path, caller_context.copy().run, build, spec, ups, devices)

        def collect(path: str, outcome: BuildOutcome | None, error: BaseException | None) -> None:
            resources.release(grants.pop(path))
            duration = time.perf_counter() - started[path]
            report.durations[path] = duration
            spec = decisions[path].spec
            if error is None:
                assert outcome is not None
                report.outcomes[path] = outcome
                built[path] = outcome.record
                if outcome.action == "built":
                    log.info("finish %s in %.2fs", spec.step_id, duration)
                if self.listener:
                    self.listener.on_finish(outcome)
                scheduler.done(path)
                return
            report.failures[path] = error
            log.error(
                "fail %s after %.2fs: %s: %s (log: %s)",
                spec.step_id,
                duration,
                type(error).__name__,
                error,
                report.location.url_for(log_path(spec.output_path)),
            )
            if self.listener:
                self.listener.on_fail(spec, error)
            scheduler.failed(path)

        def on_interrupt() -> None:
            """A first Ctrl-C: start nothing new and let the running steps finish."""
            nonlocal interrupted
            if self.exit_on_interrupt or interrupted:
                raise KeyboardInterrupt
            interrupted = True
            scheduler.stop()
            if scheduler.running:
                log.warning(
                    "interrupted: starting no more steps; waiting for %d running step(s) "
                    "to finish (press Ctrl-C again to abandon them)",
                    len(scheduler.running),
                )

        sigint = None if self.exit_on_interrupt else _QueuedInterrupts.install(done)
        try:
            dispatch()
            while scheduler.is_active():
                try:
                    item = done.get()
                    if item is _INTERRUPT:
                        on_interrupt()
                        continue
                    collect(*item)
                    dispatch()
                except KeyboardInterrupt:
                    if sigint is not None:
                        raise  # from our handler: a second Ctrl-C
                    on_interrupt()  # Ctrl-C raised here: the SIGINT handler is not ours
            if sigint is not None and sigint.count:
                interrupted = True  # pressed as the last step finished: still an interrupt
        except BaseException:
            if scheduler.running and not self.exit_on_interrupt:
                # Leaving while fn still runs in this process (a second Ctrl-C, or any error
                # here): those builds keep their leases until fn returns, and never commit.
                abandon.set()
                log.warning(
                    "interrupted again: abandoning %d running step(s); they keep their leases "
                    "until their threads end, and never commit",
                    len(scheduler.running),
                )
            else:
                # The process exits now, ending every fn: leave nothing RUNNING, no lease held.
                mark_interrupted()
                release_all_held()
            pool.shutdown(wait=False)
            raise
        finally:
            if sigint is not None:
                sigint.restore()
        pool.shutdown(wait=True)
        outcome = scheduler.finish()
        names = {p: decisions[p].spec.step_id for p in to_build}
        for path, roots in outcome.blocked.items():
            failed = ", ".join(names[r] for r in roots)
            report.not_run[path] = f"not run: dependency {failed} failed"
        for path in outcome.not_started:
            if interrupted:
                report.not_run[path] = "not started: the run was interrupted"
            elif outcome.stopped_by is not None:
                report.not_run[path] = (
                    f"not started: the pipeline stopped after {names[outcome.stopped_by]} failed "
                    "(fail-fast; --keep-going builds independent steps)"
                )
        if report.failures:
            _raise_failures(report, keep_going)
        if interrupted:
            raise KeyboardInterrupt


_Done = tuple[str, Any, BaseException | None]
"""A finished call: its key, its result (None on error) and its error (None on success)."""


_INTERRUPT: _Done = ("", None, KeyboardInterrupt())
"""Put on the done queue by the first Ctrl-C, which the run loop then handles between steps."""


class _QueuedInterrupts:
    """The run loop's SIGINT handler while steps run: the first Ctrl-C is queued, a second raises.

    Raised where it lands, a first ``KeyboardInterrupt`` could cut the loop's bookkeeping in
    half (a step handed to a worker but not yet counted as running) and be taken for the second
    one, abandoning steps the user meant to let finish. Queued, it is handled between two steps.
    Installed only from the main thread and over Python's own handler: a caller's handler wins.
    """

    def __init__(self, done: queue.SimpleQueue[_Done]) -> None:
        self.count = 0
        self._done = done

    @classmethod
    def install(cls, done: queue.SimpleQueue[_Done]) -> _QueuedInterrupts | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return None
        handler = cls(done)
        signal.signal(signal.SIGINT, handler._on_sigint)
        return handler

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self._done.put(_INTERRUPT)  # SimpleQueue.put is safe to call from a signal handler

    def restore(self) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class _StepPool:
    """At most ``size`` daemon worker threads running submitted calls; each call's result or
    error is put on the ``done`` queue with the key it was submitted under.

    Unlike ``ThreadPoolExecutor``, whose worker threads the interpreter joins at exit, daemon
    threads never keep an interrupted run alive while a step's ``fn`` is still blocked; and a
    submit is only a queue put (the runner already caps how many steps run at once). There is
    no ``Future`` per call: the runner only needs the outcome, not a future's locks and callbacks.
    """

    def __init__(self, size: int, name: str, done: queue.SimpleQueue[_Done]) -> None:
        self._size = size
        self._name = name
        self._done = done
        self._calls: queue.SimpleQueue[tuple[str, Callable[..., Any], tuple[Any, ...]] | None]
        self._calls = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def submit(self, key: str, fn: Callable[..., Any], *args: Any) -> None:
        self._calls.put((key, fn, args))
        if len(self._threads) < self._size:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        calls, done = self._calls, self._done
        while True:
            call = calls.get()
            if call is None:
                return
            key, fn, args = call
            del call
            try:
                result = fn(*args)
            except BaseException as exc:
                done.put((key, None, exc))
            else:
                done.put((key, result, None))
                del result
            del fn, args

    def shutdown(self, *, wait: bool) -> None:
        for _ in self._threads:
            self._calls.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _raise_failures(report: RunReport, keep_going: bool) -> None:
    assert report.plan is not None
    decisions = report.plan.decisions
    first_path, first = next(iter(report.failures.items()))
    error: StepFailedError | PipelineFailedError
    if keep_going:
        failures = {decisions[p].spec.step_id: e for p, e in report.failures.items()}
        error = PipelineFailedError(failures, [decisions[p].spec.step_id for p in report.blocked])
    else:
        spec = decisions[first_path].spec
        error = step_failed(
            first, spec.step_id, report.location.url_for(log_path(spec.output_path))
        )
    error.report = report
    raise error from first
