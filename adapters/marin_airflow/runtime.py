"""What each task of an exported DAG runs on the Airflow worker.

Importing this module is cheap (the DAG file imports it at parse time): the pipeline, the Marin
core (but its option defaults and vocabulary, two small modules) and Airflow's context are only
imported inside ``run_step``, when a task actually runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from marin.execution.errors import MarinError, is_final
from marin.execution.pipeline.versions import (
    active_codex,
    codex_json,
    exported_codex,
    resolved_id,
    use_codex,
)
from marin.execution.plan.options import DEFAULT_ON_DRIFT, RunOptions, check_patterns
from marin.execution.vocabulary import Action, BuildOutcomeKind, OutputScope, RunResult, Wait
from marin_airflow.contract import PLAN_TASK_ID, XComKey, resolve_target
from marin_airflow.contract import graph_digest as digest_of

log = logging.getLogger("marin.airflow")

PREFIX_ENV = "MARIN_PREFIX"
AIRFLOW_FAILED, AIRFLOW_RUNNING = "failed", "running"
"""Airflow's task instance states (``TaskInstanceState``), named here without importing Airflow."""

_lock = threading.Lock()
"""Guards the dicts below and ``_target_locks``; held only to read or insert, never to load."""
_target_locks: dict[str, threading.Lock] = {}
"""Per target: held while it is loaded or lowered, so tasks of one process share that work while
tasks of other pipelines never wait for it."""
_lowered: dict[str, dict[str, Any]] = {}
"""Per process: lowering key (``_key``) -> {step_id: StepSpec}. Airflow may run many tasks, of
many DAGs, per process."""
_graphs: dict[str, Any] = {}
"""Per process: lowering key -> the lowered ``Graph`` (targets and every step)."""


def task_placement(step: Mapping[str, Any]) -> dict[str, Any]:
    """Operator arguments from one ``STEPS`` entry of a generated DAG file (called at parse time).

    ``queue`` -> ``queue``, ``pool_slots`` -> ``pool_slots``, ``timeout_s`` ->
    ``execution_timeout``, and ``pod_resources`` (``--executor kubernetes`` only) -> an
    ``executor_config`` pod override with those requests and limits. Keys a step does not set
    are absent, so Airflow's defaults apply.
    """
    out: dict[str, Any] = {}
    if step.get("queue") is not None:
        out["queue"] = str(step["queue"])
    if step.get("pool_slots") is not None:
        out["pool_slots"] = int(step["pool_slots"])
    if step.get("timeout_s") is not None:
        out["execution_timeout"] = datetime.timedelta(seconds=float(step["timeout_s"]))
    if step.get("pod_resources"):
        out["executor_config"] = {"pod_override": pod_override(step["pod_resources"])}
    return out


def pod_override(quantities: Mapping[str, str]) -> Any:
    """A ``V1Pod`` whose ``base`` container requests and is limited to ``quantities``."""
    from kubernetes.client import models as k8s

    amounts = {str(k): str(v) for k, v in quantities.items()}
    return k8s.V1Pod(
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(
                    name="base",
                    resources=k8s.V1ResourceRequirements(
                        requests=dict(amounts), limits=dict(amounts)
                    ),
                )
            ]
        )
    )


class StaleDagError(MarinError, RuntimeError):
    """The DAG file no longer matches the pipeline; ``fix`` says how to re-export it."""


def _fix(export_command: str, export_root: str, dag_dir: str) -> str:
    command = export_command or "marin export airflow TARGET -o DAGS_FOLDER"
    where = os.path.normpath(os.path.join(dag_dir, export_root))
    return f"re-run `{command}` in {where} and deploy the regenerated DAG file"


def _key(target: str) -> str:
    """What the caches are keyed by: everything that changes how ``target`` lowers, which is
    the target and the ambient version codex (each task sets its DAG's; two DAGs exported with
    other versions of one pipeline may share a worker). The scope is not in it: the specs kept
    are unplaced, and each run places them for its own user (``marin_airflow.scopes``)."""
    codex = active_codex(None)
    return target if codex is None else f"{target}\x00{codex_json(codex)}"


def _target_lock(target: str) -> threading.Lock:
    with _lock:
        return _target_locks.setdefault(target, threading.Lock())


def steps_for(target: str) -> dict[str, Any]:
    """Load and lower ``target`` once per process and codex; every transitive step by its id."""
    key = _key(target)
    with _lock:
        cached = _lowered.get(key)
    if cached is not None:
        return cached
    from marin.execution.pipeline.lower import lower_graph
    from marin.execution.pipeline.targets import load_target

    with _target_lock(key):
        with _lock:
            cached = _lowered.get(key)  # another task lowered it while this one waited
        if cached is not None:
            return cached
        graph = lower_graph(load_target(target))  # collected and checked once, here
        steps = {spec.step_id: spec for spec in graph.steps}
        with _lock:
            _lowered[key], _graphs[key] = steps, graph
        return steps


def graph_for(target: str) -> Any:
    """The target's ``Graph``, lowered once per process (see ``steps_for``)."""
    steps_for(target)
    with _lock:
        return _graphs[_key(target)]


_handles: dict[str, dict[str, Any]] = {}
"""Per process: lowering key -> every handle of its graph by step id (not lowered)."""
_memos: dict[str, dict[Any, Any]] = {}
"""Per process: lowering key -> the ``lower`` memo, so each step is lowered at most once."""


def handles_for(target: str) -> dict[str, Any]:
    """Every step handle of ``target`` by step id, without lowering any: once per process.

    Walking handles is cheap (no config is built, nothing is hashed), so a task can find its own
    step, and check a ``force`` name against the whole pipeline, without lowering the graph.
    """
    key = _key(target)  # a deferred handle's id depends on the codex
    with _lock:
        cached = _handles.get(key)
    if cached is not None:
        return cached
    from marin.execution.pipeline.targets import load_target

    with _target_lock(key):
        with _lock:
            cached = _handles.get(key)
        if cached is not None:
            return cached
        found = _handles_by_id(load_target(target))
        with _lock:
            _handles[key] = found
        return found


def _handles_by_id(roots: Sequence[Any]) -> dict[str, Any]:
    """Every handle reachable from ``roots``, by its (codex-resolved) step id."""
    found: dict[str, Any] = {}
    stack = list(roots)
    seen: set[int] = set()
    while stack:  # iterative: a 100,000-deep chain has no recursion limit to hit
        handle = stack.pop()
        if id(handle) in seen:
            continue
        seen.add(id(handle))
        found.setdefault(resolved_id(handle), handle)
        stack.extend(handle.deps)
    return found


def step_for(target: str, step: str) -> Any | None:
    """The ``StepSpec`` of one step, lowering only it and its ancestors; None if absent.

    A task of a 10,000-step DAG builds one step: lowering the whole graph for it (as
    ``steps_for`` does) costs every task O(graph). This lowers just the handle named ``step``,
    which lowers its dependencies and nothing else. The handles and the lowering memo are kept
    per process, so several tasks in one worker share the work.
    """
    key = _key(target)
    with _lock:
        cached = _lowered.get(key)
        if cached is not None:
            return cached.get(step)
    handle = handles_for(target).get(step)
    if handle is None:
        return None
    from marin.execution.pipeline.lower import lower

    with _target_lock(key):  # the memo is shared by this process's tasks of the target
        with _lock:
            memo = _memos.setdefault(key, {})
        return lower(handle, memo=memo)


def clear_cache() -> None:
    with _lock:
        _lowered.clear()
        _graphs.clear()
        _handles.clear()
        _memos.clear()


TASK_INSTANCE_FIELDS = ("dag_id", "run_id", "task_id", "try_number", "map_index")


def task_instance_ids(context: Any | None) -> dict[str, Any] | None:
    """The running task instance's identity, for the record's provenance (``engine``); None
    when called outside an Airflow task (no task instance to name)."""
    ti = context.get("ti") if context is not None else None
    if ti is None:
        return None
    ids = {field: getattr(ti, field, None) for field in TASK_INSTANCE_FIELDS}
    # Plain JSON data only: an Airflow version could hand back richer objects here.
    return {k: v if isinstance(v, int | str) or v is None else str(v) for k, v in ids.items()}


def _airflow_context() -> Any | None:
    if "airflow.sdk" not in sys.modules:  # not inside an Airflow task: don't import Airflow
        return None
    try:
        from airflow.sdk import get_current_context

        return get_current_context()
    except Exception:  # not inside a running Airflow task (e.g. called directly)
        return None


def failed_task_in_run(context: Any | None) -> str | None:
    """Fail-fast, as ``marin run`` does it: a task of this DAG run whose step failed, if any.

    Unless the run's ``keep_going`` param is true, a step does not start once another step of the
    run has failed; it ends skipped, and so does each of its dependents when it starts (their
    ``none_failed`` trigger rule lets them start, so that a step the plan served, also skipped,
    never holds back a step that must build). Steps already running finish (Airflow's own DAG
    ``fail_fast`` would kill them instead).

    A failed task's state reaches the database only after its process has wound down, so the
    tasks still "running" are also asked for the XCom a failing step pushes at once. Only those
    (at most ``max_active_tasks``) are asked, so a task start costs O(concurrency) calls.
    """
    if context is None:
        return None
    params = context.get("params") or {}
    ti = context.get("ti")
    keep_going = RunOptions.from_params(params).keep_going
    if keep_going or ti is None or not hasattr(ti, "get_task_states"):
        return None
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id) or {}
    failed = sorted(t for t, state in states.items() if state == AIRFLOW_FAILED)
    if failed:
        return str(failed[0])
    running = sorted(
        t for t, state in states.items() if state == AIRFLOW_RUNNING and t != ti.task_id
    )
    for task_id in running:
        if ti.xcom_pull(task_ids=task_id, key=XComKey.FAILED.value):
            return str(task_id)
    return None


def _announce_failure(context: Any | None, step: str) -> None:
    """Tell the run's other tasks at once that this step failed (see ``failed_task_in_run``)."""
    ti = context.get("ti") if context is not None else None
    if ti is None or not hasattr(ti, "xcom_push"):
        return
    try:
        ti.xcom_push(key=XComKey.FAILED.value, value=step)
    except Exception as exc:  # the failure itself is what the task reports
        log.warning("marin: could not announce the failure of %s: %s", step, exc)


def _dag_dir(context: Any | None) -> str:
    """The folder of the DAG file being run, which relative targets are resolved against."""
    dag = context.get("dag") if context is not None else None
    fileloc = getattr(dag, "fileloc", None)
    if fileloc:
        return os.path.dirname(os.path.abspath(str(fileloc)))
    folder = os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")
    return os.path.abspath(folder) if folder else os.getcwd()


def choose_prefix(param: object, default_prefix: str | None) -> str | None:
    """The run's ``prefix`` param, else ``$MARIN_PREFIX``, else the exported default.

    A trigger chooses the param, so on a worker with ``MARIN_ALLOWED_PREFIXES`` a prefix outside
    the allowed roots fails here, before the pipeline is imported or storage is touched.
    """
    chosen = _chosen_prefix(param, default_prefix)
    from marin.execution.store.location import resolve_prefix
    from marin.execution.store.prefix_policy import check_prefix

    check_prefix(resolve_prefix(chosen), chosen)
    return chosen


def _chosen_prefix(param: object, default_prefix: str | None) -> str | None:
    """The prefix ``choose_prefix`` picks, not yet checked (``open_prefix`` checks it)."""
    from marin.execution.errors import InvalidStepError, brief

    if param is not None and not isinstance(param, str):
        raise InvalidStepError(
            f"param prefix={brief(param)} is a {type(param).__name__}, not a path or URL",
            f"set prefix to a string (a path, gs://..., s3://...), or leave it empty for "
            f"${PREFIX_ENV}, then the exported default",
        )
    return param or os.environ.get(PREFIX_ENV) or default_prefix or None


def run_policy(
    context: Any | None,
    default_on_drift: str,
    steps: Mapping[str, Any],
    planned_force: Any = None,
) -> Any:
    """The run's ``on_drift``, ``on_code_drift``, ``force`` and ``cascade`` params -> a core
    ``Policy``.

    Params are set by whoever triggers the run: untrusted data, validated here (Airflow's own
    param schema checks them at trigger time too). A bad value fails the task with a clear error.
    ``force`` names are resolved against ``steps`` (specs or handles: only ``step_id`` and
    ``name`` are read), or taken as ``planned_force``, the step ids the ``marin-plan`` task
    resolved from the same params against the whole graph, when given.
    """
    from marin.execution.errors import InvalidStepError, brief
    from marin.execution.plan.decide import Policy

    params = (context.get("params") if context is not None else None) or {}
    options = RunOptions.from_params(params, defaults={"on_drift": default_on_drift})
    if planned_force is not None:
        if not isinstance(planned_force, list) or not all(
            isinstance(f, str) for f in planned_force
        ):
            raise InvalidStepError(
                f"XCom force={brief(planned_force)} of task {PLAN_TASK_ID}",
                "clear the run and trigger it again",
            )
        return Policy(
            options.on_drift,
            frozenset(planned_force),
            options.cascade,
            options.force_run_failed,
            options.on_code_drift,
        )
    return options.policy(list(steps.values()))


def _param(params: Mapping[str, Any], name: str, default: Any) -> Any:
    """A run param, or ``default`` when it is unset (absent, None or the empty string)."""
    value = params.get(name)
    return default if value is None or (isinstance(value, str) and not value) else value


def _prefix_param(context: Any | None) -> Any:
    """The run's ``prefix`` param as given (checked by ``choose_prefix``), None when unset."""
    params = (context.get("params") if context is not None else None) or {}
    return _param(params, "prefix", None)


def _warn_newer(newer: dict[str, Any], context: Any | None) -> None:
    """Fields a newer exporter wrote into the DAG file (Airflow's own context keys, which it
    passes to a ``**kwargs`` callable, are not fields)."""
    unknown = sorted(k for k in newer if context is None or k not in context)
    if unknown:
        log.warning(
            "marin: ignoring unknown DAG file fields %s; upgrade marin-execution on the workers",
            ", ".join(unknown),
        )


def _location(
    prefix: object,
    default_prefix: str | None,
    shared_prefix_only: bool = False,
    step: str | None = None,
) -> Any:
    from marin.execution.store.location import open_prefix

    chosen = _chosen_prefix(prefix, default_prefix)
    location = open_prefix(chosen)  # checked against MARIN_ALLOWED_PREFIXES once, here
    if shared_prefix_only and (location.is_local or location.is_memory):
        # Another worker could neither see these artifacts nor honour their leases.
        from marin.execution.errors import StorageError

        raise StorageError(
            f"prefix {location.url} is on this worker's own storage, but this DAG's tasks run "
            "on many machines (exported with --executor celery or kubernetes)",
            "trigger the run with a 'prefix' param on shared storage (s3://..., gs://...), or "
            "set MARIN_PREFIX to one on every worker",
            step,
        )
    if chosen is None:
        log.warning(
            "marin: no prefix param, $MARIN_PREFIX or exported default; using Marin's local "
            "default %s on this worker",
            location.url,
        )
    return location


def _run_choices(versions: str | None, scope: str, context: Any | None) -> Any:
    """The run's ``versions`` and ``scope`` params (untrusted) may only be what the DAG file
    allows: its exported codex and scope. Then lowering uses that codex; returns the run's
    ``RunScope`` (``marin_airflow.scopes``)."""
    from marin_airflow.scopes import run_scope

    params = (context or {}).get("params") or {}
    placement = run_scope(scope, context)
    use_codex(exported_codex(versions, params.get("versions"), "param versions"))
    return placement


def _placed_step(context: Any | None, placement: Any, spec: Any, location: Any, policy: Any) -> Any:
    """Where the step reads and writes. A step that needs a user takes the plan task's (its
    XCom), so every task of a run writes for one user whatever its worker's ``$MARIN_USER``."""
    from marin.execution.plan.scope import needs_user
    from marin_airflow.scopes import run_scope

    if needs_user([spec], placement.scope):
        planned = _from_xcom(context, PLAN_TASK_ID, XComKey.USER)
        placement = run_scope(placement.scope, context, planned)
    (placed,), _ = placement.place([spec], location, policy.force, policy)
    return placed


def plan_steps(
    *,
    target: str,
    default_prefix: str | None = None,
    default_on_drift: str = DEFAULT_ON_DRIFT,
    graph_digest: str | None = None,
    export_command: str = "",
    export_root: str = ".",
    prefix: str | None = None,
    dag_dir: str | None = None,
    shared_prefix_only: bool = False,
    select: Sequence[str] = (),
    exclude: Sequence[str] = (),
    dag_fingerprints: Mapping[str, str] | None = None,
    versions: str | None = None,
    scope: str = OutputScope.SHARED,
    **newer: Any,
) -> dict[str, Any]:
    """The DAG's first task: decide every step, as ``marin plan`` does, for the step tasks.

    ``select`` and ``exclude`` are the export's ``--select``/``--exclude`` (from the DAG file,
    never from the run's params): only the steps they leave are planned, as ``marin plan``
    plans them with those options, so they are exactly the DAG file's steps. ``scope``: the
    export's (``--scope user``: each step reads and writes as ``marin run --scope user``).

    ``dag_fingerprints`` (step id -> the fingerprint in the DAG file, passed by the plan
    operator) names the ``stale`` steps: gone from the pipeline or lowered to another
    fingerprint. Their tasks must run whatever the plan decides, to fail as stale.

    Returns (one XCom per key) the step ids to ``build``, to serve (``skip``: cached) and to
    ``prune``, the policy used, and the run's ``user`` when a step needs one. In a DAG file
    whose plan task is a ``MarinPlanOperator``, the tasks of the steps not built are then
    skipped without a launch. A drifted step under ``on_drift=error`` raises ``DriftError``
    here, before any step runs.
    """
    context = _airflow_context()
    _warn_newer(newer, context)
    placement = _run_choices(versions, scope, context)
    if prefix is None:
        prefix = _prefix_param(context)
    dag_dir = dag_dir or _dag_dir(context)
    # The DAG file is data: its selection is checked like any option before it is used.
    graph = _selected_graph(resolve_target(target, dag_dir), select, exclude)
    steps = {spec.step_id: spec for spec in graph.steps}
    if graph_digest is not None:
        _warn_if_changed(graph_digest, steps.values(), _fix(export_command, export_root, dag_dir))
    policy = run_policy(context, default_on_drift, steps)
    location = _location(prefix, default_prefix, shared_prefix_only)
    return _plan_placed(graph, placement, policy, location, steps, dag_fingerprints)


def _selected_graph(resolved: str, select: Sequence[str], exclude: Sequence[str]) -> Any:
    """The lowered graph of ``resolved``, cut to the DAG file's selection."""
    from marin.selection import select_graph

    return select_graph(
        graph_for(resolved),
        check_patterns(select, "SELECT"),
        check_patterns(exclude, "EXCLUDE"),
    )


def _warn_if_changed(digest: str, specs: Iterable[Any], fix: str) -> None:
    """Warn when the pipeline's steps changed (added or removed) since the export."""
    if digest_of((s.step_id, s.fingerprint) for s in specs) != digest:
        log.warning(
            "marin: the DAG file is stale: the pipeline's steps changed since the export: %s", fix
        )


def _plan_placed(
    graph: Any,
    placement: Any,
    policy: Any,
    location: Any,
    steps: Mapping[str, Any],
    dag_fingerprints: Mapping[str, str] | None,
) -> dict[str, Any]:
    """Place every step for the run's scope and user (as ``marin run`` does), then plan it."""
    from marin.execution.pipeline.graph import Graph
    from marin.execution.plan.decide import plan_graph
    from marin.execution.plan.read import read_stored
    from marin.plan_view import plan_table

    targets, user = placement.place(list(graph.targets), location, policy.force, policy)
    placed = targets != list(graph.targets)  # a user's folder, or an absolute pin
    specs = list(Graph.of(targets).steps) if placed else list(graph.steps)
    plan = plan_graph(specs, targets, read_stored(specs, location), policy)
    log.info("marin: the plan under %s:\n%s", location.url, plan_table(plan, location))
    result = _plan_result(plan, policy, steps, dag_fingerprints)
    if user is not None:  # every step task writes for this user, whatever its worker's
        result[XComKey.USER.value] = user
    return result


def _plan_result(
    plan: Any, policy: Any, steps: Mapping[str, Any], dag_fingerprints: Mapping[str, str] | None
) -> dict[str, Any]:
    """The plan task's XComs: the step ids by action, the stale ones, and the policy used."""
    from marin.execution.builder.commit import warn_if_served_stale

    stale = sorted(
        step
        for step, fp in (dag_fingerprints or {}).items()
        if step not in steps or steps[step].fingerprint != fp
    )
    by_action: dict[str, list[str]] = {action: [] for action in Action}
    for d in plan.decisions.values():
        by_action[d.action].append(d.spec.step_id)
        if d.action == Action.SKIP:
            # Its task may never run (MarinPlanOperator skips it): warn here, as build_step does.
            warn_if_served_stale(d)
    if stale:
        log.warning(
            "marin: %d step(s) of the DAG file are stale, their tasks run to fail: %s",
            len(stale),
            ", ".join(stale),
        )
    return {
        Action.BUILD.value: by_action[Action.BUILD],
        Action.SKIP.value: by_action[Action.SKIP],
        Action.PRUNE.value: by_action[Action.PRUNE],
        XComKey.STALE.value: stale,
        XComKey.ON_DRIFT.value: policy.on_drift,
        XComKey.ON_CODE_DRIFT.value: policy.on_code_drift,
        XComKey.FORCE.value: sorted(policy.force),
        XComKey.CASCADE.value: policy.cascade,
    }


def _from_xcom(context: Any | None, task_id: str, key: str) -> Any:
    ti = context.get("ti") if context is not None else None
    if ti is None:
        return None
    return ti.xcom_pull(task_ids=task_id, key=str(key))


def _upstream(context: Any | None, spec: Any, location: Any) -> list[Any]:
    """Each dependency's current record, and whether its task built it in this run."""
    from marin.execution.builder.commit import read_upstream

    built_here: set[str] = set()
    task = context.get("task") if context is not None else None
    for task_id in sorted(getattr(task, "upstream_task_ids", ()) or ()):
        if (
            task_id != PLAN_TASK_ID
            and _from_xcom(context, task_id, XComKey.ACTION) == BuildOutcomeKind.BUILT
        ):
            built_here.add(str(_from_xcom(context, task_id, XComKey.STEP)))
    # Read after its task ended, a dependency built in this run is committed: its record is the
    # new build, which a dependent compares with what it consumed (early cutoff).
    return [
        dataclasses.replace(u, rebuilt=built, committed=built)
        for u in read_upstream(spec, location)
        for built in [u.step_id in built_here]
    ]


def _record_datasets(context: Any | None, inputs: Any, output: Any | None = None) -> None:
    """Tell this task's operator what its run reads and wrote, for Airflow's OpenLineage
    provider (``MarinOperator.get_openlineage_facets_on_complete``): the same names as
    Marin's own events (``artifact_names``)."""
    from marin_airflow.operator import MarinOperator, TaskDatasets

    task = context.get("task") if context is not None else None
    if not isinstance(task, MarinOperator):
        return
    task.record_datasets(
        TaskDatasets(
            inputs=[(n.dataset_namespace, n.dataset_name) for n in inputs],
            output=None if output is None else (output.dataset_namespace, output.dataset_name),
        )
    )


def run_step(
    *,
    target: str,
    step: str,
    fingerprint: str,
    default_prefix: str | None = None,
    default_on_drift: str = DEFAULT_ON_DRIFT,
    export_command: str = "",
    export_root: str = ".",
    graph_digest: str | None = None,
    prefix: str | None = None,
    dag_dir: str | None = None,
    shared_prefix_only: bool = False,
    versions: str | None = None,
    scope: str = OutputScope.SHARED,
    awaited_job: str = "",
    **newer: Any,
) -> dict[str, Any] | Any:
    """Build one Marin step (or find it built) and return what happened, for XCom; or, while its
    remote job runs, the pending build (``Pending``), on which ``MarinOperator`` defers.

    ``target`` is what the DAG file recorded: a module path, or a file path relative to the DAG
    file's folder. ``fingerprint`` is the one computed at export time; if the pipeline now
    lowers to another fingerprint, the DAG file is stale and the task fails without building.
    Only this step and its ancestors are lowered. ``graph_digest`` (passed by DAG files of older
    exporters) is not checked here: the ``marin-plan`` task checks it for the whole graph.
    ``scope``: the export's; the step is placed for the run's user as the plan task placed it.
    ``awaited_job``: the job the task deferred on (``MarinOperator.execute_complete``): found
    stopped, the step fails as cancelled (``BuildRequest.awaited_job``), never resubmitted.
    """
    context = _airflow_context()
    _warn_newer(newer, context)
    placement = _run_choices(versions, scope, context)
    if prefix is None:
        prefix = _prefix_param(context)
    dag_dir = dag_dir or _dag_dir(context)
    resolved = resolve_target(target, dag_dir)
    spec = _current_spec(
        resolved, target, step, fingerprint, _fix(export_command, export_root, dag_dir)
    )
    # A fingerprint covers the step's ancestors, so the check above is this step's whole
    # staleness check; steps added or removed elsewhere (``graph_digest``) are the plan task's
    # warning. ``force`` was resolved by the plan task against the whole graph; called outside
    # a DAG run, the names are checked against the pipeline's handles (nothing lowered).
    location = _location(prefix, default_prefix, shared_prefix_only, step)
    planned_force = _from_xcom(context, PLAN_TASK_ID, XComKey.FORCE)
    policy = run_policy(
        context,
        default_on_drift,
        handles_for(resolved) if planned_force is None else {},
        planned_force,
    )
    spec = _placed_step(context, placement, spec, location, policy)
    if step in (_from_xcom(context, PLAN_TASK_ID, Action.PRUNE) or []):
        log.info("marin: step %s pruned: not built, and nothing being built needs it", step)
        return _pruned_result(step, spec, location)
    _stop_if_the_run_failed(context)
    return _build(context, spec, location, policy, awaited_job)


def _pruned_result(step: str, spec: Any, location: Any) -> dict[str, Any]:
    """The XCom of a step the plan pruned (its task ran anyway: cleared, or called directly)."""
    return {
        XComKey.STEP.value: step,
        XComKey.ACTION.value: RunResult.PRUNED.value,
        "cached": True,
        "output_url": location.url_for(spec.output_path),
        "fingerprint": spec.fingerprint,
    }


def _stop_if_the_run_failed(context: Any | None) -> None:
    """Fail-fast: skip this task when another step of the run failed (``failed_task_in_run``)."""
    stopped_by = failed_task_in_run(context)
    if stopped_by is not None:
        from airflow.sdk.exceptions import AirflowSkipException

        from marin.execution.run.report import KEEP_GOING_AIRFLOW, stopped_reason

        raise AirflowSkipException(stopped_reason(stopped_by, KEEP_GOING_AIRFLOW))


def _build(
    context: Any | None, spec: Any, location: Any, policy: Any, awaited_job: str = ""
) -> dict[str, Any] | Any:
    """Build the step with the core's ``build_step`` (the same decision as the plan's, from the
    records now), with its datasets, assets and provenance for Airflow; its XCom, or the
    ``Pending`` build while its remote job runs (the operator defers on it)."""
    from marin.execution.builder.commit import Pending, build_step
    from marin.execution.builder.lineage.names import step_datasets
    from marin.execution.builder.request import BuildRequest
    from marin.execution.pipeline.provenance import engine_run
    from marin_airflow.assets import dag_run_lineage, record_built

    step = spec.step_id
    log.info("marin: step %s: checking %s", step, location.url_for(spec.output_path))
    inputs, output = step_datasets(location, spec)
    _record_datasets(context, inputs.values())
    try:
        # A dependency built earlier in this run is a new build: its dependents rebuild.
        upstream = _upstream(context, spec, location)
        ids = task_instance_ids(context)
        with (
            engine_run("airflow", ids) if ids is not None else contextlib.nullcontext(),
            dag_run_lineage(context),  # the OpenLineage parent: this DAG run
        ):
            request = BuildRequest(spec, location, policy, upstream=upstream, wait=Wait.RETURN_JOB,
                                   awaited_job=awaited_job)  # fmt: skip
            outcome = build_step(request)
    except BaseException as exc:
        log.error("marin: step %s failed: %s: %s", step, type(exc).__name__, exc)
        _announce_failure(context, step)
        _fail_without_retry_if_final(exc)
        raise
    if isinstance(outcome, Pending):  # its job runs: the operator defers (not an end)
        return outcome
    if outcome.action == BuildOutcomeKind.BUILT:  # an asset event and an OpenLineage output
        record_built(context, step, outcome.output_url, outcome.record)
        _record_datasets(context, inputs.values(), output)
    return _step_result(step, spec, outcome)


def _fail_without_retry_if_final(error: BaseException) -> None:
    """An error no retry changes (the core's ``is_final``: a cancelled remote job, an unplaced
    gang) fails the task without Airflow's retries, as the run loop spends none on it.

    Raises:
        AirflowFailException: ``error`` is final (chained to it).
    """
    if is_final(error):
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(f"{error} (not retried: no retry changes it)") from error


def _current_spec(resolved: str, target: str, step: str, fingerprint: str, fix: str) -> Any:
    """The step's spec as the pipeline lowers it now (only it and its ancestors: the whole
    graph is the plan task's job). Raises ``StaleDagError`` when the DAG file no longer
    matches the pipeline: the step is gone, or its fingerprint changed."""
    spec = step_for(resolved, step)
    if spec is None:
        raise StaleDagError(
            f"the DAG file is stale: {target} no longer has a step {step} (renamed, or its "
            "version was bumped)",
            fix,
            step,
        )
    if spec.fingerprint != fingerprint:
        raise StaleDagError(
            f"the DAG file is stale: field fingerprint is {fingerprint} in the DAG file but the "
            f"pipeline now gives {spec.fingerprint} (its config or a dependency changed since "
            "the export)",
            fix,
            step,
        )
    return spec


def _step_result(step: str, spec: Any, outcome: Any) -> dict[str, Any]:
    """Log what the step task did, and return it for XCom."""
    cached = outcome.action != BuildOutcomeKind.BUILT
    where = outcome.output_url
    if outcome.action == BuildOutcomeKind.CACHED:
        log.info(
            "marin: step %s cached: already built at %s (%s); nothing to do",
            step,
            where,
            outcome.reason,
        )
    elif cached:
        log.info("marin: step %s cached: built by another runner at %s", step, where)
    else:
        log.info("marin: step %s built in %.2fs at %s", step, outcome.duration_s, where)
    # One XCom per key (the task has multiple_outputs=True): `cached` and `action` say at a
    # glance in the UI whether this run built the step.
    return {
        XComKey.STEP.value: step,
        XComKey.ACTION.value: outcome.action.value,  # a plain string: XComs are stored as JSON
        "cached": cached,
        "output_url": outcome.output_url,
        "fingerprint": spec.fingerprint,
    }
