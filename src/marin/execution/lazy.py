"""Marin's import path, a real module (not deprecated): the code is in
``marin.execution.pipeline.handles``, ``.pipeline.lower`` and ``marin.execution.run.api``.
"""

from marin.execution.pipeline.artifact import (
    Artifact,
    Checkpoint,
    Dataset,
    JsonArtifact,
    read_artifact,
    write_artifact,
)
from marin.execution.pipeline.handles import (
    OUT,
    ArtifactStep,
    StepContext,
    adopt,
    apply,
    current_context,
    register_fingerprint,
)
from marin.execution.pipeline.lower import lower
from marin.execution.pipeline.sweep import Sweep, grid, point_name, sweep
from marin.execution.pipeline.versions import DEFER, VersionCodex, build_context
from marin.execution.run.api import materialized_config, resolve, run

__all__ = [
    "DEFER",
    "OUT",
    "Artifact",
    "ArtifactStep",
    "Checkpoint",
    "Dataset",
    "JsonArtifact",
    "StepContext",
    "Sweep",
    "VersionCodex",
    "adopt",
    "apply",
    "build_context",
    "current_context",
    "grid",
    "lower",
    "materialized_config",
    "point_name",
    "read_artifact",
    "register_fingerprint",
    "resolve",
    "run",
    "sweep",
    "write_artifact",
]
