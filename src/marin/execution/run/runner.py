"""``StepRunner``: plan, then the one run loop on threads of this process.

A run has two phases. First the plan: every step's record is read (in parallel when storage is
slow) and ``marin.execution.plan.decide`` decides each step, exactly as ``marin plan`` does. Then
the
steps to build go through the one run loop (``marin.execution.run.loop``) on a
``ThreadExecutor``: each is dispatched the moment its last dependency finishes, at most
``max_concurrent`` at once, critical path first, retried ``retries`` times if it fails. Every
build goes through ``build_step``.

Runners share the work: several ``StepRunner``s (or ``marin run`` processes, on one machine or
many) on one prefix finish one graph together. A step another runner's live lease holds does not
wait in a slot: it is deferred, this runner goes on with other ready steps, and comes back to it
when that lease is released (it then serves the other runner's record: ``built-by-other``) or
expires (it takes over and builds it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from marin.execution.builder.commit import warn_if_served_stale
from marin.execution.errors import InvalidStepError
from marin.execution.pipeline.graph import Graph, as_graph
from marin.execution.pipeline.resources import ResourcePool, Resources, capacity_from, check_fits
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.decide import Plan
from marin.execution.plan.options import RunOptions
from marin.execution.plan.read import plan_run
from marin.execution.plan.scope import resolve_scopes
from marin.execution.plan.sweep_counts import sweep_counts
from marin.execution.run.executors import ThreadExecutor
from marin.execution.run.loop import (
    RETRY_FIRST_DELAY_S,
    RunListener,
    RunLoop,
    served_targets_gone,
)
from marin.execution.run.remote_slots import executor_threads
from marin.execution.run.report import RunInterrupted, RunReport
from marin.execution.run.scheduler import READY_ORDERS
from marin.execution.run.stream import StreamHook, is_stream, run_stream
from marin.execution.store.location import Location, open_prefix
from marin.execution.vocabulary import Action

log = logging.getLogger("marin")


class StepRunner:
    """Runs a pipeline here: plans it, then builds what the plan says on threads of this process.

    Options are checked when the runner is made (``RunOptions``), not when it runs. One runner
    may run many pipelines, one after another.
    """

    ready_order: str = "longest-path"
    """Which ready step starts first when a slot frees: ``longest-path`` (the step with the
    longest chain of dependents after it, so the critical path never queues behind short side
    branches) or ``fifo`` (the order steps became ready). The benchmarks compare the two."""

    exit_on_interrupt: bool = False
    """The CLI's choice: on Ctrl-C, mark running steps failed and release their leases at once,
    because the process exits right after (which ends their ``fn``). A library caller's process
    lives on, so by default a first Ctrl-C waits for the running steps and a second one abandons
    them: their leases stay held until their threads end, and they never commit."""

    retry_delay_s: float = RETRY_FIRST_DELAY_S
    """The first backoff before retrying a failed step (``with_options(retries=N)``); doubled
    for each further attempt, at most ``marin.execution.run.loop.RETRY_MAX_DELAY_S``."""

    def __init__(
        self,
        options: RunOptions | None = None,
        *,
        prefix: str | None = None,
        region: str | None = None,
        listener: RunListener | None = None,
        resources: Resources | Mapping[str, Any] | str | None = None,
    ) -> None:
        """``options``: the run's options, whole and checked (``RunOptions``; default: the
        defaults). ``resources``: the machine's capacity for steps' declared resources
        (default: this machine's CPUs, memory and visible GPUs; see
        ``marin.execution.pipeline.resources``). A step starts only when its resources are free,
        besides ``max_concurrent``.

        Raises:
            InvalidStepError: ``options`` is not a ``RunOptions`` (the options a runner once
                took as keywords go in it: ``StepRunner(RunOptions(max_concurrent=2))``), or a
                ``resources`` capacity does not parse.
        """
        if options is not None and not isinstance(options, RunOptions):
            raise InvalidStepError(
                f"StepRunner({options!r}) takes the run's options as a RunOptions",
                "pass StepRunner(RunOptions(max_concurrent=..., on_drift=...), prefix=...)",
            )
        self.options = options if options is not None else RunOptions()
        self.prefix = prefix
        self.region = region
        self.listener = listener
        self.capacity = capacity_from(resources)

    @property
    def max_concurrent(self) -> int:
        """The runner's limit on steps building at once (``options.max_concurrent``)."""
        return self.options.max_concurrent

    def _options_for(self, **overrides: Any) -> RunOptions:
        """The runner's options with this call's own choices (None: the runner's); checked
        again only when a call changes one."""
        changed = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self.options, **changed) if changed else self.options

    def plan(
        self, steps: Graph | StepSpec | Sequence[StepSpec], *, location: Location | None = None
    ) -> tuple[Plan, Location]:
        """What ``run`` with the same steps would do (``marin plan`` is this).

        ``location``: the prefix, opened and checked by the caller (else ``prefix`` is opened
        here).

        Raises:
            StorageError: the prefix cannot be opened or read.
            CycleError: ``steps`` (a list) hold a dependency cycle.
            DuplicateStepError: ``steps`` (a list) hold two definitions of one step.
            MarinError: what ``plan_run`` raises (``InvalidStepError`` for an unknown
                ``force`` name, ``DriftError``, ``FailedBeforeError``, ...), and
                ``InvalidStepError`` for a user-scope step without a valid user name.
        """
        return self._plan(as_graph(steps), self.options, location)

    def _plan(
        self, graph: Graph, options: RunOptions, location: Location | None
    ) -> tuple[Plan, Location]:
        graph, location = self._placed(graph, options, location)
        return plan_run(graph, location, options), location

    def _placed(
        self, graph: Graph, options: RunOptions, location: Location | None
    ) -> tuple[Graph, Location]:
        """``graph`` with each step where it reads and writes for this user (plan/scope.py;
        placed specs stay), and the prefix opened."""
        location = open_prefix(self.prefix) if location is None else location
        targets = resolve_scopes(
            list(graph.targets), location, options.scope, options.force,
            policy=options.policy(list(graph.steps)),
        )  # fmt: skip
        return (graph if targets == list(graph.targets) else Graph.of(targets)), location

    def run(
        self,
        steps: Graph | StepSpec | Iterable[StepSpec],
        *,
        dry_run: bool = False,
        force_run_failed: bool | None = None,
        max_concurrent: int | None = None,
        location: Location | None = None,
    ) -> RunReport:
        """Plan and build ``steps`` (a ``Graph``, or one spec or a list, collected once here).

        Marin's signature: ``force_run_failed=False``: a needed step whose last attempt failed
        is not retried, and the run fails naming it (``decide`` says so); it and
        ``max_concurrent`` override the runner's options for this run only (None: the
        runner's). ``location``: the prefix, opened and checked by the caller. Any other
        iterable (a generator) is consumed lazily, ``max_concurrent`` steps ahead.

        Raises:
            MarinError: what ``plan`` raises, before anything is built.
            InvalidStepError: an unknown ``ready_order``, or resources that can never fit.
            StorageError: the prefix cannot be written.
            StepFailedError: the first step that failed (its error is the ``__cause__``).
            PipelineFailedError: under ``keep_going``, every step that failed, at once.
            KeyboardInterrupt: a Ctrl-C stopped the run (and no step failed).
        """
        if self.ready_order not in READY_ORDERS:
            raise InvalidStepError(
                f"ready_order={self.ready_order!r}", f"use one of {', '.join(READY_ORDERS)}"
            )
        options = self._options_for(
            force_run_failed=force_run_failed, max_concurrent=max_concurrent
        )
        location = open_prefix(self.prefix) if location is None else location
        if not is_stream(steps):
            return self._run(as_graph(steps), options, location, dry_run)
        hook = StreamHook(
            lambda specs: self._run(as_graph(specs), options, location, dry_run),
            lambda specs: self._plan(as_graph(specs), options, location),
        )
        return run_stream(hook, steps, location, lookahead=options.max_concurrent,
                          keep_going=options.keep_going)  # fmt: skip

    def _run(
        self, graph: Graph, options: RunOptions, location: Location, dry_run: bool
    ) -> RunReport:
        graph, location = self._placed(graph, options, location)  # its paths: placed
        plan = plan_run(graph, location, options)
        report = RunReport(location, plan, targets=list(graph.targets))
        self._log_plan(plan, report)
        if dry_run:
            for path in report.to_build:
                decision = plan.decisions[path]
                log.info("would build %s: %s", decision.spec.step_id, decision.reason)
            return report
        # Nothing to build: the served targets are re-checked here, before success is reported
        # (one record read each); one deleted since the plan is rebuilt by the loop.
        if report.to_build or served_targets_gone(plan, location, graph.target_paths):
            try:
                self._build(plan, report, options, graph.target_paths)
            except RunInterrupted:
                raise
            except KeyboardInterrupt as exc:  # what ran so far, for the caller's summary
                report.interrupted = True
                raise RunInterrupted(report) from exc
        return report

    def _log_plan(self, plan: Plan, report: RunReport) -> None:
        for decision in plan.decisions.values():
            if decision.action == Action.SKIP:
                warn_if_served_stale(decision)
                log.info("skip %s: %s", decision.spec.step_id, decision.reason)
        if report.pruned:
            log.info("skip %d step(s): pruned (not built, and not needed)", len(report.pruned))
            for path in report.pruned:
                log.debug("skip %s: pruned", plan.decisions[path].spec.step_id)
        counts = sweep_counts(plan)
        if counts is not None:
            log.info("%s", counts.line())
        total = len(plan.decisions)
        if self.listener:
            self.listener.on_plan(total, total - len(report.to_build))

    def _build(
        self, plan: Plan, report: RunReport, options: RunOptions, targets: list[str]
    ) -> None:
        pool = ResourcePool(self.capacity)
        check_fits(pool, [plan.decisions[p].spec for p in report.to_build])
        report.location.check_writable()
        loop = RunLoop(
            plan,
            report,
            # A waiting remote step holds no thread (its build is parked on the poller).
            ThreadExecutor(executor_threads(options.max_concurrent, options.max_remote)),
            max_concurrent=options.max_concurrent,
            max_remote=options.max_remote,
            keep_going=options.keep_going,
            resources=pool,
            order=self.ready_order,
            region=self.region,
            listener=self.listener,
            exit_on_interrupt=self.exit_on_interrupt,
            retry_delay_s=self.retry_delay_s,
            targets=targets,
        )
        loop.run()
        loop.raise_if_failed()
