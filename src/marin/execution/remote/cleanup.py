"""Removing a finished job's files (its payload, pid, log and result; issue 45).

A backend that keeps files per job (the ``local`` backend's folder) may offer ``release``
(optional, beside the protocol's four methods): forget a job that has ended. The core calls it
once the job's build is committed, or its failure is known (after its log tail was copied into
the step's ``log.txt``), and only for the job ``job.json`` names **now** (same job id, same
build id), so a folder of a job that another holder submitted since is never touched. Cleanup
is advisory: it never fails a build; what it cannot remove stays, logged.
"""

from __future__ import annotations

import logging
from typing import Any

from marin.execution.remote.registry import get_backend
from marin.execution.store.location import Location
from marin.execution.store.step_folder import JOB_ID, JobRecord, delete_job, load_job

log = logging.getLogger("marin")


def release_job(location: Location, output_path: str, job: JobRecord) -> None:
    """Remove ``job``'s files if ``job.json`` still names it; or, when called after the record
    was removed (a failure), if nothing names another job. Never raises."""
    try:
        now = load_job(location, output_path)
        if now is not None and not isinstance(now, JobRecord):
            return  # a record that cannot be read may name another job: left alone
        if now is not None and (now.job_id, now.build_id) != (job.job_id, job.build_id):
            return  # another job of this step is recorded: not ours to touch
        if not JOB_ID.fullmatch(job.job_id):  # not an id Marin gives: never followed
            return
        release = getattr(get_backend(job.backend), "release", None)
        if callable(release):
            release(job.handle)
    except Exception as exc:  # advisory: the build's outcome stands
        log.warning("could not remove the files of %s job %s: %s", job.backend, job.job_id, exc)


def release_committed(build: Any) -> None:
    """After a remote step's record is committed: its job's files go (``build_step`` passes
    its ``RemoteBuild``, or None for a step that is not remote)."""
    if build is not None and build.job is not None:
        release_job(build.location, build.output_path, build.job)


def forget_failed(location: Location, output_path: str, job: JobRecord) -> None:
    """A failed job (its log tail already in the step's log): its record goes, so a retry
    submits anew, and then its files."""
    delete_job(location, output_path)
    release_job(location, output_path, job)
