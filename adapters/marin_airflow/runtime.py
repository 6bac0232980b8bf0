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


def clear_cache() -> None:
    with _lock:
        _lowered.clear()


def _airflow_context() -> Any | None:
    if "airflow.sdk" not in sys.modules:  # not inside an Airflow task: don't import Airflow
        return None
    try:
        from airflow.sdk import get_current_context

        return get_current_context()
    except Exception:  # not inside a running Airflow task (e.g. called directly)
        return None


FAILED_XCOM_KEY = "marin_failed"
"""Pushed by a step's task the moment its step fails, before Airflow records the task's state."""


def failed_task_in_run(context: Any | None) -> str | None:
    """Fail-fast, as ``marin run`` does it: a task of this DAG run whose step failed, if any.

    Unless the run's ``keep_going`` param is true, a step does not start once another step of the
    run has failed; it ends skipped, and Airflow's default trigger rule skips its dependents.
    Steps already running finish (Airflow's own DAG ``fail_fast`` would kill them instead).

    A failed task's state reaches the database only after its process has wound down, so the
    tasks still "running" are also asked for the XCom a failing step pushes at once. Only those
    (at most ``max_active_tasks``) are asked, so a task start costs O(concurrency) calls.
    """
    if context is None:
        return None
    params = context.get("params") or {}
    ti = context.get("ti")
    if params.get("keep_going") or ti is None or not hasattr(ti, "get_task_states"):
        return None
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id) or {}
    failed = sorted(task_id for task_id, state in states.items() if state == "failed")
    if failed:
        return failed[0]
    running = sorted(t for t, state in states.items() if state == "running" and t != ti.task_id)
    for task_id in running:
        if ti.xcom_pull(task_ids=task_id, key=FAILED_XCOM_KEY):
            return task_id
    return None


def _announce_failure(context: Any | None, step: str) -> None:
    """Tell the run's other tasks at once that this step failed (see ``failed_task_in_run``)."""
    ti = context.get("ti") if context is not None else None
    if ti is None or not hasattr(ti, "xcom_push"):
        return
    try:
        ti.xcom_push(key=FAILED_XCOM_KEY, value=step)
    except Exception as exc:  # the failure itself is what the task reports
        log.warning("marin: could not announce the failure of %s: %s", step, exc)


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
    stopped_by = failed_task_in_run(context)
    if stopped_by is not None:
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(
            f"not started: the pipeline stopped after {stopped_by} failed (fail-fast; trigger "
            "the run with keep_going=true to build independent branches)"
        )
    log.info("marin: step %s: checking %s", step, location.url_for(spec.output_path))
    try:
        outcome = build_step(spec, location, on_drift="warn")
    except BaseException as exc:
        log.error("marin: step %s failed: %s: %s", step, type(exc).__name__, exc)
        _announce_failure(context, step)
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
