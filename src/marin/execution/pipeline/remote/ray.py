"""The ``ray`` backend: a remote step's job goes through Ray's Jobs API (the ``[ray]`` extra).

The cluster's address comes from ``RAY_ADDRESS`` (the dashboard's ``http://host:port``). The
submission id is the build's idempotency key, so Ray itself refuses a second submission of one
build. The call travels base64-encoded in the job's environment; the job runs
``isolated_child`` and prints its outcome between markers, which ``status`` reads back from the
job's logs. The pipeline's modules must be importable on the cluster (on one machine: the same
environment). Promises: at most one job per key; ``cancel`` is Ray's ``stop_job``.
"""

from __future__ import annotations

import base64
import contextlib
import os
from typing import Any

from marin.execution.pipeline.remote.protocol import JobHandle, JobSpec, JobStatus
from marin.execution.vocabulary import JobState

ADDRESS_ENV = "RAY_ADDRESS"
BEGIN, END = "<<<marin-outcome>>>", "<<<end-marin-outcome>>>"
_ENTRY = "python -m marin.execution.pipeline.remote.ray_entry"


class RayBackend:
    """Ray's Jobs API; see the module docstring."""

    name = "ray"

    def _client(self) -> Any:
        """The client of the cluster at ``$RAY_ADDRESS`` (never an address read from
        ``job.json``, which is untrusted: a job's result is unpickled)."""
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise ImportError(
                "remote='ray' needs Ray's job client: pip install 'marin-execution[ray]'"
            ) from exc
        return JobSubmissionClient(os.environ.get(ADDRESS_ENV))

    def submit(self, job: JobSpec, idempotency_key: str) -> JobHandle:
        handle = JobHandle(self.name, idempotency_key, {})
        env = {**job.env, "MARIN_CALL": base64.b64encode(job.call).decode()}
        try:
            self._client().submit_job(
                entrypoint=_ENTRY, submission_id=idempotency_key, runtime_env={"env_vars": env}
            )
        except RuntimeError as exc:  # Ray refuses a submission id it has seen: that job is ours
            if self.status(handle).state == JobState.LOST:
                raise exc
        return handle

    def status(self, handle: JobHandle) -> JobStatus:
        client = self._client()
        try:
            state = str(client.get_job_status(handle.job_id))
        except RuntimeError:
            return JobStatus(JobState.LOST, detail="Ray does not know it")
        if state.endswith(("PENDING", "RUNNING")):
            return JobStatus(JobState.RUNNING)
        if state.endswith("STOPPED"):
            return JobStatus(JobState.STOPPED, detail="stopped in Ray")
        logs = client.get_job_logs(handle.job_id)
        begin, end = logs.rfind(BEGIN), logs.rfind(END)
        if begin >= 0 and end > begin:
            data = base64.b64decode(logs[begin + len(BEGIN) : end].strip())
            return JobStatus(JobState.SUCCEEDED, result=data)
        return JobStatus(JobState.FAILED, detail=f"Ray job {state.rsplit('.', 1)[-1]}")

    def logs(self, handle: JobHandle, tail: int = 40) -> str:
        try:
            text = str(self._client().get_job_logs(handle.job_id))
        except RuntimeError:
            return ""
        cut = text.find(BEGIN)
        return "\n".join((text if cut < 0 else text[:cut]).splitlines()[-tail:])

    def cancel(self, handle: JobHandle) -> None:
        with contextlib.suppress(RuntimeError):  # ended or unknown: nothing of it runs
            self._client().stop_job(handle.job_id)
