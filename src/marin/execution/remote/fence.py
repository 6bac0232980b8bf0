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
  stops it, and forgets it, before its partial output is cleared instead; ``fence_recorded``
  does the same for the job ``job.json`` records when a build must not reuse it
  (``job_not_reused``), and ``fence_local_build`` before a step that runs here now.

Only a job ``is_this_steps`` is ever cancelled: its id in Marin's form, and its backend vouching
that it was submitted for this step's build (records are untrusted data).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from marin.execution.errors import InvalidStepError, RemoteJobError
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.remote.protocol import RemoteBackend, parse_owner
from marin.execution.remote.registry import get_backend
from marin.execution.store.location import Location
from marin.execution.store.records import GC_WAS_DELETING, gc_was_deleting
from marin.execution.store.step_folder import (
    JOB_ID,
    Attempt,
    JobRecord,
    UnreadableJob,
    delete_job,
    job_path,
    load_job,
    read_job,
    write_attempt,
)
from marin.execution.vocabulary import JobState

log = logging.getLogger("marin")

STOP_WAIT_S = 30.0


class UnseenJobError(RemoteJobError):
    """``job.json`` names a job that may run, but this driver cannot judge it: submitted where
    its backend here cannot see it (another host, user or jobs root), on a backend not
    available here, or for another build of this very output (the file was edited). Nothing is
    cleared, cancelled or submitted beside it: the build stops, and ``plan``, ``gc`` and
    ``unlock`` say so."""

    why: str = ""
    """Why this driver cannot judge the job (one line, for ``plan``, ``gc`` and ``unlock``)."""


def is_this_steps(
    job: JobRecord, location: Location, output_path: str, step_id: str | None = None
) -> bool:
    """Whether an (untrusted) job record names a job of this step's build: its id in Marin's
    form, and its backend vouching that the job was submitted for this step's output (the same
    placement below the same real prefix: a prefix reached through a link is one prefix) and
    the record's build (``owner``, kept where only the submitter writes). A job its backend
    does not know, asked where it was submitted (``scope``), has nothing left to touch: True.

    Raises:
        UnseenJobError: the job may run, but not where this driver can see or judge it (see
            the class); the error names the file, the job, and where to check and stop it.
        Exception: what the backend raises when it cannot be asked (an outage is never
            taken for "not ours", which would clear a running job's output).
    """
    if not JOB_ID.fullmatch(job.job_id):
        return False
    try:
        backend = get_backend(job.backend)
        found = backend.owner(job.handle)
    except (InvalidStepError, ImportError) as exc:  # a backend this machine cannot reach
        why = f"its backend is not available here ({getattr(exc, 'what', exc)})"
        raise _unseen(job, location, output_path, why, step_id) from None
    if found is None:
        elsewhere = _elsewhere(backend, job)
        if elsewhere:
            raise _unseen(job, location, output_path, elsewhere, step_id)
        return True  # gone: asked where it ran, nothing of it runs or remains
    owner = parse_owner(found)
    if owner is None or not same_output(owner[0], location, output_path):
        return False  # a job of another output: it never writes this one
    if owner[1] != job.build_id:
        why = (
            f"it writes this output for build {owner[1]}, but the file names build "
            f"{job.build_id} (edited or copied by hand)"
        )
        raise _unseen(job, location, output_path, why, step_id)
    return True


def same_output(output: str, location: Location, output_path: str) -> bool:
    """Whether ``output`` (a job owner's, as its submitter spelled it) is this step's output:
    the same path, or (on local disk) the same placement below the same real prefix folder,
    however the prefix was spelled (a link to it, its real path). Only the prefix is resolved:
    a link below it never makes two outputs one."""
    ours = location.path(output_path)
    if output == ours:
        return True
    tail = "/" + output_path
    if not (location.is_local and output.startswith("/") and output.endswith(tail)):
        return False
    return os.path.realpath(output[: -len(tail)]) == os.path.realpath(location.root)


def unrecorded_writer(
    backend: RemoteBackend, location: Location, output_path: str, recorded: str
) -> tuple[str, str] | None:
    """A running job of ``backend`` (its id and build) that writes this output although
    ``job.json`` does not name it (``recorded``: the id it names), as after a hand edit or
    delete; None if there is none, or the backend cannot list its running jobs cheaply
    (``running_jobs``, optional)."""
    running = getattr(backend, "running_jobs", None)
    if not callable(running):
        return None
    for job_id, found in sorted(running().items()):
        owner = parse_owner(found)
        if job_id != recorded and owner and same_output(owner[0], location, output_path):
            return job_id, owner[1]
    return None


def refuse_unrecorded_writer(
    backend: RemoteBackend, location: Location, output_path: str, recorded: str, step_id: str
) -> None:
    """Before the output is cleared or a job submitted: raise if ``unrecorded_writer`` finds
    a job, never a second one beside it.

    Raises:
        RemoteJobError: such a job runs (the message names it and how to stop it), or the
            backend cannot list its jobs (an unsafe ``local`` jobs root).
    """
    try:
        found = unrecorded_writer(backend, location, output_path, recorded)
    except RemoteJobError as exc:  # the backend cannot list its jobs (an unsafe jobs root)
        raise for_step(exc, step_id) from None
    if found is not None:
        raise _writing_unrecorded(backend, location, output_path, found, step_id)


def _writing_unrecorded(
    backend: RemoteBackend,
    location: Location,
    output_path: str,
    found: tuple[str, str],
    step_id: str,
) -> RemoteJobError:
    job_id, build_id = found
    path = location.url_for(job_path(output_path))
    name = getattr(backend, "name", "remote")
    return RemoteJobError(
        f"{name} job {job_id} still runs and writes this step's output (for build "
        f"{build_id}), but {path} does not name it (edited or deleted by hand?); nothing was "
        "cleared or submitted beside it",
        f"wait for it to end, or stop it (`pgrep -af {job_id}`, then kill -- -<its pid>), "
        "then run again",
        step_id,
    )


def fence_local_build(location: Location, spec: StepSpec) -> None:
    """Before a step that runs here (not remote) clears or resumes what an earlier attempt
    left: no job of its earlier remote builds writes the output meanwhile. The job
    ``job.json`` records, if provably this step's, is cancelled, confirmed ended and
    forgotten; a ``local`` job that writes the output though ``job.json`` does not name it
    (deleted by hand) stops the build, as a remote step's build does. An unreadable
    ``job.json`` is ignored, with a warning (nothing of it can be stopped), and so is a jobs
    root that cannot be listed safely (the remote steps' concern).

    Raises:
        RemoteJobError: such a job runs, or a cancelled job does not end.
    """
    job = load_job(location, spec.output_path)
    if isinstance(job, UnreadableJob):
        log.warning("fence %s: %s cannot be read (%s); ignored: the step runs here now",
                    spec.step_id, job.path, job.why)  # fmt: skip
        job = None
    try:
        backend = get_backend("local", spec.step_id)
        found = unrecorded_writer(backend, location, spec.output_path, job.job_id if job else "")
    except RemoteJobError:
        found = None
    if found is not None:
        raise _writing_unrecorded(backend, location, spec.output_path, found, spec.step_id)
    if job is not None:
        _stop_and_forget(location, spec, job, "the step no longer runs as a remote job")


def for_step(exc: RemoteJobError, step_id: str) -> RemoteJobError:
    """``exc`` naming ``step_id`` (a backend's error raised without a step)."""
    return exc if exc.step else RemoteJobError(exc.what, exc.fix, step_id)


def _elsewhere(backend: RemoteBackend, job: JobRecord) -> str:
    """Why ``backend`` here cannot see ``job`` (submitted in another scope), or ""."""
    scope = getattr(backend, "scope", None)
    if not job.scope or not callable(scope):
        return ""  # visible wherever the backend is asked (or not recorded: as before)
    here = scope()
    if here == job.scope:
        return ""
    differs = {key: value for key, value in here.items() if job.scope.get(key) != value}
    return f"submitted {describe_scope(job.scope)}; here: {describe_scope(differs)}"


def describe_scope(scope: dict[str, str]) -> str:
    """``on host h1, by alice (uid 1000), jobs root /home/alice/.cache/marin/jobs``."""
    rest = dict(scope)
    host, user, uid, root = (rest.pop(k, "") for k in ("host", "user", "uid", "jobs_root"))
    who = f"by {user or 'uid ' + uid}" + (f" (uid {uid})" if user and uid else "")
    parts = [f"on host {host}" if host else "", who if user or uid else ""]
    parts += [f"jobs root {root}" if root else ""]
    parts += [f"{key} {value}" for key, value in sorted(rest.items())]
    return ", ".join(p for p in parts if p) or "elsewhere"


def _unseen(
    job: JobRecord, location: Location, output_path: str, why: str, step_id: str | None
) -> UnseenJobError:
    """The refusal of a build over a job this driver cannot judge: what file, which job, why,
    and where to reattach, check or stop it."""
    path = location.url_for(job_path(output_path))
    root = job.scope.get("jobs_root", "")
    if root:  # a local job: its folder and process are on its host, under its user
        user = job.scope.get("user", "its user")
        there = f"as {user} on host {job.scope.get('host', '?')} with MARIN_LOCAL_JOBS={root}"
        stop = f"`kill -- -<pid in {root}/{job.job_id}/pid.json>`; `pgrep -af {job.job_id}`"
    else:
        there, stop = "where it was submitted", f"in {job.backend}"
    error = UnseenJobError(
        f"{path} names {job.backend} job {job.job_id}, which may still run and write this "
        f"step's output, but this driver cannot judge it ({why}): nothing was cleared, "
        "stopped or submitted",
        f"run again {there} (it reattaches to the job), or stop it there ({stop}); once it "
        f"has ended, or its host is gone for good, delete {path} and run again",
        step_id,
    )
    error.why = why
    return error


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
    that ``job.json`` names as this very build's and that runs is left to be reattached; one
    that was lost is left to ``run_job``, which counts the preemption (and stops it) before it
    submits again: cancelled here, it would read as stopped, and go uncounted.
    Raises ``RemoteJobError`` when a cancelled job does not end.
    """
    job = _this_steps_job(location, spec, previous)
    if job is None:
        return
    backend = get_backend(str(spec.remote), spec.step_id)
    left = (JobState.RUNNING, JobState.LOST)
    if _recorded(location, spec, job) and backend.status(job.handle).state in left:
        return  # reattached (nothing is resumed under it), or counted lost and stopped there
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


def job_not_reused(forced: bool, status: Mapping[str, Any] | None) -> str:
    """Why a remote step's recorded job is not reused whatever its recipe ('' when the one
    identity rule judges it): a forced build (forcing repairs that job's output), or an
    output ``marin gc`` was deleting (``status``: its mark; half deleted). Asked by the
    build (``fence_recorded``) and by the plan, which shows it."""
    if forced:
        return "forced"
    return GC_WAS_DELETING if gc_was_deleting(status) else ""


def fence_recorded(location: Location, spec: StepSpec, why: str) -> None:
    """Before a remote step builds anew without reusing the job ``job.json`` records
    (``why``: ``job_not_reused``'s answer): that job, if provably this step's, is cancelled
    and confirmed ended, and ``job.json`` forgets it, so the build clears the output and
    submits a job of its own instead of reattaching or collecting. (An unreadable record
    stopped the build before: ``refuse_unreadable_job``.)
    Raises ``RemoteJobError`` when a cancelled job does not end."""
    job = read_job(location, spec.output_path)
    if job is not None:
        _stop_and_forget(location, spec, job, why)


def _stop_and_forget(location: Location, spec: StepSpec, job: JobRecord, why: str) -> None:
    """Cancel ``job``, when provably this step's, confirm it ended, and delete ``job.json``."""
    if not JOB_ID.fullmatch(job.job_id):
        return  # a blank or foreign record: the remote call's to judge
    if not is_this_steps(job, location, spec.output_path, spec.step_id):  # raises if unseen
        return
    log.info("fence %s: %s job %s is not reused (%s)", spec.step_id, job.backend, job.job_id, why)
    stop_job(get_backend(job.backend, spec.step_id), job, spec.step_id)
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
