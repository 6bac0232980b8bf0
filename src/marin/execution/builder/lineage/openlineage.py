"""``BuildEvent`` and ``PipelineEvent`` -> an OpenLineage ``RunEvent``, through the official
client's types.

Imported only by the lineage sender's thread (``lineage.py``), and only once lineage is
configured: nothing here runs, and openlineage is not imported, on a build's own thread.
"""

from __future__ import annotations

import uuid
from typing import Any

import attr
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    JobFacet,
    RunFacet,
    error_message_run,
    job_type_job,
    parent_run,
)

from marin.execution.builder.lineage.model import BuildEvent, PipelineEvent, StepDataset

PRODUCER = "https://github.com/marin-community/marin/tree/main/marin-execution"
FACET_SCHEMA = "https://github.com/marin-community/marin/tree/main/marin-execution/docs/lineage.md"
_STATES = {
    "START": RunState.START,
    "COMPLETE": RunState.COMPLETE,
    "FAIL": RunState.FAIL,
    "ABORT": RunState.ABORT,
}


@attr.define
class MarinRunFacet(RunFacet):
    """Marin's own facts about a build: ``run.facets.marin`` (see docs/lineage.md)."""

    step: str
    version: str
    fingerprint: str
    artifactType: str
    inputBuildIds: dict[str, str | None]
    host: str
    runner: str
    durationSeconds: float | None = None
    remoteJob: dict[str, str] | None = None
    """A remote step's job that ran ``fn`` (``backend``, ``jobId``), on ``COMPLETE``."""

    @staticmethod
    def _get_schema() -> str:
        return FACET_SCHEMA + "#marinrunfacet"


@attr.define
class MarinJobFacet(JobFacet):
    """The step a job is: ``job.facets.marinStep``."""

    step: str
    version: str

    @staticmethod
    def _get_schema() -> str:
        return FACET_SCHEMA + "#marinjobfacet"


@attr.define
class MarinPipelineRunFacet(RunFacet):
    """Marin's own facts about a pipeline run: ``run.facets.marinPipeline``."""

    runner: str
    host: str
    stepsToBuild: int

    @staticmethod
    def _get_schema() -> str:
        return FACET_SCHEMA + "#marinpipelinerunfacet"


def make_client() -> OpenLineageClient:
    """The client, configured the standard way (openlineage.yml, OPENLINEAGE_* variables),
    its HTTP transports reading no response body (``lineage_http``)."""
    from marin.execution.builder.lineage.http import bound_http_transports

    client = OpenLineageClient()
    bound_http_transports(client.transport)
    return client


def _run_id(build_id: str) -> str:
    """The build id (32 hex digits) in the UUID form OpenLineage's ``runId`` requires."""
    return str(uuid.UUID(build_id))


def _dataset(cls: Any, data: StepDataset) -> Any:
    return cls(namespace=data.namespace, name=data.name)


def to_run_event(event: BuildEvent | PipelineEvent) -> RunEvent:
    if isinstance(event, PipelineEvent):
        return _pipeline_run_event(event)
    run_facets: dict[str, RunFacet] = {
        "parent": parent_run.ParentRunFacet(
            run=parent_run.Run(runId=event.parent.run_id),
            job=parent_run.Job(namespace=event.job_namespace, name=event.parent.name),
        ),
        "marin": MarinRunFacet(
            step=event.step_id,
            version=event.version,
            fingerprint=event.fingerprint,
            artifactType=event.artifact_type,
            inputBuildIds={d.step_id: d.build_id for d in event.inputs},
            host=event.host,
            runner=event.parent.runner,
            durationSeconds=event.extra.get("duration_s"),
            remoteJob=event.extra.get("job"),
        ),
    }
    _add_error(run_facets, event.error)
    job_facets: dict[str, JobFacet] = {
        "jobType": job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="MARIN", jobType="STEP"
        ),
        "marinStep": MarinJobFacet(step=event.step_id, version=event.version),
    }
    return RunEvent(
        eventType=_STATES[event.state],
        eventTime=event.time,
        run=Run(runId=_run_id(event.build_id), facets=run_facets),
        job=Job(namespace=event.job_namespace, name=event.step_id, facets=job_facets),
        producer=PRODUCER,
        inputs=[_dataset(InputDataset, d) for d in event.inputs],
        outputs=[_dataset(OutputDataset, event.output)],
    )


def _add_error(run_facets: dict[str, RunFacet], error: str | None) -> None:
    """A failed run's message, as OpenLineage's standard ``errorMessage`` facet."""
    if error is not None:
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=error, programmingLanguage="python"
        )


def _pipeline_run_event(event: PipelineEvent) -> RunEvent:
    """The pipeline run's own event: the job every step run names in its ``parent`` facet
    (same namespace, name and run id), with no datasets of its own (its steps carry them)."""
    run_facets: dict[str, RunFacet] = {
        "marinPipeline": MarinPipelineRunFacet(
            runner=event.pipeline.runner, host=event.host, stepsToBuild=event.steps
        )
    }
    _add_error(run_facets, event.error)
    job_facets: dict[str, JobFacet] = {
        "jobType": job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="MARIN", jobType="PIPELINE"
        ),
    }
    return RunEvent(
        eventType=_STATES[event.state],
        eventTime=event.time,
        run=Run(runId=event.pipeline.run_id, facets=run_facets),
        job=Job(namespace=event.job_namespace, name=event.pipeline.name, facets=job_facets),
        producer=PRODUCER,
        inputs=[],
        outputs=[],
    )
