"""Marin's import path, a real module (not deprecated): the code is in
``marin.execution.pipeline.handles`` and ``marin.execution.run.api``.
"""

from marin.execution.pipeline.handles import (
    OUT,
    ArtifactStep,
    StepContext,
    apply,
    current_context,
    lower,
    register_fingerprint,
)
from marin.execution.pipeline.versions import DEFER, VersionCodex, build_context
from marin.execution.run.api import materialized_config, resolve, run

__all__ = [
    "DEFER",
    "OUT",
    "ArtifactStep",
    "StepContext",
    "VersionCodex",
    "apply",
    "build_context",
    "current_context",
    "lower",
    "materialized_config",
    "register_fingerprint",
    "resolve",
    "run",
]
