"""Marin's import path, a real module (not deprecated): the code is in
``marin.execution.pipeline.handles``, ``.pipeline.lower`` and ``marin.execution.run.api``.

The run layer's names (``run``, ``resolve``, ``materialized_config``) are imported on first
use: a pipeline file imports this module in every job process it runs in, and a job never
runs a pipeline (the run layer is a third of this module's import time).
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
from marin.execution.pipeline.lower import lower
from marin.execution.pipeline.sweep import Sweep, grid, point_name, sweep
from marin.execution.pipeline.versions import DEFER, VersionCodex, build_context

if TYPE_CHECKING:
    from marin.execution.run.api import materialized_config, resolve, run

_RUN_API = ("materialized_config", "resolve", "run")

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
    """``run``, ``resolve`` and ``materialized_config``, imported on first use."""
    if name not in _RUN_API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("marin.execution.run.api"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_RUN_API))
