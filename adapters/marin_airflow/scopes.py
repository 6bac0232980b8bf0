"""A DAG run's output scope and user: what the export allows, and what the trigger chose.

The DAG file records the scope it was exported with (``SCOPE``, ``--scope user``; none: shared).
A run's ``scope`` param may only repeat it, as its ``versions`` param may only repeat the
exported codex. A user-scope run writes under ``<prefix>/users/<user>/`` through the core's
``plan.scope`` functions, the ones ``marin run --scope user`` uses. The user is the run's
``user`` param, else the user who triggered the run, else ``$MARIN_USER`` (then the OS user) on
the worker; the plan task resolves it once and its step tasks use that one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marin.execution.errors import InvalidStepError, brief
from marin.execution.pipeline.scope import check_scope
from marin.execution.plan.scope import RunScope
from marin.execution.vocabulary import OutputScope

PLACEHOLDER_USERS = frozenset({"dag_test"})
"""Triggering user names Airflow gives runs nobody triggered (``airflow dags test``)."""
FIX_USER = (
    "trigger the run with a 'user' param (one path segment: letters, digits, '_', '-', '.'; "
    "e.g. alice), or set MARIN_USER on the workers"
)


def exported_scope(exported: str, params: Mapping[str, Any]) -> OutputScope:
    """The run's scope: its ``scope`` param (untrusted) may only be the exported one (unset
    keeps it)."""
    allowed = check_scope(exported, "SCOPE")  # the DAG file is data too
    chosen = params.get("scope")
    if chosen is None or chosen == "":
        return allowed
    if chosen != allowed:
        raise InvalidStepError(
            f"param scope={brief(chosen)}",
            f"this DAG runs in the {allowed} scope only; for another, export it again with "
            "--scope shared or --scope user",
        )
    return allowed


def triggering_user(context: Any | None) -> str | None:
    """Who triggered the DAG run, as Airflow records it (None for a scheduled run)."""
    dag_run = context.get("dag_run") if context is not None else None
    name = getattr(dag_run, "triggering_user_name", None)
    return name if isinstance(name, str) and name not in PLACEHOLDER_USERS else None


def run_scope(exported: str, context: Any | None, planned_user: object = None) -> RunScope:
    """The run's ``RunScope``. ``planned_user``: the user the plan task resolved (its XCom),
    which wins, so every task of a run writes for one user whatever its worker's
    ``$MARIN_USER``."""
    params = (context.get("params") if context is not None else None) or {}
    scope = exported_scope(exported, params)
    user = planned_user if isinstance(planned_user, str) and planned_user else params.get("user")
    return RunScope(scope, user, triggering_user(context), FIX_USER)
