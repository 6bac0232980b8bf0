"""Resumable remote steps at build time: the attempt names its job, and a later attempt fences
that job before it resumes (``pipeline/remote/fence.py`` holds the job-side half).

- ``remote_attempt``: what ``build_step`` hands ``remote_build`` for a resumable attempt
  (whether it resumes, and ``note_job``, which writes the job into ``attempt.json`` as soon as
  the attempt submits or reattaches to one).
- ``fence_previous``: called by ``start_attempt`` when it resumes a remote step. The earlier
  attempt's job is cancelled and confirmed ended, unless ``job.json`` still names it and it
  runs: then the build reattaches to it (a takeover of a running job is a reattach, never a
  second writer; docs/remote.md).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from marin.execution.pipeline.remote.fence import is_this_steps, stop_job
from marin.execution.pipeline.remote.job_record import JobRecord, delete_job, read_job
from marin.execution.pipeline.remote.registry import get_backend
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.store.location import Location
from marin.execution.store.step_folder import Attempt, write_attempt
from marin.execution.vocabulary import JobState

log = logging.getLogger("marin")


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
    for a job of something else).

    Raises:
        UnseenJobError: the job may run where this driver cannot see it (``is_this_steps``):
            nothing is resumed or cleared under it.
    """
    job = previous.job if previous is not None else None
    if job is None or spec.remote is None or job.backend != spec.remote:
        return None
    if not is_this_steps(job, location, spec.output_path, spec.step_id):  # raises if unseen
        log.warning("fence %s: the attempt record names a job not of this step; left alone",
                    spec.step_id)  # fmt: skip
        return None
    return job


def _recorded(location: Location, spec: StepSpec, job: JobRecord) -> bool:
    """Whether ``job.json`` names ``job`` (the build's job, which a takeover reattaches to)."""
    current = read_job(location, spec.output_path)
    return current is not None and (current.job_id, current.build_id) == (job.job_id, job.build_id)
