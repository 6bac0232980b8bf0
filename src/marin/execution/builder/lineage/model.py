"""The values lineage passes around: a pipeline run, a build's datasets and the events the
sender thread turns into OpenLineage ``RunEvent``s (plain data: no client types, so that a
build's thread never imports openlineage). Below ``lineage``, ``lineage_sender`` and
``lineage_events``, which all read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class PipelineRun:
    """The pipeline run a step run belongs to: the OpenLineage parent job and run."""

    name: str
    """The parent job's name: the pipeline target, the Airflow DAG id, the Prefect flow name."""
    run_id: str
    """A UUID (any form ``uuid.UUID`` reads)."""
    runner: str
    """``local``, ``prefect``, ``airflow`` or ``library``."""


@dataclass(frozen=True, slots=True)
class StepDataset:
    """One input or output of a build, as OpenLineage names it (``artifact_names``)."""

    namespace: str
    name: str
    step_id: str
    build_id: str | None = None


@dataclass(frozen=True)
class BuildEvent:
    """What the sender thread turns into one OpenLineage ``RunEvent`` (no client types here,
    so that the build thread never imports openlineage)."""

    state: str
    time: str
    job_namespace: str
    step_id: str
    build_id: str
    fingerprint: str
    version: str
    artifact_type: str
    inputs: tuple[StepDataset, ...]
    output: StepDataset
    parent: PipelineRun
    host: str
    error: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineEvent:
    """One event of a pipeline run itself (the parent job of its step runs), for the sender
    thread to turn into a ``RunEvent``: START when its run loop starts, then one of COMPLETE,
    FAIL or ABORT when the loop ends."""

    state: str
    time: str
    job_namespace: str
    pipeline: PipelineRun
    host: str
    steps: int
    """The steps the run set out to build (its plan's ``to_build``)."""
    error: str | None = None
