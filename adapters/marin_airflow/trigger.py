"""The Airflow trigger a remote step's task defers to (docs/remote.md).

A ``MarinOperator`` task whose step's job is running gives its worker slot back: it defers to
``RemoteJobTrigger``, which ``airflow triggerer`` runs; the trigger polls the job through its
backend (bounded backoff, in a thread: a backend's client blocks) and fires once the job has
ended, whatever its state. The task then resumes and builds the step again through
``build_step``, which finds the job in ``job.json`` and collects it (or, if it failed, fails the
step naming it). The trigger holds only plain data (``serialize``), and never commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from marin.execution.remote.poller import poll_max_s

SETTLE_S = 5.0
"""The first look waits this long: Airflow 3.3's scheduler fails a resumed task whose trigger
fired before it processed the deferral's own exit (apache/airflow#71580, #72716)."""
FIRST_DELAY_S = 0.5
MAX_DELAY_S = poll_max_s(30.0)


class RemoteJobTrigger(BaseTrigger):
    """Fires when a remote step's job is no longer running."""

    def __init__(
        self, backend: str, job_id: str, data: dict[str, str], max_delay_s: float = MAX_DELAY_S
    ) -> None:
        super().__init__()
        self.backend = backend
        self.job_id = job_id
        self.data = dict(data)
        self.max_delay_s = max_delay_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "marin_airflow.trigger.RemoteJobTrigger",
            {
                "backend": self.backend,
                "job_id": self.job_id,
                "data": self.data,
                "max_delay_s": self.max_delay_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from marin.execution.remote.protocol import JobHandle
        from marin.execution.remote.registry import get_backend
        from marin.execution.vocabulary import JobState

        backend = get_backend(self.backend)
        handle = JobHandle(self.backend, self.job_id, self.data)
        delay = FIRST_DELAY_S
        await asyncio.sleep(SETTLE_S)
        while True:
            try:
                state = (await asyncio.to_thread(backend.status, handle)).state
            except Exception as exc:  # an outage: keep polling, say so
                self.log.warning("could not ask about job %s: %s", self.job_id, exc)
                state = JobState.RUNNING
            if state != JobState.RUNNING:
                yield TriggerEvent({"job_id": self.job_id, "state": str(state)})
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_delay_s)
