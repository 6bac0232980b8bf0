"""Compile a lowered Marin graph into a Prefect 3 flow.

One Marin step becomes one Prefect task run named ``name@version``. Every task calls the core's
``build_step``, the one build/commit path, so a local run, a Prefect run and an Airflow run of one
pipeline on one prefix share one lease, one record and one status file.

The flow body does what the local ``StepRunner`` does, with the same core parts: it plans every
step with ``marin.execution.decide`` (so ``marin plan`` with the same options predicts the flow),
then drives the core ``Scheduler``: a step's task is submitted the moment its last dependency
finishes, with the dependency futures as ``wait_for`` (so Prefect records the edges), at most
``max_concurrent`` at once. A task therefore never occupies a worker thread, nor a global
concurrency slot, while it only waits on its dependencies.

Prefect has no skipped state, so propagation is ours:

- a step served from its record ends ``Completed(name="Cached")`` with its artifact path as
  result; a pruned one (not built, and needed by nothing that runs) ends
  ``Completed(name="Pruned")``;
- a step whose dependency failed is not run: it ends ``Pending(name="NotReady")`` (the state Prefect
  itself gives a task whose upstream did not complete), with a message naming the failed step;
- after a failure, with ``keep_going=False`` (the default, as in ``marin run``), steps not yet
  started are not started either; the flow run fails with the core's ``StepFailedError`` (or
  ``PipelineFailedError`` with ``keep_going=True``) chained to the step's own exception.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from prefect import Flow, Task, allow_failure, get_run_logger
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, Pending, State
from prefect.task_runners import ThreadPoolTaskRunner

from marin.execution.decide import Policy, Upstream
from marin_prefect.names import safe_prefect_name

if TYPE_CHECKING:
    from marin.execution.build import BuildOutcome
    from marin.execution.decide import Decision
    from marin.execution.step_spec import StepSpec
    from marin.execution.storage import Location

CACHED_STATE_NAME = "Cached"
NOT_RUN_STATE_NAME = "NotReady"
PRUNED_STATE_NAME = "Pruned"


def lower_flow_target(target_or_handles: Any) -> list[StepSpec]:
    """A target string, a handle, a ``StepSpec`` or a list of them -> the lowered target specs."""
    from marin.execution.lazy import ArtifactStep, lower
    from marin.execution.step_spec import StepSpec

    if isinstance(target_or_handles, str):
        from marin.execution.targets import load_target

        items: list[Any] = list(load_target(target_or_handles))
    elif isinstance(target_or_handles, ArtifactStep | StepSpec):
        items = [target_or_handles]
    elif isinstance(target_or_handles, list | tuple):
        items = list(target_or_handles)
    else:
        raise TypeError(
            "error: to_prefect_flow() takes a target string ('file.py:attr' or 'pkg.mod:attr'), "
            f"a step handle or a list of handles, not {type(target_or_handles).__name__}"
        )
    if not items:
        raise ValueError("error: the pipeline has no steps: pass at least one step handle")
    for i, item in enumerate(items):
        if not isinstance(item, ArtifactStep | StepSpec):
            raise TypeError(
                f"error: item {i} is a {type(item).__name__}, not a step handle: pass the "
                "ArtifactStep returned by apply()"
            )
    return list(lower(items))


def default_flow_name(target_or_handles: Any, specs: Sequence[StepSpec]) -> str:
    if isinstance(target_or_handles, str):
        module, _, attr = target_or_handles.rpartition(":")
        stem = re.sub(r"\.py$", "", module.replace("\\", "/").rsplit("/", 1)[-1])
        stem = stem.rsplit(".", 1)[-1]
        return safe_prefect_name(f"marin-{stem}-{attr}" if stem else f"marin-{attr}")
    return safe_prefect_name("marin-" + specs[-1].name)


def to_prefect_flow(
    target_or_handles: Any,
    *,
    name: str | None = None,
    max_concurrent: int = 8,
    prefix: str | None = None,
    on_drift: str = "warn",
    concurrency_limit: str | None = None,
    keep_going: bool = False,
    force: Sequence[str] = (),
    cascade: bool = True,
    resource_limits: bool = False,
) -> Flow[[], dict[str, str]]:
    """Compile a pipeline into a Prefect flow; calling the flow runs the pipeline.

    ``target_or_handles`` is a target string (``"examples/ngram.py:pipeline"`` or
    ``"pkg.mod:attr"``), a handle, or a list of handles. The graph is lowered here, once; the
    prefix is resolved when the flow runs (argument, else ``$MARIN_PREFIX``, else the default), so
    a worker's environment decides where a deployment's artifacts go.

    ``concurrency_limit`` names a Prefect global concurrency limit (create it first, e.g. with
    ``prefect gcl create NAME --limit N``); a step holds one slot only while it builds. The flow
    returns ``{name@version: artifact path}`` for every step.

    ``resource_limits=True``: each building step also holds as many slots of the Prefect global
    concurrency limits ``marin-<kind>`` (``marin-gpu``, ``marin-memory-gib``, ...) as its
    ``resources`` ask for (docs/resources.md; ``marin export prefect --create-limits`` makes
    them). Off by default, so a flow runs where no limits were created.

    ``on_drift``, ``force`` (step names or ``name@version`` ids) and ``cascade`` mean what they
    mean for ``marin run``: the flow plans with the same decision function, so ``marin plan``
    with the same options predicts it exactly.
    """
    from marin.execution.decide import Policy, check_drift_policy, resolve_force
    from marin.execution.graph import collect_steps

    if (
        isinstance(max_concurrent, bool)
        or not isinstance(max_concurrent, int)
        or max_concurrent < 1
    ):
        raise ValueError(f"error: max_concurrent={max_concurrent!r}: use a whole number >= 1")
    check_drift_policy(on_drift)
    if concurrency_limit is not None and not concurrency_limit.strip():
        raise ValueError("error: concurrency_limit is empty: pass a global concurrency limit name")
    if isinstance(force, str):
        force = [force]
    targets = lower_flow_target(target_or_handles)
    steps = collect_steps(targets)
    flow_name = name or default_flow_name(target_or_handles, targets)
    options = RunOptions(
        prefix=prefix,
        policy=Policy(on_drift, resolve_force(force, steps), cascade),
        concurrency_limit=concurrency_limit,
        keep_going=keep_going,
        max_concurrent=max_concurrent,
        resource_limits=resource_limits,
    )

    def marin_flow() -> dict[str, str]:
        return run_steps(steps, targets, options)

    marin_flow.__doc__ = f"Marin pipeline {flow_name}: {len(steps)} step(s)."
    return Flow(
        marin_flow,
        name=flow_name,
        description=f"Marin pipeline: {len(steps)} step(s), targets "
        + ", ".join(t.step_id for t in targets),
        task_runner=cast(Any, ThreadPoolTaskRunner(max_workers=max_concurrent)),
        validate_parameters=False,
    )


@dataclass(frozen=True)
class RunOptions:
    prefix: str | None = None
    policy: Policy = field(default_factory=lambda: _default_policy())
    concurrency_limit: str | None = None
    keep_going: bool = False
    max_concurrent: int = 8
    resource_limits: bool = False


def _default_policy() -> Policy:
    from marin.execution.decide import Policy

    return Policy()


@dataclass
class _RunState:
    """What the flow body knows about each step, by output path."""

    errors: dict[str, BaseException] = field(default_factory=dict)
    """The exception of each step's last attempt (written by the task, read after it ends)."""
    outcomes: dict[str, BuildOutcome] = field(default_factory=dict)
    """Written by each build task: the record its dependents' lineage names."""
    failed: dict[str, BaseException] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    upstream: dict[str, list[Upstream]] = field(default_factory=dict)
    """Each dependency's record as the step is submitted (its new record's lineage)."""
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_steps(
    steps: Sequence[StepSpec], targets: Sequence[StepSpec], options: RunOptions
) -> dict[str, str]:
    """Run ``steps`` (all transitive, deps first) as task runs of the current flow run.

    The plan (``marin.execution.decide``) says which steps build; the one ``Scheduler`` says
    when. Steps that are served or pruned end at once with their own states.
    """
    from marin.execution.build import warn_if_served_stale
    from marin.execution.decide import BUILD, PRUNE, plan_graph
    from marin.execution.errors import PipelineFailedError, step_failed
    from marin.execution.inspect import read_stored
    from marin.execution.records import log_path
    from marin.execution.scheduler import Scheduler
    from marin.execution.storage import open_prefix

    logger = get_run_logger()
    location = open_prefix(options.prefix)
    location.check_writable()
    logger.info("marin: %d step(s) under %s", len(steps), location.url)
    plan = plan_graph(steps, targets, read_stored(steps, location), options.policy)
    decisions = plan.decisions
    by_path = {s.output_path: s for s in steps}
    deps = {p: list(dict.fromkeys(d.output_path for d in s.deps)) for p, s in by_path.items()}

    state = _RunState()
    futures: dict[str, Any] = {}
    for path, decision in decisions.items():
        if decision.action == BUILD:
            continue
        warn_if_served_stale(decision)
        spec = by_path[path]
        url = location.url_for(path)
        if decision.action == PRUNE:
            task = _not_run_task(spec, decision.reason, PRUNED_STATE_NAME, completed=True)
        else:
            task = _cached_task(spec, url, decision.reason)
            state.outputs[spec.step_id] = url
        futures[path] = task.submit(
            wait_for=[futures[d] for d in deps[path] if d in futures], return_state=False
        )

    scheduler = Scheduler(
        {p: deps[p] for p in plan.to_build},
        keep_going=options.keep_going,
        label=lambda p: by_path[p].step_id,
    )
    scheduler.prepare()
    finished: queue.SimpleQueue[str] = queue.SimpleQueue()
    # Made before the first one runs: a Task costs about a millisecond to make, which would
    # otherwise sit on the critical path between a step and its dependent.
    build_tasks = {
        p: _build_task(by_path[p], location, options, state, decisions[p]) for p in plan.to_build
    }

    def submit(path: str) -> None:
        spec = by_path[path]
        with state.lock:
            built = {p: o.record for p, o in state.outcomes.items()}
            state.upstream[path] = plan.upstream(spec, built)
        future = build_tasks[path].submit(
            wait_for=[futures[d] for d in deps[path]], return_state=False
        )
        futures[path] = future
        # Wakes the loop below when the task run ends: no polling, no sleeping.
        future.add_done_callback(functools.partial(_put_path, finished, path))

    def dispatch() -> None:
        for path in scheduler.get_ready(options.max_concurrent - len(scheduler.running)):
            submit(path)

    dispatch()
    while scheduler.is_active():
        for path in _drain(finished):
            spec = by_path[path]
            future = futures[path]
            future.wait()  # done already: this keeps the in-memory final state on the future
            final = future.state
            if final.is_completed():
                with state.lock:  # the task's own outcome: no result round trip through Prefect
                    state.outputs[spec.step_id] = state.outcomes[path].output_url
                scheduler.done(path)
            else:
                state.failed[path] = state.errors.get(path) or RuntimeError(
                    f"task run ended {final.name}: {final.message}"
                )
                scheduler.failed(path)
        dispatch()
    outcome = scheduler.finish()

    # Steps that never ran still get a task run (and their edges), with a state that says why.
    not_run: list[str] = []
    for path in plan.to_build:
        if path in outcome.blocked:
            failed = ", ".join(by_path[r].step_id for r in outcome.blocked[path])
            reason = f"Not run: dependency {failed} failed"
        elif path in outcome.not_started and outcome.stopped_by is not None:
            reason = (
                f"Not run: the pipeline stopped after {by_path[outcome.stopped_by].step_id} "
                "failed (fail-fast; keep_going=True runs independent steps)"
            )
        else:
            continue
        not_run.append(by_path[path].step_id)
        # allow_failure: a failed dependency must not stop Prefect from giving this step its
        # own (NotReady) state with our message; the edges are recorded either way.
        futures[path] = _not_run_task(by_path[path], reason, NOT_RUN_STATE_NAME).submit(
            wait_for=[allow_failure(futures[d]) for d in deps[path] if d in futures],
            return_state=False,
        )
        futures[path].wait()
    # Served and pruned steps' task runs end at once, but the flow must not return (and have
    # Prefect cancel them) before they have.
    for future in futures.values():
        future.wait()

    if state.failed:
        first_path, first = next(iter(state.failed.items()))
        if options.keep_going:
            failures = {by_path[p].step_id: e for p, e in state.failed.items()}
            raise PipelineFailedError(failures, not_run) from first
        spec = by_path[first_path]
        not_run_text = f"; not run: {', '.join(not_run)}" if not_run else ""
        log_url = location.url_for(log_path(spec.output_path))
        raise step_failed(first, spec.step_id, log_url, not_run_text) from first
    return state.outputs


def _put_path(finished: queue.SimpleQueue[str], path: str, _future: Any) -> None:
    finished.put(path)


def _drain(finished: queue.SimpleQueue[str]) -> list[str]:
    """Block until one task run has ended, then take every other one that has ended too."""
    paths = [finished.get()]
    while True:
        try:
            paths.append(finished.get_nowait())
        except queue.Empty:
            return paths


def _task(
    spec: StepSpec, fn: Callable[[], Any], materialize: Location | None = None, **options: Any
) -> Task[[], Any]:
    """A task running ``fn`` for ``spec``; with ``materialize`` (the run's location), one that
    records a materialization of the step's output asset when it succeeds (marin_prefect.assets)."""
    from marin_prefect.resources import task_tags

    options = {
        "name": spec.step_id,
        "task_run_name": spec.step_id,
        "cache_policy": NO_CACHE,
        "description": f"Marin step {spec.step_id} -> {spec.output_path}",
        "tags": task_tags(spec),
        **options,
    }
    if materialize is not None:
        from marin_prefect.assets import materializing_task

        task = materializing_task(spec, materialize, fn, **options)
        if task is not None:
            return cast(Task[[], Any], task)
    return Task(fn, **options)


def _not_run_task(
    spec: StepSpec, reason: str, state_name: str, *, completed: bool = False
) -> Task[[], Any]:
    def marin_step_not_run() -> State[Any]:
        if completed:
            get_run_logger().info("%s", reason)
            return Completed(name=state_name, message=reason)
        get_run_logger().warning("%s", reason)
        return Pending(name=state_name, message=reason)

    return _task(spec, marin_step_not_run)


def _cached_task(spec: StepSpec, url: str, reason: str) -> Task[[], Any]:
    def marin_step_cached() -> State[Any]:
        return Completed(
            name=CACHED_STATE_NAME,
            data=url,
            message=f"{reason}: {url} (fingerprint {spec.fingerprint[:12]})",
        )

    return _task(spec, marin_step_cached)


def _build_task(
    spec: StepSpec,
    location: Location,
    options: RunOptions,
    state: _RunState,
    decision: Decision,
) -> Task[[], Any]:
    from marin_prefect.assets import describe_build

    def marin_step() -> Any:
        with state.lock:
            upstream = state.upstream[spec.output_path]
        try:
            outcome = _build(spec, location, options, decision, upstream)
        except BaseException as exc:
            with state.lock:
                state.errors[spec.output_path] = exc
            raise
        with state.lock:
            state.outcomes[spec.output_path] = outcome
        if outcome.action == "built":
            describe_build(spec, location, outcome)  # the materialization's metadata
            get_run_logger().info(
                "built %s -> %s in %.2fs", spec.step_id, outcome.output_url, outcome.duration_s
            )
            return outcome.output_url
        return Completed(
            name=CACHED_STATE_NAME,
            data=outcome.output_url,
            message=f"built by another runner: {outcome.output_url} "
            f"(fingerprint {spec.fingerprint[:12]})",
        )

    return _task(
        spec, marin_step, materialize=location, retries=spec.retries, timeout_seconds=spec.timeout
    )


def _build(
    spec: StepSpec,
    location: Location,
    options: RunOptions,
    decision: Decision,
    upstream: list[Upstream],
) -> BuildOutcome:
    """Build one planned step, holding Prefect concurrency slots only while it builds: one of
    ``concurrency_limit``, and with ``resource_limits`` the step's ``marin-<kind>`` slots."""
    from marin.execution.build import build_step
    from marin_prefect.assets import flow_run_lineage

    logger = get_run_logger()
    with contextlib.ExitStack() as slots:
        if options.concurrency_limit is not None:
            from prefect.concurrency.sync import concurrency

            asked = time.perf_counter()
            # strict: a missing limit is an error, not a warning and an unlimited run. The lease
            # is renewed while the step builds; a transient renewal error must not kill a build.
            slots.enter_context(
                concurrency(
                    options.concurrency_limit,
                    occupy=1,
                    strict=True,
                    raise_on_lease_renewal_failure=False,
                )
            )
            logger.info(
                "%s holds a slot of %r (waited %.2fs)",
                spec.step_id,
                options.concurrency_limit,
                time.perf_counter() - asked,
            )
        if options.resource_limits:
            from marin_prefect.resources import resource_concurrency

            slots.enter_context(resource_concurrency(spec, logger))
        with flow_run_lineage():  # the OpenLineage parent: this flow run
            return build_step(
                spec, location, policy=options.policy, decision=decision, upstream=upstream
            )
