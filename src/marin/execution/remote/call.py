"""Running a remote step's call as a job (``with_options(remote=...)``): the build's side.

A remote step's ``run`` returns a ``JobToRun`` (``pipeline/remote_option.py``); ``build_step``
hands it to ``run_job`` under the step's lease, with the ``RemoteBuild`` it runs in (the
location, the build and its lost-lease event, how it waits). ``run_job``:

1. reads ``job.json``: a job there of this build's recipe (the one identity rule,
   ``store/identity.py``: placement, config, input builds, code) was submitted by an earlier
   holder that died, was interrupted, or lost its lease: a running one is **reattached**, a
   finished one **collected**; a stopped or lost one is forgotten, its debris cleared, and a
   new one submitted. A job of another recipe is cancelled (if provably this step's) and
   replaced, never collected; a ``job.json`` that cannot be read stops the build before
   anything is cleared (its job may still write the output);
2. else writes ``job.json`` (a conditional create) *before* submitting, so a crash between the
   two leaves a record of a job that may not exist (``LOST``: a new one is submitted), never a
   job nobody knows of;
3. waits on the process's one poller (``poller.py``), blocking its thread (``Wait.BLOCK``), or
   returns ``JobRunning`` (``wait.py``) for its caller to wait; a lost lease cancels the job
   and raises;
4. streams the job's output into the step's log while it runs (``follow.py``; a backend that
   cannot follow gets its log tail copied at the end), and returns ``fn``'s value (or raises
   its error, naming the job and its log tail; ``job.json`` is removed so a retry submits
   anew).
   A job **lost** (a signal killed it or one of its ranks, its node went away) is no error:
   it is submitted again under the step's ``max_preemptions``, resuming when resumable, and
   ``job.json`` counts the preemptions (``_preempted``). Before every submission (and right
   after it) a ``marin cancel`` recorded for this build's lease (``cancel.json``) ends the
   build as stopped (cancelled) instead (``_stop_if_cancelled``).
   A build that waits for a job it did not submit (``awaited_job``: an Airflow task resuming
   from its deferral) and finds that job stopped, or a cancel mark naming it, ends the same
   way: a job stopped while nobody held the lease was cancelled, never a dead driver's
   leftover to replace (``_stop_awaited``). A new build finding a stopped job replaces it.
The caller (``build_step``) commits the record, as for any step.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from marin.execution.errors import CodeDriftError, LeaseLostError, RemoteJobError
from marin.execution.faults import crash_point, hold_point
from marin.execution.ids import new_id
from marin.execution.pipeline.canonical import Canonical
from marin.execution.pipeline.context import StepContext
from marin.execution.pipeline.isolation import Outcome, _child_env, call_payload
from marin.execution.pipeline.provenance import now_iso
from marin.execution.pipeline.remote_option import JobToRun, RemoteRun
from marin.execution.remote.cleanup import forget_failed
from marin.execution.remote.code_check import expected_code
from marin.execution.remote.context_vars import payload as carried
from marin.execution.remote.fence import (
    JobCheck,
    for_step,
    is_this_steps,
    refuse_unrecorded_writer,
    stop_job,
)
from marin.execution.remote.follow import LiveJob, follow_job, live_jobs, note_live
from marin.execution.remote.gang_rules import placement_failure
from marin.execution.remote.local import jobs_root_path
from marin.execution.remote.poller import POLLER, Watch
from marin.execution.remote.protocol import JobSpec, JobStatus, RemoteBackend, job_owner
from marin.execution.remote.registry import get_backend
from marin.execution.remote.view import job_ranks
from marin.execution.remote.wait import JobRunning
from marin.execution.store.identity import Recipe, claim_of, judge_claim
from marin.execution.store.location import Location, with_retries
from marin.execution.store.step_folder import (
    JobRecord,
    UnreadableJob,
    create_job,
    delete_job,
    load_job,
    read_cancel_mark,
    remove_cancel_mark,
    replace_job,
)
from marin.execution.vocabulary import Claim, JobState, Mismatch, Wait

log = logging.getLogger("marin")

LOG_TAIL_LINES = 40
_GONE = (JobState.STOPPED, JobState.LOST)


@dataclass
class RemoteBuild:
    """The build a remote call runs in (made by ``build_step``)."""

    location: Location
    output_path: str
    build_id: str
    lost: threading.Event
    recipe: Recipe
    """The build's, with the input builds it read: its job is submitted for it, and a job of
    another recipe is never reattached or collected (``judge_claim``)."""
    on_code_drift: str = "warn"
    """The run's code drift policy: under ``warn`` a job of other code is reattached, noted."""
    wait: Wait = Wait.BLOCK
    """Wait for the job here (``BLOCK``), or return ``JobRunning`` while it runs."""
    resumed: bool = False
    """A resumable step's attempt resumes: a job's partial output is kept (``fence.py``)."""
    on_job: Callable[[JobRecord], None] | None = field(default=None)
    """Told each job this attempt submits or reattaches to (its ``attempt.json`` names it)."""
    job: JobRecord | None = field(default=None)
    """The job that ran ``fn``, once known: the record names it."""
    gang: dict[str, Any] = field(default_factory=dict)
    """A gang's ranks as its job ended (``ranks``: host and state of each) and their
    ``rank_placement``: the record keeps them beside its job."""
    job_ended_at: str = ""
    """When its job ended (ISO), as the backend says, else as this driver saw it: the record
    keeps it beside its job (a collected job's duration is the job's, ``timing.py``)."""
    on_lines: Callable[[list[str]], None] | None = field(default=None)
    """Where the job's output goes while it runs (the step's log and the terminal), from
    any thread; None: only its tail, once it ended."""
    holds: Callable[[], bool] = field(default=lambda: True)
    """The fence: True only once this driver proved, right now, that it still holds the
    step's lease (``build_step`` renews it: a compare-and-swap on its token). Asked before the
    driver acts on anything it concluded about its job (``_RemoteCall._fence``)."""
    lease_token: str = ""
    """The token of the step's lease this build holds: a ``marin cancel`` mark naming it
    stops this build before (and right after) it submits a job ("": no mark is read)."""
    awaited_job: str = ""
    """The id of the job this build waits for though it did not submit it (an Airflow task
    resuming from its deferral on it): found stopped, or named by a ``marin cancel`` mark, it
    ends the build as stopped (cancelled) instead of a new job being submitted. "": none (a
    new build, which replaces a stopped job it finds)."""


def running_jobs() -> dict[str, JobRecord]:
    """step id -> the job this process waits for."""
    return {step_id: live.job for step_id, live in live_jobs().items()}


def warn_running_jobs() -> None:
    """On an interrupt: name each job this process waits for, and how to stop it; none is
    orphaned silently."""
    for step_id, live in sorted(live_jobs().items()):
        log.warning(
            "interrupted: %s job %s of %s keeps running; the next `marin run` reattaches to "
            "it (`marin cancel %s --prefix %s` stops it)",
            live.job.backend,
            live.job.job_id,
            step_id,
            step_id,
            live.prefix,
        )


def pending_job(location: Location, output_path: str, built: bool) -> bool:
    """Whether a job record of an unfinished build is there (its output must not be cleared:
    the job may be writing it); a committed build's (``built``) is removed, as its record is.
    A record that cannot be read counts as a job (``refuse_unreadable_job`` stops the build)."""
    if built:
        delete_job(location, output_path)
        return False
    return load_job(location, output_path) is not None


def refuse_unreadable_job(
    location: Location, output_path: str, step_id: str, remote: str | None = None
) -> None:
    """Raise before anything is cleared when ``job.json`` is there but cannot be read: the job
    it named may still run and write the output, so neither clearing the output nor submitting
    a second job is safe (``UnreadableJob.refusal`` says how to stop it). Likewise when a job
    of the step's backend (``remote``) runs for this output although ``job.json`` does not
    name it (edited or deleted by hand: ``refuse_unrecorded_writer``).

    Raises:
        RemoteJobError: the file cannot be read, or a job it does not name writes the output.
    """
    found = load_job(location, output_path)
    if isinstance(found, UnreadableJob):
        raise found.refusal(step_id)
    if remote is not None:
        recorded = found.job_id if found is not None else ""
        backend = get_backend(remote, step_id)
        refuse_unrecorded_writer(backend, location, output_path, recorded, step_id)


def run_job(to_run: JobToRun, build: RemoteBuild) -> Any:
    """Run a remote step's call as a job of ``build`` (see the module docstring): its value
    (``Canonical``), or ``JobRunning`` while it runs when ``build.wait`` is not ``BLOCK``.

    Raises:
        RemoteJobError: the job failed (naming it and its log tail), or ``job.json`` cannot be
            read, or another driver recorded a job for this build first.
        LeaseLostError: the lease was lost while the job ran (the job is cancelled).
        CodeDriftError: a recorded job of other code, under ``on_code_drift="error"``.
    """
    remote = to_run.remote
    backend = get_backend(remote.backend, remote.step_id)
    return _RemoteCall(remote, backend, build, to_run.ctx).start()


@dataclass(frozen=True)
class _RemoteCall:
    """One remote call of one build: ``remote``'s call on ``backend``, with its context."""

    remote: RemoteRun
    backend: RemoteBackend
    build: RemoteBuild
    ctx: StepContext

    @property
    def step_id(self) -> str:
        return self.remote.step_id

    def start(self) -> Any:
        job, status = self._attach_or_submit()
        return self._await(job, status)

    def _await(self, job: JobRecord, status: JobStatus | None) -> Any:
        """Wait for the job on the poller, blocking this thread, or (not ``BLOCK``) return
        ``JobRunning``; then ``_ended``. A job found ended (``status``) is collected at once."""
        watch = Watch(self.backend, job.handle, self.build.lost)
        if status is not None and status.state != JobState.RUNNING:
            watch.status = status
            return self._ended(job, watch)
        live = LiveJob(job, self.build.location.url)
        watch.follow = follow_job(self.backend, live, self.build.on_lines)
        note_live(self.step_id, live)
        if self.build.wait != Wait.BLOCK:
            return JobRunning(self.step_id, job, watch, functools.partial(self._ended, job, watch),
                              functools.partial(self._forget, watch))  # fmt: skip
        try:
            POLLER.wait(watch)
        except BaseException:
            note_live(self.step_id, None)
            raise
        return self._ended(job, watch)

    def _forget(self, watch: Watch) -> None:
        watch.dropped = True
        note_live(self.step_id, None)

    def _ended(self, job: JobRecord, watch: Watch) -> Any:
        """The job ended (or the lease was lost): its value, or its error. A lost lease
        cancels the job (the displaced holder never commits, and its job must stop writing).
        Whatever this driver saw of an ended job, it first proves it still holds the lease
        (``_fence``): a driver that stalled past its lease never calls a job lost, clears,
        submits or writes anything for the step (the new holder may have collected it)."""
        note_live(self.step_id, None)
        if watch.lease_lost:
            self.backend.cancel(job.handle)
            raise LeaseLostError(
                f"lost the lease while {job.backend} job {job.job_id} ran; the job was cancelled",
                "nothing was committed by this runner; the new holder builds the step",
                self.step_id,
            )
        self._fence(job)
        state = watch.status.state if watch.status is not None else None
        if state in _GONE and job.build_id != self.build.build_id:
            # A reattached job stopped (its displaced holder cancelled it) or vanished: this
            # build submits its own, once. Its own job stopped is a failure; lost, a preemption.
            log.info("resubmit %s: %s job %s is %s", self.step_id, job.backend, job.job_id,
                     state)  # fmt: skip
            job, status = self._attach_or_submit()
            return self._await(job, status)
        if state == JobState.LOST and job.preemptions < self.remote.max_preemptions:
            return self._preempted(job, watch)
        return self._collect(job, watch)

    def _preempted(self, job: JobRecord, watch: Watch) -> Any:
        """The job was lost (a signal killed it or a rank, its node went away): not ``fn``'s
        error, so not a retry: submitted again under ``max_preemptions``, resuming from its
        checkpoints when the step is resumable (else from a cleared output)."""
        resumes = self.ctx.checkpoint_path is not None
        hold_point("before-resubmit")
        self._stop_if_cancelled(job, f"lost ({watch.status.detail if watch.status else ''})")
        log.warning(
            "preempted %s: %s job %s was lost (%s); submitting it again (preemption %d of at "
            "most %d%s)", self.step_id, job.backend, job.job_id,
            watch.status.detail if watch.status else "", job.preemptions + 1,
            self.remote.max_preemptions, ", resuming" if resumes else ", from the start",
        )  # fmt: skip
        self._refuse_unrecorded(job)
        self._drop(job, keep_output=resumes)
        return self._await(self._submit(job.preemptions + 1), None)

    def _fence(self, job: JobRecord | None = None) -> None:
        """Prove this driver still holds the step's lease before it acts on the step (calls a
        job lost, clears, cancels, submits, writes ``job.json`` or collects); else stop here,
        touching nothing: the driver that took the lease over owns the step and its job.

        Raises:
            LeaseLostError: the lease is no longer this driver's.
        """
        build = self.build
        if not build.lost.is_set() and build.holds():
            return
        build.lost.set()
        seen = f" ({job.backend} job {job.job_id} is left to it)" if job and job.job_id else ""
        raise LeaseLostError(
            f"lost the lease to another driver{seen}; this driver touched nothing since",
            "nothing was committed by this runner; the driver holding the lease builds the step",
            self.step_id,
        )

    def _refuse_unrecorded(self, found: JobRecord | None) -> None:
        """Before a new job is submitted: refuse while a job of this backend that ``job.json``
        does not name writes the output (``refuse_unrecorded_writer``)."""
        recorded = found.job_id if found is not None else ""
        build = self.build
        refuse_unrecorded_writer(self.backend, build.location, build.output_path, recorded,
                                 self.step_id)  # fmt: skip

    def _drop(self, found: JobRecord, keep_output: bool) -> None:
        """Forget a recorded job that is not collected: kept output (a resume) only once the
        job provably ended (``stop_job``); else its debris is cleared."""
        build = self.build
        self._fence(found)
        if keep_output:
            stop_job(self.backend, found, self.step_id)  # its partial output is resumed: fenced
        else:
            out = build.location.path(build.output_path)
            if build.location.exists(out):
                with_retries(lambda: build.location.remove_tree(out), f"clear {out}")
        delete_job(build.location, build.output_path)

    def _attach_or_submit(self) -> tuple[JobRecord, JobStatus | None]:
        """The job of this build: the recorded one reattached (with its state now), or a new
        one submitted (no state: it runs)."""
        build, backend = self.build, self.backend
        self._fence()
        found = self._recorded_job()
        if found is not None and found.backend == self.remote.backend and found.job_id:
            status = backend.status(found.handle)
            if status.state in (JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED):
                log.info("reattach %s: %s job %s (%s)", self.step_id, found.backend,
                         found.job_id, status.state)  # fmt: skip
                _known(build, found)
                return found, status
            # a job lost while no driver waited was preempted too: the build's count goes on
            lost = status.state == JobState.LOST
            if lost and found.preemptions >= self.remote.max_preemptions:
                watch = Watch(backend, found.handle, build.lost)
                watch.status = status
                self._collect(found, watch)  # raises: lost once more than the budget allows
            log.info("resubmit %s: %s job %s is %s", self.step_id, found.backend, found.job_id,
                     status.state)  # fmt: skip
            preempted = found.preemptions + lost
            if status.state == JobState.STOPPED and found.job_id == build.awaited_job:
                self._stop_awaited(found, status)
            self._stop_if_cancelled(found, str(status.state))
            self._refuse_unrecorded(found)
            self._drop(found, keep_output=build.resumed)
            return self._submit(preempted), None
        hold_point("before-submit")
        self._stop_if_cancelled(None, "")
        self._refuse_unrecorded(found)
        if found is not None:  # another recipe's, or not this step's: its debris goes
            self._drop(found, keep_output=build.resumed and bool(found.job_id))
        return self._submit(), None

    def _recorded_job(self) -> JobRecord | None:
        """The job ``job.json`` records, if it is this build's recipe's on this backend; a
        blank record (cleared and replaced by the caller) for any other; None without one."""
        build = self.build
        found = load_job(build.location, build.output_path)
        if isinstance(found, UnreadableJob):
            raise found.refusal(self.step_id)  # never cleared or submitted over: it may run
        if found is None:
            return None
        if not is_this_steps(found, build.location, build.output_path, self.step_id):
            log.warning("ignoring the job record of %s: not one this step's builds write",
                        self.step_id)  # fmt: skip
            return JobRecord("", "", "", "", {})
        if found.backend != self.remote.backend:  # the step moved: its job there stops first
            log.warning("replace %s: its %s job %s stops; a %s job builds it now", self.step_id,
                        found.backend, found.job_id, self.remote.backend)  # fmt: skip
            stop_job(get_backend(found.backend, self.step_id), found, self.step_id)
            return JobRecord(self.remote.backend, "", "", "", {})
        return self._of_this_recipe(found)

    def _of_this_recipe(self, found: JobRecord) -> JobRecord:
        """``found``, when the one identity rule calls it this build's recipe's; else that job
        stopped and a blank record: its output is not this recipe's, so it is never collected
        or resumed, and it must stop writing before the output is cleared. Unknown (a job that
        did not record its input builds) is not this recipe's either: never reused on a
        guess. Under ``on_code_drift="error"`` a job of other code stops the build instead
        (``CodeDriftError``), the job untouched, as a partial attempt of other code does."""
        build = self.build
        verdict = judge_claim(build.recipe, claim_of(found), build.on_code_drift)
        if verdict.differs == Mismatch.CODE and build.on_code_drift == "error":
            raise CodeDriftError(
                f"code changed since {found.backend} job {found.job_id} was submitted: "
                + "; ".join(verdict.code_drift),
                "reattach to it anyway with --on-code-drift warn, replace it with "
                "--on-code-drift rebuild, or restore the code",
                self.step_id,
            )
        if verdict.claim == Claim.OURS:
            if verdict.note:
                log.warning("code drift %s: %s", self.step_id, verdict.note)
            return found
        log.warning("replace %s: %s; a new job builds this recipe", self.step_id, verdict.reason)
        stop_job(self.backend, found, self.step_id)
        return JobRecord(self.remote.backend, "", "", "", {})  # cleared and replaced below

    def _submit(self, preemptions: int = 0) -> JobRecord:
        build, ctx = self.build, self.ctx
        self._fence()
        key = f"marin-{new_id()[:20]}"
        # The job id is all a later driver needs to find the job, known before it is
        # submitted: a crash right after the submit leaves a record that leads to the job,
        # and says where it can be seen from (a driver elsewhere never calls it lost).
        scope = _scope_of(self.backend, self.step_id)
        record = _job_record(self.remote.backend, key, build, now_iso(), {}, scope, preemptions)
        won = create_job(build.location, build.output_path, record, self.step_id)
        if won is not record:  # another driver got past the lease too: never a second job
            raise RemoteJobError(
                f"another driver recorded {won.backend} job {won.job_id} for this build first",
                "run again: the next run reattaches to that job",
                self.step_id,
            )
        if ctx.checkpoint_path is not None:  # the job answers still_holds_lease() itself
            check = JobCheck(build.location, build.output_path, build.build_id)
            ctx = dataclasses.replace(ctx, lease_check=check)
        handle = self.backend.submit(self._job_spec(ctx), key)
        record = _job_record(self.remote.backend, handle.job_id, build, record.submitted_at,
                             dict(handle.data), scope, preemptions)  # fmt: skip
        replace_job(build.location, build.output_path, record)
        log.info("submit %s: %s job %s", self.step_id, record.backend, record.job_id)
        _known(build, record)
        crash_point("after-submit", self.step_id)  # the job runs, job.json names it
        self._stop_if_cancelled(record, "just submitted")
        return record

    def _stop_if_cancelled(self, job: JobRecord | None, was: str) -> None:
        """Before a job is submitted (and right after, for a cancel that raced the submit): a
        ``marin cancel`` mark for this build's lease, or for the job it waits for
        (``awaited_job``), ends the build as stopped (cancelled), ``job`` (a lost one, or the
        one just submitted) stopped and forgotten; any other mark is an earlier build's,
        removed. ``marin cancel`` writes its mark before it looks at the job, so a submit it
        did not see is caught here.

        Raises:
            RemoteJobError: the build was cancelled (``final``: not retried).
        """
        build = self.build
        mark = read_cancel_mark(build.location, build.output_path)
        if mark is None or not build.lease_token:
            return
        remove_cancel_mark(build.location, build.output_path)
        if not mark.stops(build.lease_token, build.awaited_job):
            return  # an earlier build's: this driver holds the lease now
        by = f" by {mark.by}" if mark.by else ""
        if job is None and mark.job_id and mark.job_id == build.awaited_job:  # its record gone
            what = (f"{self.remote.backend} job {mark.job_id} was stopped (cancelled{by}) while "
                    "this build waited for it, and no new job is submitted")  # fmt: skip
        elif job is None:
            what = f"the build was stopped (cancelled{by}) before its job was submitted"
        else:  # it ended (a lost job's whole group too) before its record goes
            stop_job(self.backend, job, self.step_id, "cancel %s: stop %s job %s")
            forget_failed(build.location, build.output_path, job)
            what = (f"{job.backend} job {job.job_id} was stopped (cancelled{by}): it was {was} "
                    "when `marin cancel` ran, and no new job is submitted")  # fmt: skip
        raise self._cancelled(what, job)

    def _stop_awaited(self, job: JobRecord, status: JobStatus) -> None:
        """The job this build waits for (``awaited_job``) was found stopped (``marin cancel``,
        or its backend): the build ends as stopped (cancelled), as a driver that submitted it
        does, its record forgotten; never a new job (a cancel mark naming it is honoured too).

        Raises:
            RemoteJobError: always (``final``: not retried).
        """
        build = self.build
        mark = read_cancel_mark(build.location, build.output_path)
        if mark is not None:
            remove_cancel_mark(build.location, build.output_path)
        by = f" by {mark.by}" if mark is not None and mark.by else ""
        forget_failed(build.location, build.output_path, job)
        what = (f"{job.backend} job {job.job_id} was stopped ({status.detail or 'by its backend'}"
                f"{by}) while this build waited for it, and no new job is submitted")  # fmt: skip
        raise self._cancelled(what, job)

    def _cancelled(self, what: str, job: JobRecord | None) -> RemoteJobError:
        """The build's end as stopped (cancelled), said in the log: final, never retried."""
        log.warning("cancelled %s: %s", self.step_id, what)
        return _final(what, "run again to submit a new job", self.step_id, job)

    def _job_spec(self, ctx: StepContext) -> JobSpec:
        """What the backend runs: the call, what the job does before it (the caller's context
        variables; the code check), the job's owner and its devices."""
        remote, build = self.remote, self.build
        env = _child_env(ctx, remote.gpus)
        expect = expected_code(self.step_id, build.recipe.code)  # the job checks it runs this
        call = call_payload(remote.run, ctx, self.step_id, "remote") + carried(self.step_id, expect)
        owner = job_owner(build.location.path(build.output_path), build.build_id)
        return JobSpec(self.step_id, call,
                       env={k: env[k] for k in ("CUDA_VISIBLE_DEVICES",) if k in env},
                       gpus=remote.gpus, ranks=remote.ranks,
                       rank_placement=str(remote.rank_placement),
                       placement_timeout=remote.placement_timeout, owner=owner)  # fmt: skip

    def _collect(self, job: JobRecord, watch: Watch) -> Any:
        """The job's value (its outcome's canonical JSON, as the record keeps it), or its
        error as text; the log tail goes into the step's log either way."""
        build, status = self.build, watch.status
        assert status is not None
        if self.remote.ranks > 1:  # before its files go: `marin show` lists them
            build.gang = {"ranks": job_ranks(job),
                          "rank_placement": str(self.remote.rank_placement)}  # fmt: skip
        tail = self.backend.logs(job.handle, LOG_TAIL_LINES)
        followed = watch.follow is not None and watch.follow.finished
        if tail and not followed:  # a followed job's output is in the log already
            sys.stdout.write(f"[{job.backend} job {job.job_id}]\n{tail}\n")  # into log.txt
        if status.state == JobState.SUCCEEDED and status.result is not None:
            build.job_ended_at = _iso(status.ended_at) or now_iso()
            try:
                outcome = Outcome.parse(status.result)
            except ValueError as exc:
                outcome = Outcome(
                    False, type="ValueError", message=f"an unreadable outcome ({exc})"
                )
            if outcome.ok:
                return Canonical(outcome.result)
            forget_failed(build.location, build.output_path, job)  # a retry submits a new job
            unplaced = placement_failure(status.result)
            if unplaced is not None:  # fn never ran: not its error, so no retry
                raise _final(f"{job.backend} job {job.job_id}: {unplaced}",
                             "the step was not retried (retries count fn's errors)",
                             self.step_id, job)  # fmt: skip
            error = _failed(self.step_id, job, outcome.summary(), tail, outcome.errno)
            raise error from outcome.error(self.step_id, f"{job.backend} job")
        forget_failed(build.location, build.output_path, job)
        detail = f"ended {status.state}" + (f" ({status.detail})" if status.detail else "")
        if status.state == JobState.STOPPED:  # cancelled (`marin cancel`): not retried
            raise _final(
                f"{job.backend} job {job.job_id} was stopped ({status.detail or 'by its backend'})",
                "run again to submit a new job",
                self.step_id,
                job,
            )
        lost = status.state == JobState.LOST
        if lost:
            detail += (f", after {job.preemptions} preemptions (max_preemptions="
                       f"{self.remote.max_preemptions})")  # fmt: skip
        error = _failed(self.step_id, job, detail, tail)
        error.final = lost  # past max_preemptions: not fn's error, so retries never spend it
        raise error


def _iso(epoch: float | None) -> str:
    """``epoch`` as a stored time ("" for None, or a value no clock gives)."""
    try:
        when = None if epoch is None else datetime.fromtimestamp(epoch, UTC)
        return "" if when is None else when.isoformat("T", "milliseconds")
    except (OverflowError, OSError, ValueError):
        return ""


def _job_record(
    backend: str,
    job_id: str,
    build: RemoteBuild,
    submitted_at: str,
    data: dict[str, str],
    scope: dict[str, str],
    preemptions: int,
) -> JobRecord:
    """The record of a job of ``build``: it names the recipe the job is submitted for, where
    its backend can see it, and the preemptions the build survived before it."""
    recipe = build.recipe
    return JobRecord(backend, job_id, build.build_id, submitted_at, data, recipe.fingerprint,
                     recipe.code, recipe.input_builds, recipe.placement, scope,
                     preemptions)  # fmt: skip


def _scope_of(backend: RemoteBackend, step_id: str) -> dict[str, str]:
    """Where ``backend`` sees the jobs it submits (its optional ``scope()``; none: anywhere).

    Raises:
        RemoteJobError: the backend cannot say (the ``local`` jobs root is unsafe).
    """
    scope = getattr(backend, "scope", None)
    if not callable(scope):
        return {}
    try:
        return dict(scope())
    except RemoteJobError as exc:
        raise for_step(exc, step_id) from None


def _known(build: RemoteBuild, job: JobRecord) -> None:
    """The job this attempt runs in: on the record, and on a resumable step's attempt."""
    build.job = job
    if build.on_job is not None:
        build.on_job(job)


def _final(what: str, fix: str, step_id: str, job: JobRecord | None) -> RemoteJobError:
    """The step's error for a job that ended in a way no retry changes (``final``)."""
    error = RemoteJobError(what, fix, step_id)
    error.final = True
    error.job = job.to_json() if job is not None else None
    return error


def _failed(
    step_id: str, job: JobRecord, what: str, tail: str, code: int | None = None
) -> RemoteJobError:
    """The step's error for a failed job: what failed, its log tail, and a full disk named
    as such: by the ``errno`` of its outcome, never by words it printed (a job can print
    anything)."""
    fix = "fix the cause, then run again (a new job is submitted)"
    if code == errno.ENOSPC:
        what = f"the disk was full (ENOSPC): {what}"
        fix = (
            "free space on the disk the job writes to (its output; a local job's folder under "
            f"{jobs_root_path()}), then run again (a new job is submitted)"
        )
    shown = f"the last lines of its log:\n{tail}" if tail.strip() else "its log is empty"
    error = RemoteJobError(f"{job.backend} job {job.job_id} failed: {what}; {shown}", fix, step_id)
    error.job = job.to_json()
    return error
