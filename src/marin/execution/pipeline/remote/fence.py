"""Fencing for resumable remote steps (``with_options(remote=..., resumable=True)``).

A resumable remote step keeps its partial output across jobs, so two jobs must never write it
at once. Two fences, one on each side:

- ``JobCheck`` is ``current_context().still_holds_lease()`` inside the job: one read of
  ``job.json``, True while it names the build that submitted this job. The lease itself is not
  asked: a driver that dies lets it expire, and a driver that reattaches holds it under a token
  of its own, while the job rightly goes on (the lease names the job, docs/remote.md). A holder
  that replaces the job (it stopped, or was lost) first removes the record, so a displaced job
  that still runs says False before the new one starts.
- ``stop_job``: before a new job resumes what an earlier one left, that job is cancelled with
  its backend's ``cancel`` and confirmed ended with ``status``; a job that still runs after
  ``STOP_WAIT_S`` stops the build (nothing is resumed over a live writer).

Only a job ``is_this_steps`` is ever cancelled: its id in Marin's form and, on the ``local``
backend, its folder this step's own metadata folder (records are untrusted data).
"""

from __future__ import annotations

import logging
import time

from marin.execution.errors import RemoteJobError
from marin.execution.pipeline.remote.job_record import JOB_ID, JobRecord, read_job
from marin.execution.pipeline.remote.protocol import RemoteBackend
from marin.execution.store.location import Location
from marin.execution.store.records import metadata_dir
from marin.execution.vocabulary import JobState

log = logging.getLogger("marin")

STOP_WAIT_S = 30.0


def is_this_steps(job: JobRecord, location: Location, output_path: str) -> bool:
    """Whether an (untrusted) job record is one Marin's submit writes for this step: its id in
    Marin's form, its ``workdir`` this step's metadata folder (or none)."""
    workdir = job.data.get("workdir")
    expected = location.path(metadata_dir(output_path))
    return bool(JOB_ID.fullmatch(job.job_id)) and workdir in (None, expected)


class JobCheck:
    """``still_holds_lease()`` in a resumable step's job: ``job.json`` still names its build.

    It pickles (a location, a path and a build id), so the job asks storage itself. A read
    that fails says False: a checkpoint is never published on a guess.
    """

    def __init__(self, location: Location, output_path: str, build_id: str) -> None:
        self.location = location
        self.output_path = output_path
        self.build_id = build_id

    def __call__(self) -> bool:
        try:
            job = read_job(self.location, self.output_path)
        except OSError:
            return False
        return job is not None and job.build_id == self.build_id


def stop_job(backend: RemoteBackend, job: JobRecord, step_id: str) -> None:
    """Cancel ``job`` and wait until its backend says it ended; raise if it still runs.

    A job that ended with an outcome (succeeded, failed) is left as it is; a stopped or lost
    one is cancelled too (idempotent), as its state may only mean the backend lost track of it.
    """
    state = backend.status(job.handle).state
    if state in (JobState.SUCCEEDED, JobState.FAILED):
        return
    if state == JobState.RUNNING:
        log.info("fence %s: cancel %s job %s before resuming", step_id, job.backend, job.job_id)
    backend.cancel(job.handle)
    deadline = time.monotonic() + STOP_WAIT_S
    delay = 0.01
    while backend.status(job.handle).state == JobState.RUNNING:
        if time.monotonic() > deadline:
            raise RemoteJobError(
                f"{job.backend} job {job.job_id} still runs {STOP_WAIT_S:g}s after it was "
                "cancelled; its partial output is not resumed while it may write",
                f"stop the job in {job.backend}, then run again",
                step_id,
            )
        time.sleep(delay)  # polling the backend: it offers no event to wait on
        delay = min(delay * 2, 1.0)
