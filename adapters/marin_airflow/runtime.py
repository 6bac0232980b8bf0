"""What each task of an exported DAG runs on the Airflow worker.

Importing this module is cheap (the DAG file imports it at parse time): the pipeline, the Marin
core and Airflow's context are only imported inside ``run_step``, when a task actually runs.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

log = logging.getLogger("marin.airflow")

PREFIX_ENV = "MARIN_PREFIX"

_lock = threading.Lock()
_lowered: dict[str, dict[str, Any]] = {}
"""Per process: resolved target -> {step_id: StepSpec}. Airflow may run many tasks per process."""


class StaleDagError(RuntimeError):
    """The DAG file no longer matches the pipeline; the message says how to re-export."""


def _fix(export_command: str, export_root: str, dag_dir: str) -> str:
    command = export_command or "marin export airflow TARGET -o DAGS_FOLDER"
    where = os.path.normpath(os.path.join(dag_dir, export_root))
    return f"re-run `{command}` in {where} and deploy the regenerated DAG file"


def steps_for(target: str) -> dict[str, Any]:
    """Load and lower ``target`` once per process; every transitive step by its id."""
    with _lock:
        cached = _lowered.get(target)
        if cached is not None:
            return cached
        from marin_airflow.export import lower_target

        steps = {spec.step_id: spec for spec in lower_target(target)}
        _lowered[target] = steps
        return steps


_handles: dict[str, list[Any]] = {}
"""Per process: resolved target -> its handles (the pipeline file runs once per process)."""
_memos: dict[str, dict[Any, Any]] = {}
"""Per process: resolved target -> the ``lower`` memo, so each step is lowered at most once."""


def step_for(target: str, step: str) -> Any | None:
    """The ``StepSpec`` of one step, lowering only it and its ancestors; None if absent.

    A task of a 10,000-step DAG builds one step: lowering the whole graph for it (as
    ``steps_for`` does) costs every task O(graph). This walks the handles from the targets to
    the one named ``step`` and lowers just that handle, which lowers its dependencies and
    nothing else. The handles and the lowering memo are kept per process, so several tasks in
    one worker share the work.
    """
    with _lock:
        cached = _lowered.get(target)
        if cached is not None:
            return cached.get(step)
        handles = _handles.get(target)
        if handles is None:
            from marin.execution.targets import load_target

            handles = _handles[target] = list(load_target(target))
        memo = _memos.setdefault(target, {})
    found: Any = None
    stack, seen = list(handles), set()
    while stack:  # iterative: a 100,000-deep chain has no recursion limit to hit
        handle = stack.pop()
        if id(handle) in seen:
            continue
        seen.add(id(handle))
        if handle.step_id == step:
            found = handle
            break
        stack.extend(handle.deps)
    if found is None:
        return None
    from marin.execution.lazy import lower

    with _lock:  # the memo is shared by this process's tasks
        return lower(found, memo=memo)


def clear_cache() -> None:
    with _lock:
        _lowered.clear()
        _handles.clear()
        _memos.clear()


def _airflow_context() -> Any | None:
    if "airflow.sdk" not in sys.modules:  # not inside an Airflow task: don't import Airflow
        return None
    try:
        from airflow.sdk import get_current_context

        return get_current_context()
    except Exception:  # not inside a running Airflow task (e.g. called directly)
        return None


def _dag_dir(context: Any | None) -> str:
    """The folder of the DAG file being run, which relative targets are resolved against."""
    dag = context.get("dag") if context is not None else None
    fileloc = getattr(dag, "fileloc", None)
    if fileloc:
        return os.path.dirname(os.path.abspath(fileloc))
    folder = os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")
    return os.path.abspath(folder) if folder else os.getcwd()


def choose_prefix(param: str | None, default_prefix: str | None) -> str | None:
    """The run's ``prefix`` param, else ``$MARIN_PREFIX``, else the exported default."""
    return param or os.environ.get(PREFIX_ENV) or default_prefix or None


def run_step(
    *,
    target: str,
    step: str,
    fingerprint: str,
    default_prefix: str | None = None,
    export_command: str = "",
    export_root: str = ".",
    graph_digest: str | None = None,
    prefix: str | None = None,
    dag_dir: str | None = None,
    **newer: Any,
) -> dict[str, Any]:
    """Build one Marin step (or find it built) and return what happened, for XCom.

    ``target`` is what the DAG file recorded: a module path, or a file path relative to the DAG
    file's folder. ``fingerprint`` is the one computed at export time; if the pipeline now
    lowers to another fingerprint, the DAG file is stale and the task fails without building.
    """
    from marin.execution.build import build_step
    from marin.execution.storage import open_prefix
    from marin_airflow.export import resolve_target

    if newer:  # a DAG file from a newer exporter than the marin-execution on this worker
        log.warning(
            "marin: ignoring unknown DAG file fields %s; upgrade marin-execution on the workers",
            ", ".join(sorted(newer)),
        )
    context = _airflow_context()
    if prefix is None and context is not None:
        params = context.get("params") or {}
        prefix = params.get("prefix") or None
    dag_dir = dag_dir or _dag_dir(context)
    resolved = resolve_target(target, dag_dir)
    fix = _fix(export_command, export_root, dag_dir)
    steps = steps_for(resolved)
    spec = steps.get(step)
    if spec is None:
        raise StaleDagError(
            f"error: the DAG file is stale (step {step}): {target} no longer has a step "
            f"{step} (renamed, or its version was bumped): {fix}"
        )
    if spec.fingerprint != fingerprint:
        raise StaleDagError(
            f"error: the DAG file is stale (step {step}): field fingerprint is {fingerprint} in "
            f"the DAG file but the pipeline now gives {spec.fingerprint} (its config or a "
            f"dependency changed since the export): {fix}"
        )
    if graph_digest is not None:
        from marin_airflow.export import graph_digest as digest_of

        now = digest_of((s.step_id, s.fingerprint) for s in steps.values())
        if now != graph_digest:
            log.warning(
                "marin: the DAG file is stale: the pipeline's steps changed since the export "
                "(this step is unchanged and runs; others may be missing or outdated): %s",
                fix,
            )
    chosen = choose_prefix(prefix, default_prefix)
    location = open_prefix(chosen)
    if chosen is None:
        log.warning(
            "marin: no prefix param, $MARIN_PREFIX or exported default; using Marin's local "
            "default %s on this worker",
            location.url,
        )
    log.info("marin: step %s: checking %s", step, location.url_for(spec.output_path))
    try:
        outcome = build_step(spec, location, on_drift="warn")
    except BaseException as exc:
        log.error("marin: step %s failed: %s: %s", step, type(exc).__name__, exc)
        raise
    cached = outcome.action != "built"
    if outcome.action == "cached":
        log.info("marin: step %s cached: already built at %s; nothing to do", step, url(outcome))
    elif cached:
        log.info("marin: step %s cached: built by another runner at %s", step, url(outcome))
    else:
        log.info("marin: step %s built in %.2fs at %s", step, outcome.duration_s, url(outcome))
    # One XCom per key (the task has multiple_outputs=True): `cached` and `action` say at a
    # glance in the UI whether this run built the step.
    return {
        "step": step,
        "action": outcome.action,
        "cached": cached,
        "output_url": outcome.output_url,
        "fingerprint": spec.fingerprint,
    }


def url(outcome: Any) -> str:
    return str(outcome.output_url)
