"""Reading what a flow run left in the Prefect API, for assertions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, TaskRun
from prefect.states import State

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TOY_TARGET = f"{HERE / 'prefect_pipelines.py'}:pipeline"


def flow_run_id(state: State[Any]) -> UUID:
    run_id = state.state_details.flow_run_id
    assert run_id is not None, f"state {state!r} has no flow run id"
    return run_id


def task_runs(run_id: UUID, expected: int, timeout: float = 15.0) -> dict[str, TaskRun]:
    """The flow run's task runs by name, once ``expected`` of them are in their final state.

    Prefect 3 reports task states to the API through events, so the API may trail the flow run's
    end by a moment; wait for it rather than read a half-written picture.
    """
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
            )
            settled = [r for r in runs if r.state is not None and not r.state.is_running()]
            settled = [r for r in settled if r.state and r.state.name != "Pending"]
            if len(settled) >= expected or time.monotonic() > deadline:
                return {r.name: r for r in runs}
            time.sleep(0.2)


def child_flow_runs(parent_id: UUID) -> list[FlowRun]:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])
            )
        )


def read_flow_run(run_id: UUID) -> FlowRun:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)
