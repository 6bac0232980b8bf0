"""A step's remote job from the command line: ``marin logs`` and ``marin cancel`` (issue 55).

Both start from the step's folder under the prefix, never from a pipeline: ``job.json`` names
the job, and it is untrusted (anyone who can write the prefix can plant one), so a job is read
or cancelled only once its backend vouches that it was submitted for this step's build
(``is_this_steps``). ``cancel`` records the cancel for a live driver (``cancel.json``: it
never submits the job again), stops the job through its backend, then releases what the step
holds when no live driver holds it, its mark then naming the job for a task deferred on it (a
live driver sees its job stopped, fails the step and releases its lease itself). What a job
printed is shown with its control characters escaped.
"""

from __future__ import annotations

import io
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from marin.execution.errors import MarinError
from marin.execution.remote.fence import UnseenJobError, is_this_steps, stop_job
from marin.execution.remote.log_tail import each_line, tail_lines
from marin.execution.remote.protocol import log_lines, peek
from marin.execution.remote.registry import get_backend
from marin.execution.remote.view import job_age, short_duration
from marin.execution.store.lease import break_lease, read_lease
from marin.execution.store.location import Location, open_local
from marin.execution.store.records import FAILED, read_record, write_status
from marin.execution.store.step_folder import (
    JOB_ID,
    CancelMark,
    JobRecord,
    UnreadableJob,
    delete_job,
    load_job,
    write_cancel_mark,
)
from marin.execution.vocabulary import JobState
from marin.terminal_text import safe_text
from marin.unlock import describe_lease

FOLLOW_POLL_S = 0.5
RANK_LOG_LINES = 1_000_000
"""How many of a gang's log lines ``marin logs --rank`` reads to find one rank's last ones."""
_COLOR = r"(?:(?:\\x1b|\x1b)\[[0-9;]*m)?"
_RANK_LABEL = re.compile(_COLOR + r"(?:\([^)\n]{0,200}\)" + _COLOR + r" )?\[rank (\d{1,9})\] ")
"""The label a gang puts on each line of rank K's output (``[rank K] ``), after Ray's
``(GangRank pid=..., ip=...) `` (colored or not, escaped or not)."""


class JobRefusedError(MarinError):
    """A step's recorded job cannot be read or vouched for: nothing of it is touched."""


@dataclass(frozen=True)
class StepJob:
    """A step's recorded job, vouched for by its backend, and its state now."""

    job: JobRecord
    state: str
    """A ``JobState``, or ``unknown`` when the backend cannot be asked now."""

    def describe(self) -> str:
        """``local job marin-ab12, running 3m``."""
        age = job_age(self.job)
        since = "" if age is None else f" {short_duration(age)}"
        return f"{self.job.backend} job {self.job.job_id}, {self.state}{since}"


def step_job(location: Location, output_path: str, step: str) -> StepJob | None:
    """The job ``job.json`` records for the step (None without one).

    Raises:
        JobRefusedError: the record cannot be read, or its backend does not vouch that the
            job it names is this step's (or cannot be asked).
    """
    found = load_job(location, output_path)
    if found is None:
        return None
    if isinstance(found, UnreadableJob):
        refusal = found.refusal(step)
        raise JobRefusedError(refusal.what, refusal.fix, step)
    try:
        ours = is_this_steps(found, location, output_path, step)
    except UnseenJobError as exc:  # it may run where this driver cannot see: never touched
        raise JobRefusedError(exc.what, exc.fix, step) from exc
    except Exception as exc:  # an outage is never taken for "ours"
        raise JobRefusedError(
            f"cannot ask {found.backend} about job {found.job_id} ({exc})",
            "check that the backend is reachable (Ray: $RAY_ADDRESS), then try again",
            step,
        ) from exc
    if not ours:
        raise JobRefusedError(
            f"job.json names {found.backend} job {found.job_id}, which its backend does not "
            "know as this step's: it is left alone",
            "if you know the job, stop it in its backend; `marin run` replaces the record",
            step,
        )
    try:
        state = str(peek(get_backend(found.backend), found.handle).state)
    except Exception:  # advisory: shown as unknown
        state = "unknown"
    return StepJob(found, state)


def cancel_step(location: Location, output_path: str, step: str) -> str:
    """Cancel the step's build: stop its running job, and record the cancel for a live driver
    (``cancel.json``: it stops the build instead of submitting a job again, as after a
    preemption); release what the step holds when no live driver holds it. What was done, in
    words. The mark is written before the job is looked at, so a job the driver submits
    meanwhile is either seen running here (and stopped) or stopped by the driver.

    Raises:
        JobRefusedError: see ``step_job``; or no job is recorded for the step and no live
            driver holds its lease.
        RemoteJobError: the job still runs after it was cancelled.
    """
    info = read_lease(location, output_path)
    live = info is not None and info.live
    if live and info is not None:
        _mark_cancelled(location, output_path, info.token)
    found = step_job(location, output_path, step)
    if found is None and live and info is not None:  # recorded: exit 0, as --help says
        return (
            f"cancel recorded for {step}: no job is submitted yet; the driver holding its lease "
            f"({info.who()}) stops the build before it submits one (recorded in its "
            "cancel.json; a step run in the driver's own process is not remote: stop that "
            "process)"
        )
    if found is None:
        raise JobRefusedError(
            f"{step} has no remote job recorded",
            "only a remote step's job can be cancelled; stop a local build's process instead",
            step,
        )
    backend = get_backend(found.job.backend, step)
    if found.state == JobState.RUNNING:
        stop_job(backend, found.job, step, "cancel %s: stop %s job %s")
        done = f"cancelled {step}: stopped {found.describe()}"
    elif live and info is not None:
        return (
            f"cancelled {step}: its {found.describe()} is not running; the driver holding its "
            f"lease ({info.who()}) stops the step instead of submitting it again (at its next "
            "resubmission; recorded in its cancel.json)"
        )
    else:
        done = f"{step}: nothing to stop, its job is not running ({found.describe()})"
    return done + _release(location, output_path, found.job)


def _mark_cancelled(location: Location, output_path: str, lease_token: str) -> None:
    """Record the cancel for the build holding the lease ``lease_token`` (``CancelMark``);
    "": for the build that waits for the job ``job.json`` names (an Airflow task deferred on
    it, holding no lease), which finds no record of it once it is released."""
    from marin.execution.pipeline.provenance import now_iso
    from marin.execution.pipeline.scope import current_user

    try:
        user = current_user() or ""
    except MarinError:  # a user name Marin refuses: the mark says nobody
        user = ""
    found = load_job(location, output_path)
    job_id = found.job_id if isinstance(found, JobRecord) and JOB_ID.fullmatch(found.job_id) else ""
    if not (lease_token or job_id):
        return  # it would name no build
    mark = CancelMark(lease_token, job_id, now_iso(), user)
    write_cancel_mark(location, output_path, mark)


def _release(location: Location, output_path: str, job: JobRecord) -> str:
    """Release the step's lease and job record when no live driver holds them."""
    info = read_lease(location, output_path)
    if info is not None and info.live:
        return (
            f"; the driver holding its lease ({info.who()}) sees the job stopped, fails the "
            "step and releases the lease"
        )
    released = ""
    if info is not None and break_lease(location, output_path, info):
        released = f"; removed its lease ({describe_lease(info)})"
    _mark_cancelled(location, output_path, "")  # a task deferred on the job stops, never resubmits
    delete_job(location, output_path)
    if read_record(location, output_path) is None:
        cancelled = f"cancelled by `marin cancel`: {job.backend} job {job.job_id}"
        write_status(location, output_path, FAILED, error=cancelled)
    return released + "; removed its job record (the next run submits a new job)"


def follow_job_log(
    found: StepJob, write: Callable[[str], None], *, follow: bool, lines: int
) -> str:
    """Write the job's log (escaped) with ``write``: its last ``lines`` lines, or with
    ``follow`` all of it as it grows until the job ends. The job's state at the end.

    Raises:
        JobRefusedError: the backend cannot follow the job's log.
        OSError: ``write`` failed (a reader that went away: ``marin logs -f | head``).
    """
    backend = get_backend(found.job.backend)
    if not follow or found.state != JobState.RUNNING:
        text = backend.logs(found.job.handle, lines)
        for line in log_lines(text):
            write(safe_text(line) + "\n")
        return found.state
    opener = getattr(backend, "follow", None)
    if not callable(opener):
        raise JobRefusedError(
            f"the {found.job.backend} backend cannot follow a job's log",
            "run `marin logs` without -f for its last lines",
        )
    from marin.execution.remote.follow import JobLog, LiveJob

    broken: list[OSError] = []

    def on_lines(shown: list[str]) -> None:
        try:
            write("".join(safe_text(line) + "\n" for line in shown))
        except OSError as exc:  # a reader that went away (``| head``): stop following
            broken.append(exc)

    tail = JobLog(opener(found.job.handle), on_lines, LiveJob(found.job, ""))
    state = found.state
    while state == JobState.RUNNING:
        tail.pump()
        if broken:
            tail.cursor.close()
            raise broken[0]
        time.sleep(FOLLOW_POLL_S)  # polling: neither a file nor Ray's stream offers an event here
        try:
            state = str(peek(backend, found.job.handle).state)
        except Exception:  # an outage: keep following
            continue
    tail.finish()
    return state


def follow_step_log(
    location: Location,
    output_path: str,
    write: Callable[[str], None],
    *,
    follow: bool,
    lines: int | None,
) -> bool:
    """Write the step's ``log.txt`` (escaped): its last ``lines`` lines (None: all), and with
    ``follow`` on local disk, what is added while the step's lease is live. Whether there was
    a log.

    Raises:
        StorageError: the log cannot be read.
    """
    from marin.execution.store.records import log_path

    path = location.path(log_path(output_path))
    if not location.has_file(path):
        return False
    # By lines, a long one cut: on local disk never the whole log in memory.
    local = location.is_local
    with open_local(path, "rb") if local else io.BytesIO(location.read_file(path)) as f:
        offset = f.seek(0, os.SEEK_END)
        f.seek(0)
        for line in each_line(f) if lines is None else tail_lines(f, lines):
            write(safe_text(line) + "\n")
    if not (follow and location.is_local):
        return True
    partial = b""
    while True:
        info = read_lease(location, output_path)
        with open_local(path, "rb") as f:  # never through a link; grows while the step builds
            f.seek(offset)
            added = f.read(1 << 20)
        offset += len(added)
        *done, partial = (partial + added).split(b"\n")
        for line in done:
            write(safe_text(line.decode(errors="replace")) + "\n")
        if not added and (info is None or not info.live):
            return True
        if not added:
            time.sleep(FOLLOW_POLL_S)  # polling: a file offers no event here


def running_job_notes(location: Location, output_path: str, step: str) -> list[str]:
    """The jobs that still run for ``step`` or another version of it (a version bumped under a
    job), each with how to stop it: what ``marin unlock`` says beside the lease. Advisory."""
    from marin.execution.remote.view import other_version_jobs

    notes = []
    try:
        found = step_job(location, output_path, step)
    except JobRefusedError:
        found = None
    if found is not None and found.state == JobState.RUNNING:
        notes.append(f"note: its {found.describe()} still runs: `marin cancel {step}` stops it")
    for other in other_version_jobs(location, output_path):
        notes.append(
            f"note: {other['backend']} job {other['job_id']} of {other['step']} (another "
            f"version) still runs: `marin cancel {other['step']}` stops it"
        )
    return notes


class RankLines:
    """``marin logs --rank K``: of a gang's log (written escaped, whole lines), only rank K's
    lines, without their label, handed to ``write``. Labels are the gang's (a rank's own
    output is labelled after them), so one rank's line never passes for another's."""

    def __init__(self, rank: int, write: Callable[[str], None]) -> None:
        self.rank, self.write, self.shown = rank, write, 0

    def __call__(self, text: str) -> None:
        for line in text.splitlines(keepends=True):
            found = _RANK_LABEL.match(line)
            if found is not None and int(found.group(1)) == self.rank:
                self.shown += 1
                self.write(line[found.end() :])
