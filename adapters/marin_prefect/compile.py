"""Compile a lowered Marin graph into a Prefect 3 flow.

One Marin step becomes one Prefect task run named ``name@version``. Every task calls the core's
``build_step``, the one build/commit path, so a local run, a Prefect run and an Airflow run of one
pipeline on one prefix share one lease, one record and one status file.

Scheduling is event-driven in the flow body, like the local ``StepRunner``: a step's task is
submitted the moment its last dependency finishes, with the dependency futures as ``wait_for`` (so
Prefect records the edges). A task therefore never occupies a worker thread, nor a global
concurrency slot, while it only waits on its dependencies, and ``ThreadPoolTaskRunner(max_workers=
max_concurrent)`` caps how many steps build at once.

Prefect has no skipped state, so propagation is ours:

- a step that is already built ends ``Completed(name="Cached")`` with its artifact path as result;
- a step whose dependency failed is not run: it ends ``Pending(name="NotReady")`` (the state Prefect
  itself gives a task whose upstream did not complete), with a message naming the failed step;
- after a failure, with ``keep_going=False`` (the default, as in ``marin run``), steps not yet
  started are not started either; the flow run fails with the core's ``StepFailedError`` (or
  ``PipelineFailedError`` with ``keep_going=True``) chained to the step's own exception.
"""

from __future__ import annotations

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

from marin_prefect.names import safe_prefect_name

if TYPE_CHECKING:
    from marin.execution.build import BuildOutcome
    from marin.execution.step_spec import StepSpec
    from marin.execution.storage import Location

CACHED_STATE_NAME = "Cached"
NOT_RUN_STATE_NAME = "NotReady"


def lower_target(target_or_handles: Any) -> list[StepSpec]:
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
) -> Flow[[], dict[str, str]]:
    """Compile a pipeline into a Prefect flow; calling the flow runs the pipeline.

    ``target_or_handles`` is a target string (``"examples/ngram.py:pipeline"`` or
    ``"pkg.mod:attr"``), a handle, or a list of handles. The graph is lowered here, once; the
    prefix is resolved when the flow runs (argument, else ``$MARIN_PREFIX``, else the default), so
    a worker's environment decides where a deployment's artifacts go.

    ``concurrency_limit`` names a Prefect global concurrency limit (create it first, e.g. with
    ``prefect gcl create NAME --limit N``); a step holds one slot only while it builds. The flow
    returns ``{name@version: artifact path}`` for every step.
    """
    from marin.execution.build import check_drift_policy
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
    targets = lower_target(target_or_handles)
    steps = collect_steps(targets)
    flow_name = name or default_flow_name(target_or_handles, targets)
    options = RunOptions(
        prefix=prefix,
        on_drift=on_drift,
        concurrency_limit=concurrency_limit,
        keep_going=keep_going,
    )

    def marin_flow() -> dict[str, str]:
        return run_steps(steps, options)

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
    on_drift: str = "warn"
    concurrency_limit: str | None = None
    keep_going: bool = False


@dataclass
class _RunState:
    """What the flow body knows about each step, by output path."""

    errors: dict[str, BaseException] = field(default_factory=dict)
    """The exception of each step's last attempt (written by the task, read after it ends)."""
    failed: dict[str, BaseException] = field(default_factory=dict)
    blocked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Steps not run -> the step ids of the failures that blocked them."""
    outputs: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_steps(steps: Sequence[StepSpec], options: RunOptions) -> dict[str, str]:
    """Run ``steps`` (all transitive, deps first) as task runs of the current flow run."""
    from marin.execution.errors import PipelineFailedError, StepFailedError
    from marin.execution.graph import canonical_deps
    from marin.execution.records import log_path
    from marin.execution.storage import open_prefix

    logger = get_run_logger()
    location = open_prefix(options.prefix)
    location.check_writable()
    logger.info("marin: %d step(s) under %s", len(steps), location.url)

    by_path = {s.output_path: s for s in steps}
    deps = canonical_deps(list(steps))
    dependents: dict[str, list[str]] = {p: [] for p in by_path}
    waiting: dict[str, int] = {}
    for path, path_deps in deps.items():
        unique = {d.output_path for d in path_deps}
        waiting[path] = len(unique)
        for dep in unique:
            dependents[dep].append(path)

    state = _RunState()
    futures: dict[str, Any] = {}
    finished: queue.SimpleQueue[str] = queue.SimpleQueue()
    in_flight: set[str] = set()
    ready = [p for p in by_path if waiting[p] == 0]
    stop_reason: str | None = None

    def submit(path: str) -> None:
        spec = by_path[path]
        upstream = [futures[d.output_path] for d in deps[path]]
        blockers = _blockers(deps[path], state)
        if blockers:
            reason = _not_run_message(spec, deps[path], blockers, state)
            state.blocked[path] = blockers
            task = _not_run_task(spec, reason)
        elif stop_reason is not None:
            state.blocked[path] = ()
            task = _not_run_task(spec, stop_reason)
        else:
            task = _build_task(spec, location, options, state)
        # allow_failure: a failed dependency must not stop Prefect from giving this step its own
        # (NotReady) state with our message; the edges are recorded either way.
        future = task.submit(wait_for=[allow_failure(f) for f in upstream], return_state=False)
        futures[path] = future
        in_flight.add(path)
        # Wakes the loop below when the task run ends: no polling, no sleeping.
        future.add_done_callback(functools.partial(_put_path, finished, path))

    while ready or in_flight:
        for path in ready:
            submit(path)
        ready = []
        for path in _drain(finished):
            in_flight.discard(path)
            spec = by_path[path]
            future = futures[path]
            future.wait()  # done already: this keeps the in-memory final state on the future
            final = future.state
            if final.is_completed():
                state.outputs[spec.step_id] = future.result()
            elif path not in state.blocked:
                error = state.errors.get(path) or RuntimeError(
                    f"task run ended {final.name}: {final.message}"
                )
                state.failed[path] = error
                if not options.keep_going and stop_reason is None:
                    stop_reason = (
                        f"Not run: the pipeline stopped after {spec.step_id} failed "
                        "(fail-fast; keep_going=True runs independent steps)"
                    )
            for child in dependents[path]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)

    if state.failed:
        first_path, first = next(iter(state.failed.items()))
        blocked_ids = [by_path[p].step_id for p in by_path if p in state.blocked]
        if options.keep_going:
            failures = {by_path[p].step_id: e for p, e in state.failed.items()}
            raise PipelineFailedError(failures, blocked_ids) from first
        spec = by_path[first_path]
        not_run = f"; not run: {', '.join(blocked_ids)}" if blocked_ids else ""
        raise StepFailedError(
            f"{type(first).__name__}: {first}{not_run}",
            "see the step's log at "
            + location.url_for(log_path(spec.output_path))
            + "; fix it and run again (built steps are kept)",
            spec.step_id,
        ) from first
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


def _blockers(step_deps: Sequence[StepSpec], state: _RunState) -> tuple[str, ...]:
    """The failed step ids upstream of a step, through any chain of not-run steps."""
    roots: dict[str, None] = {}
    for dep in step_deps:
        if dep.output_path in state.failed:
            roots[dep.step_id] = None
        elif dep.output_path in state.blocked:
            roots.update(dict.fromkeys(state.blocked[dep.output_path]))
    return tuple(roots)


def _not_run_message(
    spec: StepSpec, step_deps: Sequence[StepSpec], blockers: tuple[str, ...], state: _RunState
) -> str:
    failed = ", ".join(blockers)
    noun = "dependency" if len(blockers) == 1 else "dependencies"
    via = [d.step_id for d in step_deps if d.output_path in state.blocked]
    suffix = f" (via {', '.join(via)})" if via else ""
    return f"Not run: {noun} {failed} failed{suffix}"


def _task(spec: StepSpec, fn: Callable[[], Any], **options: Any) -> Task[[], Any]:
    return Task(
        fn,
        name=spec.step_id,
        task_run_name=spec.step_id,
        cache_policy=NO_CACHE,
        description=f"Marin step {spec.step_id} -> {spec.output_path}",
        **options,
    )


def _not_run_task(spec: StepSpec, reason: str) -> Task[[], Any]:
    def marin_step_not_run() -> State[Any]:
        get_run_logger().warning("%s", reason)
        return Pending(name=NOT_RUN_STATE_NAME, message=reason)

    return _task(spec, marin_step_not_run)


def _build_task(
    spec: StepSpec, location: Location, options: RunOptions, state: _RunState
) -> Task[[], Any]:
    def marin_step() -> Any:
        try:
            outcome = _build(spec, location, options)
        except BaseException as exc:
            with state.lock:
                state.errors[spec.output_path] = exc
            raise
        if outcome.action == "built":
            get_run_logger().info(
                "built %s -> %s in %.2fs", spec.step_id, outcome.output_url, outcome.duration_s
            )
            return outcome.output_url
        why = "built by another runner" if outcome.action == "built-by-other" else "already built"
        if outcome.drift:
            why += " (config drifted without a version bump; served from cache)"
        return Completed(
            name=CACHED_STATE_NAME,
            data=outcome.output_url,
            message=f"{why}: {outcome.output_url} (fingerprint {spec.fingerprint[:12]})",
        )

    return _task(spec, marin_step, retries=spec.retries)


def _build(spec: StepSpec, location: Location, options: RunOptions) -> BuildOutcome:
    from marin.execution.build import build_step

    if options.concurrency_limit is None or not _needs_slot(spec, location, options.on_drift):
        return build_step(spec, location, on_drift=options.on_drift)
    from prefect.concurrency.sync import concurrency

    logger = get_run_logger()
    asked = time.perf_counter()
    # strict: a missing limit is an error, not a warning and an unlimited run. The lease is
    # renewed while the step builds; a transient renewal error must not kill a long build.
    with concurrency(
        options.concurrency_limit,
        occupy=1,
        strict=True,
        raise_on_lease_renewal_failure=False,
    ):
        logger.info(
            "%s holds a slot of %r (waited %.2fs)",
            spec.step_id,
            options.concurrency_limit,
            time.perf_counter() - asked,
        )
        return build_step(spec, location, on_drift=options.on_drift)


def _needs_slot(spec: StepSpec, location: Location, on_drift: str) -> bool:
    """Whether building ``spec`` may run ``fn``: a built step is served without taking a slot."""
    from marin.execution.inspect import BUILT, DRIFT, inspect_step

    action = inspect_step(spec, location).action
    if action == DRIFT:
        return on_drift == "rebuild"  # warn serves the cache; error fails without building
    return action != BUILT
