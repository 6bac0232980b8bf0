"""Marin's import path, a real module (not deprecated): the code is in
``marin.execution.pipeline.handles``, ``.pipeline.lower`` and ``marin.execution.run.api``.

``lower`` and the run layer's names (``run``, ``resolve``, ``materialized_config``) are
imported on first use: a pipeline file imports this module in every job process it runs in, and
a job never lowers or runs a pipeline (they bring the code digest, the store and fsspec: most of
this module's import time).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
from marin.execution.pipeline.sweep import Sweep, grid, point_name, sweep
from marin.execution.pipeline.versions import DEFER, VersionCodex, build_context

if TYPE_CHECKING:
    from marin.execution.pipeline.lower import lower
    from marin.execution.run.api import materialized_config, resolve, run

_ON_FIRST_USE = {
    "lower": "marin.execution.pipeline.lower",
    "materialized_config": "marin.execution.run.api",
    "resolve": "marin.execution.run.api",
    "run": "marin.execution.run.api",
}

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


def __getattr__(name: str) -> Any:
    """``lower``, ``run``, ``resolve`` and ``materialized_config``, imported on first use."""
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_FIRST_USE))
