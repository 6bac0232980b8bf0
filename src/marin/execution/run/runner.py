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

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from marin.execution.build.commit import warn_if_served_stale
from marin.execution.errors import InvalidStepError
from marin.execution.pipeline.resources import ResourcePool, Resources, capacity_from, check_fits
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.decide import Plan
from marin.execution.plan.options import (
    DEFAULT_FORCE_RUN_FAILED,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_REMOTE,
    DEFAULT_ON_CODE_DRIFT,
    DEFAULT_ON_DRIFT,
    RunOptions,
)
from marin.execution.plan.read import plan_run
from marin.execution.plan.scope import resolve_scopes
from marin.execution.run.executors import ThreadExecutor
from marin.execution.run.loop import (
    RETRY_FIRST_DELAY_S,
    RunListener,
    RunLoop,
    served_targets_gone,
)
from marin.execution.run.report import RUN_ACTIONS, RUN_REPORT_SCHEMA, RunReport, StepResult
from marin.execution.run.scheduler import READY_ORDERS
from marin.execution.run.stream import StreamHook, is_stream, run_stream
from marin.execution.store.location import Location, open_prefix
from marin.execution.vocabulary import Action

__all__ = [
    "READY_ORDERS",
    "RUN_ACTIONS",
    "RUN_REPORT_SCHEMA",
    "RunListener",
    "RunReport",
    "StepResult",
    "StepRunner",
]

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

    scope: str = "shared"
    """The run-wide output scope: ``user`` places every step under ``<prefix>/users/<user>/``
    (``plan/scope.py``); ``shared`` leaves it to each step's ``with_options(scope=...)``."""

    retry_delay_s: float = RETRY_FIRST_DELAY_S
    """The first backoff before retrying a failed step (``with_options(retries=N)``); doubled
    for each further attempt, at most ``marin.execution.run.loop.RETRY_MAX_DELAY_S``."""

    def __init__(
        self,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        prefix: str | None = None,
        *,
        on_drift: str = DEFAULT_ON_DRIFT,
        cascade: bool = True,
        region: str | None = None,
        on_code_drift: str = DEFAULT_ON_CODE_DRIFT,
        listener: RunListener | None = None,
        resources: Resources | Mapping[str, Any] | str | None = None,
        max_remote: int = DEFAULT_MAX_REMOTE,
    ) -> None:
        """``resources``: the machine's capacity for steps' declared resources (default: this
        machine's CPUs, memory and visible GPUs; see ``marin.execution.pipeline.resources``). A step
        starts only when its resources are free, besides ``max_concurrent``."""
        # Checked now, not at run time.
        RunOptions(
            on_drift=on_drift,
            cascade=cascade,
            max_concurrent=max_concurrent,
            on_code_drift=on_code_drift,
            max_remote=max_remote,
        )
        self.max_concurrent = max_concurrent
        self.max_remote = max_remote
        self.prefix = prefix
        self.on_drift = on_drift
        self.on_code_drift = on_code_drift
        self.cascade = cascade
        self.region = region
        self.listener = listener
        self.capacity = capacity_from(resources)

    def plan(
        self,
        steps: StepSpec | Sequence[StepSpec],
        *,
        force: Iterable[str] = (),
        force_run_failed: bool = DEFAULT_FORCE_RUN_FAILED,
    ) -> tuple[Plan, Location]:
        """What ``run`` with the same arguments would do (``marin plan`` is this)."""
        force = tuple(force.split(",")) if isinstance(force, str) else tuple(force)
        location = open_prefix(self.prefix)
        targets = resolve_scopes(
            [steps] if isinstance(steps, StepSpec) else list(steps), location, self.scope, force
        )
        plan = plan_run(
            targets,
            location,
            on_drift=self.on_drift,
            force=force,
            cascade=self.cascade,
            force_run_failed=force_run_failed,
            on_code_drift=self.on_code_drift,
        )
        return plan, location

    def run(
        self,
        steps: StepSpec | Iterable[StepSpec],
        *,
        dry_run: bool = False,
        force_run_failed: bool = DEFAULT_FORCE_RUN_FAILED,
        max_concurrent: int | None = None,
        keep_going: bool = False,
        force: Iterable[str] = (),
    ) -> RunReport:
        """Plan and build ``steps``. ``force_run_failed=False``: a needed step whose last
        attempt failed is not retried, and the run fails naming it (``decide`` says so).
        ``max_concurrent`` overrides the runner's limit for this run only. Any other iterable
        (a generator) is consumed lazily, ``max_concurrent`` steps ahead (``run/stream.py``)."""
        if self.ready_order not in READY_ORDERS:
            raise InvalidStepError(
                f"ready_order={self.ready_order!r}", f"use one of {', '.join(READY_ORDERS)}"
            )
        options = RunOptions(
            on_drift=self.on_drift,
            force=tuple(force.split(",")) if isinstance(force, str) else tuple(force),
            cascade=self.cascade,
            max_concurrent=self.max_concurrent if max_concurrent is None else max_concurrent,
            keep_going=keep_going,
            force_run_failed=force_run_failed,
            on_code_drift=self.on_code_drift,
            max_remote=self.max_remote,
        )
        if is_stream(steps):
            stream_options = {"force": options.force, "force_run_failed": force_run_failed}
            return run_stream(
                StreamHook(self.run, self.plan), steps, open_prefix(self.prefix),
                lookahead=options.max_concurrent,
                dry_run=dry_run, keep_going=keep_going, **stream_options,
            )  # fmt: skip
        targets = [steps] if isinstance(steps, StepSpec) else list(steps)
        targets = resolve_scopes(targets, open_prefix(self.prefix), self.scope, options.force)
        plan, location = self.plan(
            targets, force=options.force, force_run_failed=options.force_run_failed
        )
        report = RunReport(location, plan)
        for decision in plan.decisions.values():
            if decision.action == Action.SKIP:
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
        target_paths = [t.output_path for t in targets]
        # Nothing to build: the served targets are re-checked here, before success is reported
        # (one record read each); one deleted since the plan is rebuilt by the loop.
        if report.to_build or served_targets_gone(plan, location, target_paths):
            pool = ResourcePool(self.capacity)
            check_fits(pool, [plan.decisions[p].spec for p in report.to_build])
            location.check_writable()
            loop = RunLoop(
                plan,
                report,
                # A waiting remote step parks its thread (no slot): room for both bounds.
                ThreadExecutor(options.max_concurrent + options.max_remote),
                max_concurrent=options.max_concurrent,
                max_remote=options.max_remote,
                keep_going=keep_going,
                resources=pool,
                order=self.ready_order,
                region=self.region,
                listener=self.listener,
                exit_on_interrupt=self.exit_on_interrupt,
                retry_delay_s=self.retry_delay_s,
                targets=target_paths,
                share_work=True,
            )
            loop.run()
            loop.raise_if_failed()
        return report
