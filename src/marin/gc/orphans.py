"""Orphaned remote jobs: a job still running for a step no plan of the targets serves (a version
bumped while it ran, its driver killed). ``marin gc`` lists each and leaves its step alone;
with ``--cancel-orphans`` it cancels the job through the step's backend, then deletes the step.

A job is asked about only when ``job.json`` names an id of Marin's form and its backend vouches
that it was submitted for this step (``fence.is_this_steps``): a record naming another job is
never followed to a backend, and its step is deleted like any other. A job this gc cannot see
(submitted on another host or by another user, whose backend here does not know it) may run:
it is listed, never cancelled, and its step left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from marin.execution.errors import one_line
from marin.execution.remote.fence import UnseenJobError, is_this_steps
from marin.execution.remote.protocol import JobHandle, RemoteBackend
from marin.execution.remote.registry import get_backend
from marin.execution.store.location import Location
from marin.execution.store.step_folder import JOB_ID, JobRecord, load_job
from marin.execution.vocabulary import JobState
from marin.gc.walk import Slot

LEFT_RUNNING = "left running"
CANCELLED = "cancelled"
WOULD_CANCEL = "would cancel"
UNKNOWN = "unknown"
UNSEEN = "unseen"


@dataclass(frozen=True)
class Orphan:
    """A remote job found running (or in a state its backend could not tell) in a step gc
    would delete, and what gc did about it."""

    step: str
    path: str
    backend: str
    job_id: str
    state: str
    """``running``; ``unknown`` when its backend could not be asked; ``unseen`` when it may run
    where this gc cannot see it (another host, user or jobs root; a backend not available here;
    an edited record): never cancelled from here, its step left alone."""
    action: str
    """``left running``, ``cancelled``, ``would cancel`` (a dry run), or why a cancel failed."""

    @property
    def stopped(self) -> bool:
        """Whether its step may be deleted now (a dry run: would be)."""
        return self.action in (CANCELLED, WOULD_CANCEL)

    def why_skipped(self) -> str:
        """Why its step was left alone."""
        if self.action == LEFT_RUNNING:
            return (
                f"its {self.backend} job {self.job_id} is {self.state} (an orphan: no plan of "
                "the targets serves this version); --cancel-orphans cancels it"
            )
        return f"its {self.backend} job {self.job_id} is {self.state}: {self.action}"

    def to_json(self) -> dict[str, str]:
        return {
            "step": self.step,
            "path": self.path,
            "backend": self.backend,
            "job_id": self.job_id,
            "state": self.state,
            "action": self.action,
        }


def check_job(location: Location, slot: Slot, *, cancel: bool, dry_run: bool) -> Orphan | None:
    """The job ``slot``'s ``job.json`` names, if its backend says it may still run; cancelled
    when ``cancel`` (a dry run only says it would be). None: no job, not Marin's, or ended (a
    build with a record: its job ended before the record was committed)."""
    if slot.record is not None:
        return None
    job = load_job(location, slot.output_path)
    if not isinstance(job, JobRecord) or not JOB_ID.fullmatch(job.job_id):
        return None  # none, or a record that cannot be read: never followed to a backend
    backend: RemoteBackend | None = None
    try:
        if not is_this_steps(job, location, slot.output_path):
            return None  # its backend does not vouch for it: never asked about, never stopped
        backend = get_backend(job.backend, slot.step_id)
        state = str(backend.status(job.handle).state)
    except UnseenJobError as exc:  # not visible from here (another host or user): it may run
        action = f"left alone: this gc cannot see it ({exc.why}); run gc there"
        return Orphan(slot.step_id, slot.output_path, job.backend, job.job_id, UNSEEN, action)
    except Exception:  # an unreachable cluster: it may still run
        state = UNKNOWN
    if state not in (JobState.RUNNING, UNKNOWN):
        return None  # it ended: nothing of it runs any more
    action = LEFT_RUNNING
    if cancel and dry_run:
        action = WOULD_CANCEL
    elif cancel:
        action = _cancel(backend, job.handle)
    return Orphan(slot.step_id, slot.output_path, job.backend, job.job_id, state, action)


def _cancel(backend: RemoteBackend | None, handle: JobHandle) -> str:
    if backend is None:
        return "could not cancel it: its backend is not available here"
    try:
        backend.cancel(handle)
    except Exception as exc:
        return f"could not cancel it ({one_line(exc)})"
    return CANCELLED
