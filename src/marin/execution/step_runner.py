"""``StepRunner``: the embedded, threaded executor.

Two phases. First a check, top-down from the targets: a built step is served from its record and
its whole sub-tree is pruned without being read. Then the steps that need building run in Kahn
order: each is dispatched the moment its last dependency finishes (a completion queue wakes the
scheduler; nothing polls or sleeps), at most ``max_concurrent`` at once, longest remaining path
first so the critical path never waits behind short side branches.
"""

from __future__ import annotations

import contextvars
import graphlib
import heapq
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

from marin.execution.artifact import Artifact
from marin.execution.build import BuildOutcome, build_step, check_drift_policy, usable_record
from marin.execution.errors import (
    CycleError,
    InvalidStepError,
    PipelineFailedError,
    StepFailedError,
)
from marin.execution.graph import canonical_deps, collect_steps
from marin.execution.inspect import BUILT, DRIFT, StepState, inspect_steps
from marin.execution.lease import release_all_held
from marin.execution.records import FAILED, log_path, write_status
from marin.execution.step_spec import StepSpec
from marin.execution.storage import Location, open_prefix

log = logging.getLogger("marin")
T = TypeVar("T")


class RunListener(Protocol):
    """Hooks for progress displays; called on the scheduler thread."""

    def on_plan(self, total: int, skipped: int) -> None: ...
    def on_start(self, spec: StepSpec) -> None: ...
    def on_finish(self, outcome: BuildOutcome) -> None: ...
    def on_fail(self, spec: StepSpec, error: BaseException) -> None: ...


@dataclass
class RunReport:
    location: Location
    states: dict[str, StepState] = field(default_factory=dict)
    """The checked steps, by output path (pruned steps are not here)."""
    outcomes: dict[str, BuildOutcome] = field(default_factory=dict)
    failures: dict[str, BaseException] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    to_build: list[str] = field(default_factory=list)

    def artifact(self, spec: StepSpec) -> Artifact:
        url = self.location.url_for(spec.output_path)
        outcome = self.outcomes.get(spec.output_path)
        if outcome is not None:
            return Artifact(spec, url, outcome.record)
        state = self.states.get(spec.output_path)
        return Artifact(spec, url, state.record if state else None)


READY_ORDERS = ("longest-path", "fifo")


class StepRunner:
    ready_order: str = "longest-path"
    """Which ready step starts first when a slot frees: ``longest-path`` (the step with the
    longest chain of dependents after it, so the critical path never queues behind short side
    branches) or ``fifo`` (the order steps became ready). The benchmarks compare the two."""

    def __init__(
        self,
        max_concurrent: int = 8,
        prefix: str | None = None,
        *,
        on_drift: str = "warn",
        region: str | None = None,
        listener: RunListener | None = None,
    ) -> None:
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise InvalidStepError(
                f"max_concurrent={max_concurrent!r}", "use a whole number >= 1 (default 8)"
            )
        self.max_concurrent = max_concurrent
        self.prefix = prefix
        self.on_drift = check_drift_policy(on_drift)
        self.region = region
        self.listener = listener

    # -- phase 1: what needs building -----------------------------------------------------------

    def _forced_ids(self, force: Iterable[str], steps: list[StepSpec]) -> frozenset[str]:
        wanted = set(force)
        ids = {s.step_id for s in steps if s.step_id in wanted or s.name in wanted}
        matched = {s.step_id for s in steps} | {s.name for s in steps}
        unknown = sorted(wanted - matched)
        if unknown:
            raise InvalidStepError(
                f"--force names no step in this pipeline: {', '.join(unknown)}",
                "pass a step name or name@version from `marin plan`",
            )
        return frozenset(ids)

    def _check(
        self,
        targets: Sequence[StepSpec],
        by_path: dict[str, StepSpec],
        deps: dict[str, list[StepSpec]],
        forced: frozenset[str],
        location: Location,
        report: RunReport,
    ) -> None:
        roots = [by_path[t.output_path] for t in targets]
        roots += [s for s in by_path.values() if s.step_id in forced]
        frontier = list({s.output_path: s for s in roots}.values())
        seen = {s.output_path for s in frontier}
        while frontier:
            following: list[StepSpec] = []
            for state in inspect_steps(frontier, location, forced=forced):
                path = state.spec.output_path
                report.states[path] = state
                if state.action == BUILT:
                    continue
                if state.action == DRIFT:
                    # The one drift policy: warn serves the record, error raises, rebuild builds.
                    served, _ = usable_record(state.spec, state.record, self.on_drift)
                    if served is not None:
                        continue
                report.to_build.append(path)
                for dep in deps[path]:
                    if dep.output_path not in seen:
                        seen.add(dep.output_path)
                        following.append(dep)
            frontier = following
        report.pruned = [p for p in by_path if p not in report.states]

    # -- phase 2: build ---------------------------------------------------------------------------

    def run(
        self,
        steps: StepSpec | Sequence[StepSpec],
        *,
        dry_run: bool = False,
        keep_going: bool = False,
        force: Iterable[str] = (),
    ) -> RunReport:
        targets = [steps] if isinstance(steps, StepSpec) else list(steps)
        all_steps = collect_steps(targets)
        by_path = {s.output_path: s for s in all_steps}
        deps = canonical_deps(all_steps)
        forced = self._forced_ids(force, all_steps)
        location = open_prefix(self.prefix)
        report = RunReport(location)
        self._check(targets, by_path, deps, forced, location, report)
        building = set(report.to_build)
        for path, state in report.states.items():
            if path not in building:
                why = "built" if state.action == BUILT else "drifted, served from cache"
                log.info("skip %s: %s", state.spec.step_id, why)
        if report.pruned:
            log.info("skip %d step(s): pruned under built steps", len(report.pruned))
            for path in report.pruned:
                log.debug("skip %s: pruned", by_path[path].step_id)
        if self.listener:
            self.listener.on_plan(len(all_steps), len(all_steps) - len(report.to_build))
        if dry_run:
            for path in report.to_build:
                state = report.states[path]
                log.info("would build %s: %s", state.spec.step_id, state.reason)
            return report
        if report.to_build:
            location.check_writable()
            self._execute(report, by_path, deps, forced, keep_going)
        return report

    def _execute(
        self,
        report: RunReport,
        by_path: dict[str, StepSpec],
        deps: dict[str, list[StepSpec]],
        forced: frozenset[str],
        keep_going: bool,
    ) -> None:
        if self.ready_order not in READY_ORDERS:
            raise InvalidStepError(
                f"ready_order={self.ready_order!r}", f"use one of {', '.join(READY_ORDERS)}"
            )
        # Kahn's algorithm by hand (a counter of unfinished dependencies per step, and each
        # step's dependents), which is also what ranks the steps: at 50,000 steps graphlib's
        # bookkeeping, built twice, cost more than the rest of the scheduler.
        todo = set(report.to_build)
        dependents: dict[str, list[str]] = {p: [] for p in report.to_build}
        waiting: dict[str, int] = {}
        for path in report.to_build:
            unique = {d.output_path for d in deps[path]}
            unique &= todo
            waiting[path] = len(unique)
            for dep in unique:
                dependents[dep].append(path)
        order = _topological_order(report.to_build, dependents, waiting)
        if len(order) < len(todo):
            _raise_cycle(todo, deps, by_path)
        fifo = self.ready_order == "fifo"
        priority = {} if fifo else _remaining_path_lengths(order, dependents)
        ready: list[tuple[int, int, str]] = []
        sequence = 0
        done: queue.SimpleQueue[tuple[str, Future[BuildOutcome]]] = queue.SimpleQueue()
        caller_context = contextvars.copy_context()
        running: dict[str, float] = {}
        stopping = False

        def make_ready(paths: Iterable[str]) -> None:
            nonlocal sequence
            for path in paths:
                heapq.heappush(ready, (0 if fifo else -priority[path], sequence, path))
                sequence += 1

        def finished(path: str) -> None:
            for child in dependents[path]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    make_ready((child,))

        def build(spec: StepSpec) -> BuildOutcome:
            return build_step(
                spec,
                report.location,
                on_drift=self.on_drift,
                force=spec.step_id in forced,
                region=self.region,
                precheck=False,
            )

        pool = _StepPool(self.max_concurrent, "marin-step")

        def dispatch() -> None:
            while ready and len(running) < self.max_concurrent and not stopping:
                _, _, path = heapq.heappop(ready)
                spec = by_path[path]
                log.info("start %s", spec.step_id)
                if self.listener:
                    self.listener.on_start(spec)
                running[path] = time.perf_counter()
                future = pool.submit(caller_context.copy().run, build, spec)
                future.add_done_callback(partial(_report_done, done, path))

        try:
            make_ready([p for p in report.to_build if waiting[p] == 0])
            dispatch()
            while running:
                path, future = done.get()
                started = running.pop(path)
                spec = by_path[path]
                error = future.exception()
                if error is None:
                    outcome = future.result()
                    report.outcomes[path] = outcome
                    if outcome.action == "built":
                        log.info("finish %s in %.2fs", spec.step_id, time.perf_counter() - started)
                    if self.listener:
                        self.listener.on_finish(outcome)
                    finished(path)
                else:
                    report.failures[path] = error
                    log.error(
                        "fail %s after %.2fs: %s: %s (log: %s)",
                        spec.step_id,
                        time.perf_counter() - started,
                        type(error).__name__,
                        error,
                        report.location.url_for(log_path(spec.output_path)),
                    )
                    if self.listener:
                        self.listener.on_fail(spec, error)
                    if not keep_going:
                        stopping = True
                dispatch()
        except BaseException:
            # Ctrl-C or SIGTERM: leave nothing RUNNING forever and no lease held.
            for path in running:
                write_status(report.location, path, FAILED, error="interrupted")
            release_all_held()
            # Do not wait for steps still running: their threads are daemons, so a Ctrl-C'd
            # `marin run` exits now; a step that finishes later cannot commit (its lease is gone).
            pool.shutdown(wait=False)
            raise
        pool.shutdown(wait=True)
        report.blocked = sorted(todo - set(report.outcomes) - set(report.failures))
        if report.failures:
            _raise_failures(report, by_path, keep_going)


_Call = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class _StepPool:
    """At most ``size`` daemon worker threads running submitted calls, one future per call.

    Unlike ``ThreadPoolExecutor``, whose worker threads the interpreter joins at exit, daemon
    threads never keep an interrupted run alive while a step's ``fn`` is still blocked; and a
    submit is only a queue put (the runner already caps how many steps run at once).
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._calls: queue.SimpleQueue[
            tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None
        ]
        self._calls = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        self._calls.put((future, fn, args))
        if len(self._threads) < self._size:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return future

    def _work(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            del call, future, fn, args

    def shutdown(self, *, wait: bool) -> None:
        for _ in self._threads:
            self._calls.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _raise_failures(report: RunReport, by_path: dict[str, StepSpec], keep_going: bool) -> None:
    first_path, first = next(iter(report.failures.items()))
    error: StepFailedError | PipelineFailedError
    if keep_going:
        failures = {by_path[p].step_id: e for p, e in report.failures.items()}
        error = PipelineFailedError(failures, [by_path[p].step_id for p in report.blocked])
    else:
        spec = by_path[first_path]
        error = StepFailedError(
            f"{type(first).__name__}: {first}",
            "see the step's log at "
            + report.location.url_for(log_path(spec.output_path))
            + "; fix it and run again (built steps are kept)",
            spec.step_id,
        )
    error.report = report
    raise error from first


def _report_done(
    done: queue.SimpleQueue[tuple[str, Future[BuildOutcome]]],
    path: str,
    future: Future[BuildOutcome],
) -> None:
    done.put((path, future))


def _topological_order(
    paths: list[str], dependents: dict[str, list[str]], waiting: dict[str, int]
) -> list[str]:
    """Dependencies before dependents; shorter than ``paths`` if the graph has a cycle."""
    remaining = dict(waiting)
    order = [p for p in paths if remaining[p] == 0]
    for path in order:  # grows while it is walked
        for child in dependents[path]:
            remaining[child] -= 1
            if remaining[child] == 0:
                order.append(child)
    return order


def _raise_cycle(
    todo: set[str], deps: dict[str, list[StepSpec]], by_path: dict[str, StepSpec]
) -> None:
    graph = {p: [d.output_path for d in deps[p] if d.output_path in todo] for p in todo}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise CycleError([by_path[p].step_id for p in exc.args[1]]) from None
    raise AssertionError("unreachable: the step graph has no cycle")


def _remaining_path_lengths(order: list[str], dependents: dict[str, list[str]]) -> dict[str, int]:
    """Length of the longest chain of dependents after each step (the critical-path rank)."""
    rank: dict[str, int] = {}
    for path in reversed(order):
        rank[path] = 1 + max((rank[d] for d in dependents[path]), default=0)
    return rank
