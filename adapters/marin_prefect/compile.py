"""Compile a lowered Marin graph into a Prefect 3 flow.

One Marin step becomes one Prefect task run named ``name@version``. Every task calls the core's
``build_step``, the one build/commit path, so a local run, a Prefect run and an Airflow run of one
pipeline on one prefix share one lease, one record and one status file.

The flow body is the local ``StepRunner``'s run, with another executor: it plans every step with
``marin.execution.plan.decide`` (so ``marin plan`` with the same options predicts the flow), then
drives the core's one run loop (``marin.execution.run.loop.RunLoop``) on a ``PrefectExecutor``:
a step's task is submitted the moment its last dependency finishes, with the dependency futures
as ``wait_for`` (so Prefect records the edges), at most ``max_concurrent`` at once. A task
therefore never occupies a worker thread, nor a global concurrency slot, while it only waits on
its dependencies.

Prefect has no skipped state, so propagation is ours:

- a step served from its record ends ``Completed(name="Cached")`` with its artifact path as
  result; a pruned one (not built, and needed by nothing that runs) ends
  ``Completed(name="Pruned")``;
- a step whose dependency failed is not run: it ends ``Pending(name="NotReady")`` (the state Prefect
  itself gives a task whose upstream did not complete), with a message naming the failed step;
- after a failure, with ``keep_going=False`` (the default, as in ``marin run``), steps not yet
  started are not started either; the flow run fails with the core's ``StepFailedError`` (or
  ``PipelineFailedError`` with ``keep_going=True``) chained to the step's own exception;
- a task run that fails after its step's build (anything in Prefect's hands) fails its step
  too, and a flow with any failed task run never ends Completed.

The task runner is the flow's choice (``task_runner=``): threads of the flow run's process by
default, or any Prefect task runner. With one that runs tasks in other processes (Dask's
``DaskTaskRunner``), each build is sent to the worker as its target and pickled arguments and
built there (``marin_prefect.dask``); the loop, the plan and the states stay here.

Options of ``to_prefect_flow`` beyond ``marin run``'s:

- ``concurrency_limit`` names a Prefect global concurrency limit (create it first, e.g. with
  ``prefect gcl create NAME --limit N``); a step holds one slot only while it builds.
- ``resource_limits=True``: each building step also holds as many slots of the Prefect global
  concurrency limits ``marin-<kind>`` (``marin-gpu``, ``marin-memory-gib``, ...) as its
  ``resources`` ask for (docs/resources.md; ``marin export prefect --create-limits`` makes
  them). Off by default, so a flow runs where no limits were created.
- ``task_runner``: any Prefect task runner (default: ``ThreadPoolTaskRunner`` with
  ``max_concurrent`` threads). With ``prefect_dask.DaskTaskRunner(address=...)`` each build
  runs in a Dask worker process; a step's accelerators become Dask worker resources (a
  ``gpu=1`` step runs only on a worker started with ``--resources GPU=N``). Every worker needs
  the pipeline's code at the same path (or module) and a prefix on shared storage
  (docs/scaling.md).
- ``select`` and ``exclude`` (globs) keep only the matching steps and what they need; a pattern
  that matches no step is an error naming it and the closest names.
- ``options`` (a ``RunOptions``, checked once by the caller: the entry flow) holds what
  ``marin run`` takes: ``max_concurrent``, ``on_drift``, ``keep_going``, ``force``, ``cascade``,
  ``on_code_drift``, ``versions`` (the codex of steps with ``version=None``) and ``scope``:
  ``user`` places every step under ``<prefix>/users/<user>/`` for ``user`` (else
  ``$MARIN_USER``, then the OS user), reading the shared builds it has not built itself, as
  ``marin run --scope user`` does (``plan/scope.py``); the entry flow passes a ``RunScope`` as
  ``user``. ``location``: the prefix, opened and checked by the caller (else ``prefix`` is
  opened when the flow runs).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from prefect import Flow, Task, allow_failure, get_run_logger
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, Pending, State
from prefect.task_runners import ThreadPoolTaskRunner

from marin.execution.builder.outcome import waited_here
from marin.execution.errors import is_final
from marin.execution.pipeline.graph import Graph
from marin.execution.pipeline.scope import check_scope
from marin.execution.plan.decide import Plan, Policy
from marin.execution.plan.options import (
    RunOptions,
)
from marin.execution.plan.scope import RunScope
from marin.execution.run.executors import Completion, CompletionKind, OnDone, StepJob
from marin.execution.vocabulary import BuildOutcomeKind, Wait
from marin_prefect.dask import is_dask_runner
from marin_prefect.names import safe_prefect_name

if TYPE_CHECKING:
    from marin.execution.builder.outcome import BuildOutcome
    from marin.execution.builder.outcome import Pending as PendingBuild
    from marin.execution.pipeline.step_spec import StepSpec
    from marin.execution.pipeline.versions import VersionCodex
    from marin.execution.store.location import Location

CACHED_STATE_NAME = "Cached"
NOT_RUN_STATE_NAME = "NotReady"
PRUNED_STATE_NAME = "Pruned"


def lower_flow_target(target_or_handles: Any, versions: VersionCodex | None = None) -> Graph:
    """A target (a string or a parsed ``Target``), a handle, a ``StepSpec`` or a list of them ->
    the lowered ``Graph``, collected and checked once (``versions``: the codex of steps with
    ``version=None``)."""
    from marin.execution.pipeline.handles import ArtifactStep
    from marin.execution.pipeline.lower import lower_graph
    from marin.execution.pipeline.step_spec import StepSpec
    from marin.execution.pipeline.targets import Target

    if isinstance(target_or_handles, str | Target):
        from marin.execution.pipeline.targets import load_target

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
    return lower_graph(items, versions=versions)


def default_flow_name(target_or_handles: Any, specs: Sequence[StepSpec]) -> str:
    """``marin-<file stem>-<attr>`` for a target, else ``marin-<last target's name>``."""
    from marin.execution.pipeline.targets import Target

    if isinstance(target_or_handles, str | Target):
        parsed = _parsed(target_or_handles)
        stem, attr = parsed.stem, parsed.attr
        return safe_prefect_name(f"marin-{stem}-{attr}" if stem else f"marin-{attr}")
    return safe_prefect_name("marin-" + specs[-1].name)


def _parsed(target: Any) -> Any:
    """``target`` as a ``Target``: parsed once by the entry flow, else here."""
    from marin.execution.pipeline.targets import Target

    return target if isinstance(target, Target) else Target.parse(target)


def to_prefect_flow(
    target_or_handles: Any,
    *,
    options: RunOptions | None = None,
    location: Location | None = None,
    name: str | None = None,
    prefix: str | None = None,
    concurrency_limit: str | None = None,
    resource_limits: bool = False,
    task_runner: Any = None,
    select: Sequence[str] = (),
    exclude: Sequence[str] = (),
    user: str | RunScope | None = None,
) -> Flow[[], dict[str, str]]:
    """Compile a pipeline into a Prefect flow; calling the flow runs the pipeline, and returns
    ``{name@version: artifact path}`` for every step.

    ``target_or_handles`` is a target string (``"examples/ngram.py:pipeline"`` or
    ``"pkg.mod:attr"``), a handle, or a list of handles. The graph is lowered here, once
    (under ``options.versions``); the prefix is resolved when the flow runs (argument, else
    ``$MARIN_PREFIX``, else the default), so a worker's environment decides where a
    deployment's artifacts go. ``options`` (a ``RunOptions``, checked once by the caller; the
    defaults without one) mean what they mean for ``marin run``: the flow plans with the same
    decision function, so ``marin plan`` with the same options predicts it exactly. ``select``
    and ``exclude`` narrow the graph, and the other arguments are Prefect's own choices (the
    module docstring); ``user``: whose folder a user-scope run writes (the entry flow passes
    the ``RunScope`` it checked).

    Raises ``TargetError``/``PipelineImportError`` (a target that cannot load),
    ``InvalidStepError`` (a selection or ``force`` naming no step) and ``ValueError`` (an empty
    ``concurrency_limit``)."""
    run = options if options is not None else RunOptions()
    if concurrency_limit is not None and not concurrency_limit.strip():
        raise ValueError("error: concurrency_limit is empty: pass a global concurrency limit name")
    graph = _selected_graph(target_or_handles, select, exclude, run.versions)
    flow_name = name or default_flow_name(target_or_handles, list(graph.targets))
    if task_runner is None:
        task_runner = ThreadPoolTaskRunner(max_workers=run.max_concurrent)
    remote = not isinstance(task_runner, ThreadPoolTaskRunner)
    flow_options = FlowOptions(
        run=run, policy=run.policy(graph.steps), prefix=prefix,
        concurrency_limit=concurrency_limit, resource_limits=resource_limits, remote=remote,
        target=remote_target(target_or_handles) if remote else None,
        dask=remote and is_dask_runner(task_runner),
        placement=user if isinstance(user, RunScope) else RunScope(check_scope(run.scope), user),
    )  # fmt: skip
    return _flow(flow_name, graph, flow_options, location, task_runner)


def _selected_graph(
    target_or_handles: Any,
    select: Sequence[str],
    exclude: Sequence[str],
    versions: VersionCodex | None,
) -> Graph:
    """The lowered graph, cut to ``select``/``exclude`` (a pattern matching no step is an
    error naming the option)."""
    from marin.selection import select_graph

    return select_graph(
        lower_flow_target(target_or_handles, versions),
        select,
        exclude,
        options=("select", "exclude"),
    )


def _flow(
    flow_name: str, graph: Graph, options: FlowOptions, location: Location | None, runner: Any
) -> Flow[[], dict[str, str]]:
    """The Prefect flow whose body runs ``graph`` with ``options``."""
    steps, targets = list(graph.steps), list(graph.targets)
    body = _FlowBody(flow_name, steps, targets, options, location)

    def marin_flow() -> dict[str, str]:
        return body()

    marin_flow.__doc__ = f"Marin pipeline {flow_name}: {len(steps)} step(s)."
    return Flow(
        marin_flow,
        name=flow_name,
        description=f"Marin pipeline: {len(steps)} step(s), targets "
        + ", ".join(t.step_id for t in targets),
        task_runner=cast(Any, runner),
        validate_parameters=False,
    )


class _FlowBody:
    """A compiled flow's body: its steps and options, bound.

    Prefect ships the flow object in every task's context, to every remote worker (and a Dask
    scheduler unpickles it), where the pipeline's functions resolve only after the target is
    loaded. No worker runs the body, so it pickles as a stub that says so.
    """

    def __init__(
        self,
        name: str,
        steps: Sequence[StepSpec],
        targets: Sequence[StepSpec],
        options: Any,
        location: Location | None = None,
    ) -> None:
        self.name, self.steps, self.targets, self.options = name, steps, targets, options
        self.location = location

    def __call__(self) -> dict[str, str]:
        return run_steps(self.steps, self.targets, self.options, self.location)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ShippedFlowBody, (self.name,))


class _ShippedFlowBody:
    """What a remote worker gets of a flow's body: nothing to run."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> dict[str, str]:
        raise RuntimeError(f"the body of flow {self.name} runs only where the flow was made")


def remote_target(target_or_handles: Any) -> str | None:
    """The target a worker loads before it unpickles a build: a file made absolute (a worker
    runs in its own folder), a module path as it is; None for handles (pickled as they are)."""
    import os

    from marin.execution.pipeline.targets import Target

    if not isinstance(target_or_handles, str | Target):
        return None
    parsed = _parsed(target_or_handles)
    if parsed.is_file:
        parsed = parsed.with_location(os.path.abspath(parsed.location))
    return str(parsed)


@dataclass(frozen=True)
class FlowOptions:
    """What a compiled flow runs with: the core's run options (checked), the policy they make
    for this pipeline (``force`` resolved at compile time), and Prefect's own choices."""

    run: RunOptions
    policy: Policy
    prefix: str | None = None
    concurrency_limit: str | None = None
    resource_limits: bool = False
    remote: bool = False
    """The task runner runs tasks in other processes: builds are sent as ``marin_prefect.dask``
    packs them, and the outcome comes back as the task's result."""
    target: str | None = None
    """What a remote worker loads first (``remote_target``)."""
    dask: bool = False
    """The task runner is Dask's: a step's accelerators annotate its Dask task's resources."""
    placement: RunScope = field(default_factory=RunScope)
    """The run's scope and user: where each step reads and writes (``plan/scope.py``)."""


def run_steps(
    steps: Sequence[StepSpec],
    targets: Sequence[StepSpec],
    options: FlowOptions,
    location: Location | None = None,
) -> dict[str, str]:
    """Run ``steps`` (all transitive, deps first) as task runs of the current flow run.

    The plan (``marin.execution.plan.decide``) says which steps build; the core's one run loop
    (``marin.execution.run.loop``) says when, on a ``PrefectExecutor``. Steps that are served
    or pruned end at once with their own states; steps that never ran end ``NotReady``.
    ``location``: the prefix the entry flow opened and checked (else ``options.prefix`` is
    opened here).
    """
    from marin.execution.plan.decide import plan_graph
    from marin.execution.plan.read import read_stored
    from marin.execution.run.loop import RunLoop
    from marin.execution.run.report import KEEP_GOING_PREFECT, RunReport
    from marin.execution.store.location import open_prefix
    from marin.execution.vocabulary import Action
    from marin_prefect.assets import flow_run_lineage

    logger = get_run_logger()
    location = open_prefix(options.prefix) if location is None else location
    location.check_writable()
    logger.info("marin: %d step(s) under %s", len(steps), location.url)
    # Where each step reads and writes for the run's user, as `marin run` places them.
    placed, _ = options.placement.place(targets, location, options.policy.force, options.policy)
    if placed != list(targets):  # a user's folder, or an absolute pin
        steps, targets = Graph.of(placed).steps, placed
    plan = plan_graph(steps, targets, read_stored(steps, location), options.policy)
    _log_sweep(logger, plan)
    report = RunReport(location, plan)
    executor = PrefectExecutor(plan, location, options)
    executor.settle()
    loop = RunLoop(
        plan,
        report,
        executor,
        max_concurrent=options.run.max_concurrent,
        keep_going=options.run.keep_going,
        keep_going_hint=KEEP_GOING_PREFECT,
        targets=[t.output_path for t in targets],
    )
    with flow_run_lineage():  # the loop sends this flow run's own OpenLineage START and end
        loop.run()
    executor.mark_not_run(report.not_run)
    # Served and pruned steps' task runs end at once, but the flow must not return (and have
    # Prefect cancel them) before they have.
    executor.shutdown(wait=True)
    loop.raise_if_failed(not_run_in_message=True)
    executor.raise_if_a_task_failed()
    outputs: dict[str, str] = {}
    for path, decision in plan.decisions.items():
        if path in report.outcomes:
            outputs[decision.spec.step_id] = report.outcomes[path].output_url
        elif decision.action == Action.SKIP:
            outputs[decision.spec.step_id] = location.url_for(path)
    return outputs


def _log_sweep(logger: Any, plan: Plan) -> None:
    """The sweep's counts, as ``marin plan`` prints them (when the plan holds sweep points)."""
    from marin.execution.plan.sweep_counts import sweep_counts

    counts = sweep_counts(plan)
    if counts is not None:
        logger.info("marin: %s", counts.line())


class PrefectExecutor:
    """The run loop's executor in a compiled flow: each attempt is a Prefect task run.

    Whatever the flow's task runner is (threads, or Dask through ``DaskTaskRunner``), a step's
    task is submitted when the loop starts it, with its dependencies' futures as ``wait_for`` so
    Prefect records the edges; a task therefore never occupies a worker, nor a concurrency slot,
    while it only waits on its dependencies. Prefect retries a failed task itself (``retries``
    and ``timeout`` of the step), so ``retries_steps`` is True and the loop does not retry.

    The task body reads its job from this object (a parameterless task: Prefect would otherwise
    walk the job's spec and config as task inputs) and leaves its outcome or error here, which
    the loop gets without a result round trip through Prefect.
    """

    retries_steps = True
    wait = Wait.BLOCK
    """A task cannot give its slot back while it waits: it waits in its thread (a job, a
    lease); a retry or a new flow run reattaches."""

    def __init__(self, plan: Plan, location: Location, options: FlowOptions) -> None:
        self._plan = plan
        self._location = location
        self._options = options
        self._specs = {p: d.spec for p, d in plan.decisions.items()}
        self._deps = {
            p: list(dict.fromkeys(d.output_path for d in s.deps)) for p, s in self._specs.items()
        }
        self._futures: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._jobs: dict[str, StepJob] = {}
        self._outcomes: dict[str, BuildOutcome] = {}
        self._errors: dict[str, BaseException] = {}
        # Made before the first one runs: a Task costs about a millisecond to make, which would
        # otherwise sit on the critical path between a step and its dependent.
        self._tasks = {p: self._build_task(p) for p in plan.to_build}

    def settle(self) -> None:
        """Give every served and pruned step its task run (and its edges) at once."""
        from marin.execution.builder.commit import warn_if_served_stale
        from marin.execution.vocabulary import Action

        for path, decision in self._plan.decisions.items():
            if decision.action == Action.BUILD:
                continue
            warn_if_served_stale(decision)
            spec = self._specs[path]
            if decision.action == Action.PRUNE:
                task = _not_run_task(spec, decision.reason, PRUNED_STATE_NAME, completed=True)
            else:
                task = _cached_task(spec, self._location.url_for(path), decision.reason)
            self._futures[path] = task.submit(wait_for=self._waits(path), return_state=False)

    def submit(self, job: StepJob, on_done: OnDone) -> None:
        path = job.path
        with self._lock:
            self._jobs[path] = job
            self._outcomes.pop(path, None)
            self._errors.pop(path, None)
        task = self._tasks.get(path) or self._build_task(path)  # a vanished served step
        if self._options.remote:
            from marin_prefect.dask import pack, placement

            payload = pack(job.request, self._options)
            where = placement(job.spec) if self._options.dask else contextlib.nullcontext()
            with where:
                future = task.submit(
                    self._options.target, payload, wait_for=self._waits(path), return_state=False
                )
        else:
            future = task.submit(wait_for=self._waits(path), return_state=False)
        self._futures[path] = future
        # Tells the loop when the task run ends: no polling, no sleeping.
        future.add_done_callback(functools.partial(self._ended, job, on_done))

    def shutdown(self, *, wait: bool) -> None:
        if wait:
            for future in list(self._futures.values()):
                future.wait()

    def raise_if_a_task_failed(self) -> None:
        """A flow whose step's task run failed must not end Completed, whatever failed in it
        (call after ``shutdown(wait=True)``: each future then holds its final state)."""
        from marin.execution.errors import StepFailedError

        failed = {
            self._specs[path].step_id: future.state
            for path, future in self._futures.items()
            if future.state.is_failed() or future.state.is_crashed()
        }
        if failed:
            raise StepFailedError(
                f"{len(failed)} task run(s) failed: "
                + "; ".join(
                    f"{step}: {state.name}: {state.message}" for step, state in failed.items()
                ),
                "see the task runs' logs; built steps are kept",
            )

    def mark_not_run(self, not_run: dict[str, str]) -> None:
        """Steps that never ran still get a task run (and their edges), with a state that says
        why (the run loop's words)."""
        for path in self._plan.to_build:
            reason = not_run.get(path)
            if reason is None:
                continue
            # allow_failure: a failed dependency must not stop Prefect from giving this step its
            # own (NotReady) state with our message; the edges are recorded either way.
            task = _not_run_task(self._specs[path], reason, NOT_RUN_STATE_NAME)
            self._futures[path] = task.submit(
                wait_for=[allow_failure(f) for f in self._waits(path)], return_state=False
            )
            self._futures[path].wait()

    def _waits(self, path: str) -> list[Any]:
        return [self._futures[d] for d in self._deps[path] if d in self._futures]

    def _ended(self, job: StepJob, on_done: OnDone, future: Any) -> None:
        if self._options.remote:
            outcome, error = _remote_result(job, future)
        else:
            future.wait()  # done already (this runs from its done callback): keeps the final state
            with self._lock:
                outcome = self._outcomes.get(job.path)
                error = self._errors.get(job.path)
            if not future.state.is_completed():  # failed after its build: the step failed
                outcome = None
        if outcome is not None:
            on_done(Completion(job, CompletionKind.DONE, outcome=outcome))
            return
        if error is None:  # ended by Prefect itself (a crash, a cancellation)
            final = future.state
            error = RuntimeError(f"task run ended {final.name}: {final.message}")
        on_done(Completion(job, CompletionKind.FAILED, error=error))

    def _build_task(self, path: str) -> Task[..., Any]:
        from marin_prefect.assets import describe_build

        spec = self._specs[path]
        if self._options.remote:  # a module-level function: the worker imports it
            return _task(spec, marin_remote_step, **_attempts(spec))

        def marin_step() -> Any:
            with self._lock:
                job = self._jobs[path]
            try:
                outcome = hold_slots_and_build(spec, self._options, job.build)
            except BaseException as exc:
                with self._lock:
                    self._errors[path] = exc
                raise
            with self._lock:
                self._outcomes[path] = outcome
                self._errors.pop(path, None)  # an earlier attempt's
            if outcome.action == BuildOutcomeKind.BUILT:
                describe_build(spec, self._location, outcome)  # the materialization's metadata
            return _step_result(spec.step_id, spec.fingerprint, outcome, outcome.output_url)

        return _task(spec, marin_step, materialize=self._location, **_attempts(spec))


def _attempts(spec: StepSpec) -> dict[str, Any]:
    """A build task's attempts: the step's ``retries`` and ``timeout``, and no retry of an
    error the core calls final (``retry_unless_final``)."""
    return {
        "retries": spec.retries,
        "retry_condition_fn": retry_unless_final,
        "timeout_seconds": spec.timeout,
    }


def retry_unless_final(task: Any, task_run: Any, state: State[Any]) -> bool:
    """A build task's ``retry_condition_fn``: Prefect retries a failed attempt (within the
    step's ``retries``) unless the core says no retry changes its error (``is_final``: a
    cancelled remote job, an unplaced gang), as the run loop does. A plain function: Prefect
    calls only those (``inspect.isfunction``)."""
    error = state.result(raise_on_failure=False)
    return not (isinstance(error, BaseException) and is_final(error))


def _step_result(step_id: str, fingerprint: str, outcome: Any, data: Any) -> Any:
    """A build task's return: ``data`` when built here, a ``Cached`` state with it when another
    runner built the step meanwhile."""
    if outcome.action == BuildOutcomeKind.BUILT:
        get_run_logger().info(
            "built %s -> %s in %.2fs", step_id, outcome.output_url, outcome.duration_s
        )
        return data
    return Completed(
        name=CACHED_STATE_NAME,
        data=data,
        message=f"built by another runner: {outcome.output_url} (fingerprint {fingerprint[:12]})",
    )


def marin_remote_step(target: str | None, payload: bytes) -> Any:
    """A build task's body on a remote worker (Dask): see ``marin_prefect.dask``. Returns the
    ``RemoteOutcome`` (as a ``Cached`` state's data when another runner built the step)."""
    from marin_prefect.dask import build_remote

    remote = build_remote(target, payload)
    step_id = remote.record.name + "@" + remote.record.version
    return _step_result(step_id, remote.record.fingerprint, remote, remote)


def _remote_result(job: StepJob, future: Any) -> tuple[Any, BaseException | None]:
    """A remote build task's outcome (or error), from its final state, which the task runner
    brings back with the result: the worker's process left nothing in this one."""
    from marin_prefect.dask import RemoteOutcome

    future.wait()  # done already (this runs from its done callback): keeps the final state
    wrapped = getattr(future, "wrapped_future", None)
    if wrapped is not None and getattr(wrapped, "status", None) == "error":
        return None, wrapped.exception()  # the task runner's own failure (a lost worker)
    try:
        value = future.result(raise_on_failure=True)
    except BaseException as exc:
        return None, exc
    if isinstance(value, RemoteOutcome):
        return value.outcome(job.spec), None
    state = future.state
    return None, RuntimeError(f"task run ended {state.name}: {state.message}")


def _task(
    spec: StepSpec, fn: Callable[..., Any], materialize: Location | None = None, **options: Any
) -> Task[..., Any]:
    """A task running ``fn`` for ``spec``; with ``materialize`` (the run's location), one that
    records a materialization of the step's output asset when it succeeds (marin_prefect.assets)."""
    from marin_prefect.resources import task_tags

    options = {
        "name": spec.step_id,
        # Prefect formats a task run name with str.format: braces in a step name are literal.
        "task_run_name": spec.step_id.replace("{", "{{").replace("}", "}}"),
        "cache_policy": NO_CACHE,
        "description": f"Marin step {spec.step_id} -> {spec.output_path}",
        "tags": task_tags(spec),
        **options,
    }
    if materialize is not None:
        from marin_prefect.assets import materializing_task

        task = materializing_task(spec, materialize, fn, **options)
        if task is not None:
            return cast(Task[..., Any], task)
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
    # Only plain data in the closure: on Dask this task is pickled to a worker.
    message = f"{reason}: {url} (fingerprint {spec.fingerprint[:12]})"

    def marin_step_cached() -> State[Any]:
        return Completed(name=CACHED_STATE_NAME, data=url, message=message)

    return _task(spec, marin_step_cached)


def hold_slots_and_build(
    spec: StepSpec,
    options: FlowOptions,
    build: Callable[[], BuildOutcome | PendingBuild],
    where: dict[str, Any] | None = None,
) -> BuildOutcome:
    """Run one attempt, holding Prefect concurrency slots only while it builds: one of
    ``concurrency_limit``, and with ``resource_limits`` the step's ``marin-<kind>`` slots. The
    record names the task run (and ``where``: the Dask worker, on a remote build). A task waits
    in its thread (``Wait.BLOCK``) for a held lease and a remote job: see docs/prefect.md."""
    from marin.execution.pipeline.provenance import engine_run
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
        # The record names this task run; the OpenLineage parent is this flow run.
        with engine_run("prefect", {**_task_run_ids(), **(where or {})}), flow_run_lineage():
            return waited_here(build())


def _task_run_ids() -> dict[str, Any]:
    """The running Prefect task run's id (and its flow run's), for the record's provenance."""
    from prefect.context import TaskRunContext

    context = TaskRunContext.get()
    task_run = getattr(context, "task_run", None)
    if task_run is None:
        return {"task_run_id": None, "flow_run_id": None}
    flow_run_id = getattr(task_run, "flow_run_id", None)
    return {
        "task_run_id": str(task_run.id),
        "flow_run_id": str(flow_run_id) if flow_run_id is not None else None,
    }
