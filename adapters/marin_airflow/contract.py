"""What an exported DAG file and the tasks it runs agree on; no Airflow import, no code generation.

The exporter (``marin_airflow.export``) writes these into the DAG file; the task runtime
(``marin_airflow.runtime``) reads them back on a worker, which so never imports the exporter.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from enum import StrEnum

from marin.execution.pipeline.targets import Target

PLAN_TASK_ID = "marin-plan"
"""The first task of every exported DAG (a step's task id always holds ``__``, so never this)."""


class XComKey(StrEnum):
    """The XCom keys Marin's tasks push, besides the plan's ``Action`` lists (build, skip, prune).

    Airflow stores them as plain strings: push ``key.value``.
    """

    STEP = "step"
    """A step task's step id."""
    ACTION = "action"
    """What a step task did (a ``BuildOutcomeKind`` or ``RunResult`` value)."""
    STALE = "stale"
    """The plan task's stale steps: their fingerprint in the DAG file is not the pipeline's."""
    ON_DRIFT = "on_drift"
    ON_CODE_DRIFT = "on_code_drift"
    FORCE = "force"
    CASCADE = "cascade"
    """The policy the plan task used (a step task follows it, not its own params)."""
    USER = "user"
    """The plan task's run user (a user-scope run): every step task writes for that user."""
    FAILED = "marin_failed"
    """Pushed by a step's task as its step fails, before Airflow records the task's state."""


def graph_digest(steps: Iterable[tuple[str, str]]) -> str:
    """A short, order-independent hash of ``(step_id, fingerprint)`` pairs."""
    lines = sorted(f"{sid}\x00{fp}" for sid, fp in steps)
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def target_reference(target: str, dag_dir: str) -> str:
    """What the DAG file records: a module path as is, a file path relative to ``dag_dir``.

    Never absolute, so the file is the same on every machine and in every checkout.
    """
    parsed = Target.parse(target)
    if not parsed.is_file:
        return target
    rel = os.path.relpath(os.path.abspath(parsed.location), os.path.abspath(dag_dir))
    return str(parsed.with_location(rel.replace(os.sep, "/")))


def resolve_target(reference: str, dag_dir: str) -> str:
    """The inverse of ``target_reference``, on the machine that runs the task."""
    parsed = Target.parse(reference)
    if not parsed.is_file or os.path.isabs(parsed.location):
        return reference
    path = os.path.normpath(os.path.join(dag_dir, parsed.location.replace("/", os.sep)))
    return str(parsed.with_location(path))
