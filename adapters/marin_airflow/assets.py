"""Airflow Assets for Marin artifacts: one asset alias per step, filled in at run time.

A step's output URL is known only when a run starts (the ``prefix`` param, ``$MARIN_PREFIX`` on
the worker), so the exported DAG declares an ``AssetAlias`` per step (``marin:<name@version>``)
as the step task's outlet, and its dependencies' aliases as its inlets. When, and only when,
the task builds its step, it adds an asset event for the real ``Asset`` (URI: the artifact's
URL, ``artifact_names``; name: the step id) to its alias. A step found built emits nothing, so a
DAG scheduled on the asset runs after a real rebuild, never after a cache hit.

Imported by every exported DAG file at parse time, and by the task runtime: it imports nothing
at import time (``airflow.sdk`` is loaded by then, or not needed), and makes one alias object
per step however many tasks read it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger("marin.airflow")

ALIAS_PREFIX = "marin:"
_aliases: dict[str, Any] = {}


def alias_name(step_id: str) -> str:
    """The asset alias of a step: ``marin:<name@version>`` (what a consumer DAG may schedule on)."""
    return ALIAS_PREFIX + step_id


def _alias(step_id: str) -> Any:
    alias = _aliases.get(step_id)
    if alias is None:
        from airflow.sdk import AssetAlias  # imported already by the DAG file or the task

        alias = _aliases[step_id] = AssetAlias(name=alias_name(step_id))
    return alias


def task_assets(step: Mapping[str, Any], steps: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``inlets`` and ``outlets`` of a step's task, from the DAG file's ``STEPS`` data."""
    return {
        "outlets": [_alias(step["step"])],
        "inlets": [_alias(steps[u]["step"]) for u in step["upstream"]],
    }


def record_built(context: Any | None, step_id: str, url: str, record: Any) -> None:
    """Add the asset event of a step this task just built (never call it for a cached one)."""
    if context is None:
        return
    events = context.get("outlet_events")
    if events is None:
        return
    from airflow.sdk import Asset

    from marin.execution.builder.lineage.names import names_for_url

    names = names_for_url(url)
    extra = {
        "url": names.url,
        "build_id": record.build_id,
        "fingerprint": record.fingerprint,
    }
    try:
        events[_alias(step_id)].add(Asset(uri=names.asset_uri, name=step_id), extra=extra)
    except (ValueError, TypeError) as exc:
        # The step is committed: an asset Airflow cannot name must not fail its task.
        log.warning("marin: no asset event for %s (%s: %s)", step_id, type(exc).__name__, exc)


@contextlib.contextmanager
def dag_run_lineage(context: Any | None) -> Iterator[None]:
    """Builds in this task are children of the DAG run in OpenLineage (the parent facet)."""
    from marin.execution.builder.lineage import flush, pipeline_run

    if context is None:
        yield
        return
    dag_run = context.get("dag_run")
    dag_id = getattr(dag_run, "dag_id", None) or "airflow"
    run_id = context.get("run_id") or getattr(dag_run, "run_id", None) or ""
    try:
        with pipeline_run(dag_id, f"{dag_id}/{run_id}", runner="airflow"):
            yield
    finally:
        # A task process may end without running exit handlers: send this build's events now
        # (at most MARIN_LINEAGE_FLUSH_S; nothing to wait for when lineage is off).
        flush()
