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
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from marin.execution.artifact import Artifact
from marin.execution.build import BuildOutcome, build_step, check_drift_policy
from marin.execution.errors import (
    CycleError,
    DriftError,
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


class StepRunner:
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
                if state.action == DRIFT:
                    if self.on_drift == "error":
                        raise DriftError(
                            "config changed without a version bump: " + "; ".join(state.drift),
                            "bump the step's version, or run with --on-drift rebuild or warn",
                            state.spec.step_id,
                        )
                    if self.on_drift == "warn":
                        log.warning(
                            "drift %s: config changed without a version bump; serving the "
                            "cached artifact (bump the version or use --on-drift rebuild):\n  %s",
                            state.spec.step_id,
                            "\n  ".join(state.drift),
                        )
                        continue
                elif state.action == BUILT:
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
        todo = set(report.to_build)
        graph = {p: [d.output_path for d in deps[p] if d.output_path in todo] for p in todo}
        sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter(graph)
        try:
            sorter.prepare()
        except graphlib.CycleError as exc:
            raise CycleError([by_path[p].step_id for p in exc.args[1]]) from None
        priority = _remaining_path_lengths(graph)
        ready: list[tuple[int, int, str]] = []
        sequence = 0
        done: queue.SimpleQueue[tuple[str, Future[BuildOutcome]]] = queue.SimpleQueue()
        caller_context = contextvars.copy_context()
        running: dict[str, float] = {}
        stopping = False

        def enqueue_ready() -> None:
            nonlocal sequence
            for path in sorter.get_ready():
                heapq.heappush(ready, (-priority[path], sequence, path))
                sequence += 1

        def build(spec: StepSpec) -> BuildOutcome:
            return build_step(
                spec,
                report.location,
                on_drift=self.on_drift,
                force=spec.step_id in forced,
                region=self.region,
                precheck=False,
            )

        with ThreadPoolExecutor(self.max_concurrent, "marin-step") as pool:

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
                enqueue_ready()
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
                            log.info(
                                "finish %s in %.2fs", spec.step_id, time.perf_counter() - started
                            )
                        if self.listener:
                            self.listener.on_finish(outcome)
                        sorter.done(path)
                        enqueue_ready()
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
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        report.blocked = sorted(todo - set(report.outcomes) - set(report.failures))
        if report.failures:
            _raise_failures(report, by_path, keep_going)


def _raise_failures(report: RunReport, by_path: dict[str, StepSpec], keep_going: bool) -> None:
    first_path, first = next(iter(report.failures.items()))
    if not keep_going:
        spec = by_path[first_path]
        raise StepFailedError(
            f"{type(first).__name__}: {first}",
            "see the step's log at "
            + report.location.url_for(log_path(spec.output_path))
            + "; fix it and run again (built steps are kept)",
            spec.step_id,
        ) from first
    failures = {by_path[p].step_id: e for p, e in report.failures.items()}
    blocked = [by_path[p].step_id for p in report.blocked]
    raise PipelineFailedError(failures, blocked) from first


def _report_done(
    done: queue.SimpleQueue[tuple[str, Future[BuildOutcome]]],
    path: str,
    future: Future[BuildOutcome],
) -> None:
    done.put((path, future))


def _remaining_path_lengths(graph: dict[str, list[str]]) -> dict[str, int]:
    """Length of the longest chain of dependents after each step (the critical-path rank)."""
    dependents: dict[str, list[str]] = {p: [] for p in graph}
    for path, path_deps in graph.items():
        for dep in path_deps:
            dependents[dep].append(path)
    order = list(graphlib.TopologicalSorter(graph).static_order())
    rank: dict[str, int] = {}
    for path in reversed(order):
        rank[path] = 1 + max((rank[d] for d in dependents[path]), default=0)
    return rank
