"""Fencing for resumable remote steps (``with_options(remote=..., resumable=True)``).

A resumable remote step keeps its partial output across jobs, so two jobs must never write it
at once. The fences, on both sides:

- ``JobCheck`` is ``current_context().still_holds_lease()`` inside the job: one read of
  ``job.json``, True while it names the build that submitted this job. The lease itself is not
  asked: a driver that dies lets it expire, and a driver that reattaches holds it under a token
  of its own, while the job rightly goes on (the lease names the job, docs/remote.md). A holder
  that replaces the job (it stopped, or was lost) first removes the record, so a displaced job
  that still runs says False before the new one starts.
- ``stop_job``: before a new job resumes what an earlier one left, that job is cancelled with
  its backend's ``cancel`` and confirmed ended with ``status``; a job that still runs after
  ``STOP_WAIT_S`` stops the build (nothing is resumed over a live writer).
- At build time (``builder/attempt.py``): ``remote_attempt`` makes the attempt name its job in
  ``attempt.json`` as soon as it submits or reattaches (``note_job``); ``fence_previous``
  stops an earlier attempt's job before a resume, unless ``job.json`` still names it and it
  runs (a takeover of a running job is a reattach, never a second writer); ``fence_cleared``
  stops it, and forgets it, before its partial output is cleared instead.

Only a job ``is_this_steps`` is ever cancelled: its id in Marin's form, and its backend vouching
that it was submitted for this step's build (records are untrusted data).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

from marin.execution.errors import InvalidStepError, RemoteJobError
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.remote.protocol import RemoteBackend, job_owner
from marin.execution.remote.registry import get_backend
from marin.execution.store.location import Location
from marin.execution.store.step_folder import (
    JOB_ID,
    Attempt,
    JobRecord,
    delete_job,
    read_job,
    write_attempt,
)
from marin.execution.vocabulary import JobState

log = logging.getLogger("marin")

STOP_WAIT_S = 30.0


def is_this_steps(job: JobRecord, location: Location, output_path: str) -> bool:
    """Whether an (untrusted) job record names a job of this step's build: its id in Marin's
    form, and its backend vouching that the job was submitted for this step's output and the
    record's build (``owner``, kept where only the submitter writes; a job the backend does
    not know has nothing left to touch). A record of a backend not registered (or not
    installed) here is not.

    Raises:
        Exception: what the backend raises when it cannot be asked (an outage is never
            taken for "not ours", which would clear a running job's output).
    """
    if not JOB_ID.fullmatch(job.job_id):
        return False
    try:
        found = get_backend(job.backend).owner(job.handle)
    except (InvalidStepError, ImportError):  # a backend this machine cannot reach: not ours
        return False
    return found is None or found == job_owner(location.path(output_path), job.build_id)


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


def stop_job(
    backend: RemoteBackend, job: JobRecord, step_id: str, why: str = "fence %s: cancel %s job %s"
) -> None:
    """Cancel ``job`` and wait until its backend says it ended; raise if it still runs.

    A job that ended with an outcome (succeeded, failed) is left as it is; a stopped or lost
    one is cancelled too (idempotent), as its state may only mean the backend lost track of it.
    ``why``: the log line of a running job's cancel (step id, backend, job id).
    """
    state = backend.status(job.handle).state
    if state in (JobState.SUCCEEDED, JobState.FAILED):
        return
    if state == JobState.RUNNING:
        log.info(why, step_id, job.backend, job.job_id)
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


def remote_attempt(location: Location, spec: StepSpec, attempt: Attempt | None) -> dict[str, Any]:
    """``remote_build``'s keywords for a resumable step's attempt (none for other steps)."""
    if attempt is None or spec.remote is None:
        return {}
    on_job = functools.partial(note_job, location, spec, attempt)
    return {"resumed": attempt.resumed, "on_job": on_job}


def note_job(location: Location, spec: StepSpec, attempt: Attempt, job: JobRecord) -> None:
    """Write the attempt's job into ``attempt.json`` (before the wait: a driver may die)."""
    write_attempt(location, spec.output_path, dataclasses.replace(attempt, job=job))


def fence_previous(location: Location, spec: StepSpec, previous: Attempt | None) -> None:
    """Before a remote step resumes ``previous``'s partial output: its job has ended.

    Only a job of this step is touched (``is_this_steps``, on the step's own backend). A job
    that ``job.json`` names as this very build's and that runs is left to be reattached.
    Raises ``RemoteJobError`` when a cancelled job does not end.
    """
    job = _this_steps_job(location, spec, previous)
    if job is None:
        return
    backend = get_backend(str(spec.remote), spec.step_id)
    if _recorded(location, spec, job) and backend.status(job.handle).state == JobState.RUNNING:
        return  # the build's job runs on: reattached, nothing is resumed under it
    stop_job(backend, job, spec.step_id)


def fence_cleared(location: Location, spec: StepSpec, previous: Attempt | None) -> None:
    """Before a remote step's partial output is cleared instead of resumed (another config, or
    other code under ``--on-code-drift rebuild``): the job that wrote it is cancelled and
    confirmed ended, and ``job.json`` forgets it, so this attempt submits a job of its own
    rather than reattaching to one whose output is gone.
    Raises ``RemoteJobError`` when a cancelled job does not end."""
    job = _this_steps_job(location, spec, previous)
    if job is None:
        return
    stop_job(get_backend(str(spec.remote), spec.step_id), job, spec.step_id)
    if _recorded(location, spec, job):
        delete_job(location, spec.output_path)


def _this_steps_job(
    location: Location, spec: StepSpec, previous: Attempt | None
) -> JobRecord | None:
    """The job ``previous`` ran in, if it is provably this step's (else None, with a warning
    for a job of something else)."""
    job = previous.job if previous is not None else None
    if job is None or spec.remote is None or job.backend != spec.remote:
        return None
    if not is_this_steps(job, location, spec.output_path):
        log.warning("fence %s: the attempt record names a job not of this step; left alone",
                    spec.step_id)  # fmt: skip
        return None
    return job


def _recorded(location: Location, spec: StepSpec, job: JobRecord) -> bool:
    """Whether ``job.json`` names ``job`` (the build's job, which a takeover reattaches to)."""
    current = read_job(location, spec.output_path)
    return current is not None and (current.job_id, current.build_id) == (job.job_id, job.build_id)
