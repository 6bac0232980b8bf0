"""``build_step``: the one build/commit path that every runner uses.

The local ``StepRunner``, the Prefect tasks and the Airflow tasks all call this function, so a
local run, a Prefect run and an Airflow run on one prefix share one lease, one record and one
status file, and see each other's results.

The order of writes is the whole crash-safety story:
0. wait out any dependency whose lease another runner holds (it is being rebuilt), and read each
   dependency's record afresh: the builds this one consumes (``inputs.py``);
1. refuse an output path that holds data Marin did not write, then take the lease (held, it is
   the step's RUNNING status: no status file is written), then re-check: another runner may
   have finished meanwhile;
2. if an earlier attempt left anything (a record, a status file, or a lease this one took
   over), drop its status file and record, then clear the output path (only then: see
   ``_earlier_attempt``);
3. run ``fn`` under a lease heartbeat (``log.txt`` is created only if it prints);
4. check every dependency still holds the build this one started from (a rebuilder deletes the
   record before it touches the output, so this proves ``fn`` read whole inputs), and that the
   lease is still ours (a runner whose lease was taken over must not commit);
5. write the record (the commit point, and the SUCCESS status) under ``Lease.commit``, which
   re-proves ownership, then release the lease. A failure writes a FAILED status instead.
A crash anywhere before 5 leaves no record, so the step is simply not built, and leaves its
lease, which the next attempt takes over. A corrupt record reads as "not built"; a crashed local
record write leaves only a temporary file, cleared in 2. ``benchmarks/README.md`` counts the
storage calls this makes. ``marin.execution.faults`` names the crash points the tests kill
processes at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal, cast

from marin.execution.builder.attempt import (
    LeaseCheck,
    attempt_provenance,
    checkpoint_url,
    finish_attempt,
    record_attempt,
    running_here,
    start_attempt,
)
from marin.execution.builder.clearing import (
    check_clearable,
    clear_output,
    earlier_attempt,
    folder_in_the_way,
    freeze_mark_beside,
    output_left_by_marin,
    refuse_clearing_adopted,
    refuse_frozen,
    refuse_inside_another,
)
from marin.execution.builder.inputs import check_inputs_unchanged, inputs_at_start, urls
from marin.execution.builder.lease_wait import wait_out
from marin.execution.builder.lineage import build_finished, build_started
from marin.execution.builder.outcome import BuildOutcome, LeaseHeld, Pending
from marin.execution.builder.output_tree import OutputDigest, is_output_digest, output_digest
from marin.execution.builder.request import BuildRequest
from marin.execution.builder.step_logs import LazyLogFile, capture_step_output, lines_writer
from marin.execution.digest.code import mixed_digest
from marin.execution.errors import (
    AbandonedError,
    AdoptedDataError,
    ConfigError,
    InputChangedError,
    LeaseLostError,
    LeaseVanishedError,
    MarinError,
    RemoteJobError,
    StorageError,
    one_line,
)
from marin.execution.faults import crash_point
from marin.execution.ids import new_id
from marin.execution.pipeline.artifact import load_dependency
from marin.execution.pipeline.artifact_types import payload_of
from marin.execution.pipeline.canonical import Canonical, as_stored, not_utf8, to_canonical
from marin.execution.pipeline.context import StepContext, assigned_devices
from marin.execution.pipeline.isolation import StepTimeoutError
from marin.execution.pipeline.provenance import collect_provenance, now_iso
from marin.execution.pipeline.remote_option import JobToRun
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.decide import Decision, Policy, Stored, Upstream, decide
from marin.execution.plan.read import read_stored_step
from marin.execution.plan.scope import refuse_shared_write
from marin.execution.remote.call import RemoteBuild, pending_job, refuse_unreadable_job, run_job
from marin.execution.remote.cleanup import release_committed
from marin.execution.remote.code_check import check_code, expected_code
from marin.execution.remote.fence import (
    fence_local_build,
    fence_recorded,
    job_not_reused,
    remote_attempt,
)
from marin.execution.remote.wait import JobRunning
from marin.execution.store.identity import Recipe
from marin.execution.store.lease import (
    TTL_ENV,
    Heartbeat,
    Lease,
    LeaseInfo,
    enclosing,
    ttl_from_env,
)
from marin.execution.store.location import Location, durable
from marin.execution.store.placement import (
    ADOPTED,
    adopted_builds,
    adopted_inputs,
    unbuilt_step_folders,
)
from marin.execution.store.records import (
    ADOPTION,
    FAILED,
    REPLACES,
    RUNNING,
    STEP_FIELD,
    ArtifactRecord,
    ForeignRecord,
    clear_status,
    delete_record,
    lease_path,
    load_record,
    log_path,
    metadata_dir,
    metadata_files,
    read_record,
    read_status_file,
    replaced_build,
    shared_build,
    write_record,
    write_status,
)
from marin.execution.store.step_folder import (
    RECORD_FILE,
    read_job,
    remove_adoption_mark,
    write_adoption_mark,
)
from marin.execution.vocabulary import Action, BuildOutcomeKind, Leftover, Wait

__all__ = ["BuildOutcome", "BuildRequest", "LeaseHeld", "Pending", "build_step"]

log = logging.getLogger("marin")


def run_context(
    spec: StepSpec,
    location: Location,
    region: str | None = None,
    lease: Lease | None = None,
    recipe: Recipe | None = None,
) -> StepContext:
    """The run-time context of a build of ``spec``; ``lease`` answers ``still_holds_lease()``;
    an isolated step's process checks it imported the code of ``recipe`` (``code_check``)."""
    expect = None
    if recipe is not None and spec.isolate:  # its process imports fn when the step starts
        expect = expected_code(spec.step_id, recipe.code)
    check = None
    if expect is not None:
        check = functools.partial(check_code, expected=expect, where="isolated process")
    return StepContext(
        output_path=location.url_for(spec.output_path),
        prefix=location.url,
        region=region,
        dep_paths={dep.step_id: dep.data_url(location.url) for dep in spec.deps},
        runtime_args=spec.runtime_args or {},
        loader=functools.partial(load_dependency, location, spec),
        checkpoint_path=checkpoint_url(spec, location),
        lease_check=None if lease is None else LeaseCheck(lease),
        code_check=check,
    )


def warn_if_served_stale(decision: Decision) -> None:
    """The one warning for a step served although drifted (``warn``) or stale (no cascade)."""
    if not decision.served_with_warning:
        return
    for what, lines, joined in (
        ("drift %s: config changed without a version bump; serving the cached artifact (bump "
         "the version, or use the drift policy rebuild):\n  %s", decision.drift, "\n  "),
        ("stale %s: served without rebuilding (no cascade): %s", decision.stale, "; "),
        ("code drift %s: its code changed since it was built; serving the cached artifact "
         "(bump the version, --force it, or use the code drift policy rebuild):\n  %s",
         decision.code_drift, "\n  "),
    ):  # fmt: skip
        if lines:
            log.warning(what, decision.spec.step_id, joined.join(lines))


def read_upstream(spec: StepSpec, location: Location) -> list[Upstream]:
    """Each dependency's current record, for the decision and for the new record's lineage
    (without one, the build an unfinished rebuild of it deleted: its status, one more read)."""
    unique = {dep.step_id: dep for dep in spec.deps}
    return [_upstream_now(step_id, dep, location) for step_id, dep in unique.items()]


def _upstream_now(step_id: str, dep: StepSpec, location: Location) -> Upstream:
    record = read_record(location, dep.output_path, step=(dep.name, dep.version))
    if record is not None:
        return Upstream(step_id, record)
    status = read_status_file(location, dep.output_path)
    shared = shared_build(location, dep.output_path, dep.user_home)
    return Upstream(step_id, None, replaced=replaced_build(status), shared=shared)


def build_step(request: BuildRequest) -> BuildOutcome | Pending:
    """Make sure ``request.spec`` is built under ``request.location``; build it here if nobody
    has. Returns what it did (``BuildOutcome``), or, when it must wait for someone else and
    ``request.wait`` says not to wait here, ``Pending`` (``builder/outcome.py``).

    ``request.policy`` is the run's policy. ``request.decision`` is the plan's decision to build
    this step; without one, the step is decided here first, from its own record and ``upstream``
    (each dependency's current record; read when not given).
    Either way, after taking the lease the step is decided again if its record changed since,
    so a step another runner just built is served, not rebuilt.

    If this runner's lease is taken over while ``fn`` runs (it stalled past the TTL), its result
    is discarded, never committed; it then waits for the new holder and serves that runner's
    record ("built-by-other"), or raises ``LeaseLostError`` if the new holder did not commit.

    ``abandon``: once set (a second Ctrl-C in library mode), a build whose ``fn`` is still
    running keeps its lease until ``fn`` returns, and then never commits.

    Inputs: a build never starts from a dependency another runner is rebuilding (it waits for
    that runner's lease, then reads the dependency's record afresh: the new record's build is
    what this build consumes), and never commits when a dependency's build changed while it ran
    (``InputChangedError``, naming the dependency; nothing is committed).

    The other fields of ``request`` (``BuildRequest``):

    ``wait``: ``BLOCK`` waits here for another runner's lease on the step and for the step's
    remote job; ``RETURN`` returns ``Pending`` for both (having written nothing, for a lease:
    a run loop goes on with other steps meanwhile, drivers sharing one prefix); ``RETURN_JOB``
    for a job only.

    ``lease_ttl``: the lease duration; None reads ``$MARIN_LEASE_TTL`` once, here, before
    ``fn`` runs (a runner reads it once per run and passes it).

    ``working_dir``: the directory whose checkout the record's provenance names (its git state);
    None reads this process's working directory at the build. A run loop reads it once, when
    the run starts: the checkout the pipeline was launched from, even if a step's ``fn``
    changes directory meanwhile (a ``getcwd`` per build also handed the GIL to another build's
    thread, a cost on every build of a run).

    Raises:
        Exception: the step's own error (``fn`` raised: FAILED status, no record).
        DriftError: a drifted step under ``on_drift="error"`` (``CodeDriftError``: its code).
        ForeignRecordError: another step's record is in the way (nothing is written).
        AdoptedDataError: the step's output path holds data its current record adopted
            (nothing is written; final, never retried).
        LeaseLostError: the lease was taken over and the new holder did not commit.
        AbandonedError: ``abandon`` was set before the commit.
        InputChangedError: a dependency's build changed while this one ran.
    """
    if request.devices is None:
        return _build(request)
    with assigned_devices(request.devices):
        return _build(request)


def _build(request: BuildRequest) -> BuildOutcome | Pending:
    spec, location, policy = request.spec, request.location, request.policy
    decision, upstream = request.decision, request.upstream
    lease_ttl = request.lease_ttl
    if lease_ttl is None:  # read once, here, before fn runs
        lease_ttl = ttl_from_env()
        request = dataclasses.replace(request, lease_ttl=lease_ttl)
    url = location.url_for(spec.output_path)
    ups = list(upstream) if upstream is not None else read_upstream(spec, location)
    if decision is not None and decision.unless_unchanged:
        # Planned only because upstream steps are rebuilt in this run: now that they have
        # committed, the one decision function says whether their output changed (early cutoff).
        decision = decide(
            spec, Stored(decision.record, decision.stored_status), ups, policy, needed=True
        )
        if decision.action != Action.BUILD:
            log.info("skip %s: %s", spec.step_id, decision.reason)
    if decision is None:
        decision = decide(spec, read_stored_step(spec, location), ups, policy, needed=True)
    if decision.action != Action.BUILD:
        warn_if_served_stale(decision)
        record = decision.record
        assert record is not None  # needed=True: only a record is ever served
        return BuildOutcome(
            spec,
            BuildOutcomeKind.CACHED,
            record,
            url,
            drift=decision.drift,
            reason=decision.reason,
        )
    decision.raise_if_refused()  # another step's record is in the way: nothing is written
    refuse_shared_write(spec)  # a user-scope run only ever reads a shared build
    refuse_inside_another(location, spec)
    refuse_clearing_adopted(location, spec, decision.record, False)  # again under the lease

    ups = inputs_at_start(spec, location, ups, lease_ttl)
    crash_point("before-lease", spec.step_id)
    try:
        return _lease_and_build(request, decision, ups)
    except LeaseLostError as lost:
        return _after_lease_lost(request, ups, lost)


def _after_lease_lost(
    request: BuildRequest, ups: Sequence[Upstream], lost: LeaseLostError
) -> BuildOutcome:
    """This build's lease was taken over: wait for the runner that took over, and serve its
    record if it committed this very build; else raise ``lost``."""
    spec, location = request.spec, request.location
    log.warning("discard %s: %s", spec.step_id, lost.what)
    lease = Lease(location, spec.output_path, ttl=request.lease_ttl, adoption=spec.source)
    _acquire(lease, spec)  # wait for the runner that took over
    try:
        record = read_record(location, spec.output_path, step=(spec.name, spec.version))
        if record is None and lease.took_over:
            # That runner died too; keep the proof that Marin wrote here for the next one.
            _best_effort_status(location, spec, FAILED, error="interrupted (lease expired)")
    finally:
        lease.release()
    # The runner that took over finished this very build: serve it, even if it was forced.
    if record is not None and _served_from_other(
        spec, record, ups, _unforced(request.policy, spec)
    ):
        log.info("skip %s: built by another runner", spec.step_id)
        url = location.url_for(spec.output_path)
        return BuildOutcome(
            spec, BuildOutcomeKind.BUILT_BY_OTHER, record, url, reason="built by another runner"
        )
    raise lost


def _lease_and_build(
    request: BuildRequest, decision: Decision, upstream: Sequence[Upstream]
) -> BuildOutcome | Pending:
    """Take the step's lease, decide again if its record changed since, then build holding it
    (the lease is released when the build ends, not while it is pending).

    ``decision`` and ``upstream`` are the caller's, checked (not the request's: no copy of the
    request per build)."""
    spec, location, policy = request.spec, request.location, request.policy
    url = location.url_for(spec.output_path)
    output_seen = output_left_by_marin(location, spec)  # before the lease: see there
    lease = Lease(location, spec.output_path, ttl=request.lease_ttl, adoption=spec.source)
    holder = _first_acquire(lease, spec, location, request.wait)
    if holder is not None:  # another runner's live lease: nothing written, nothing held
        why = LeaseHeld(holder.holder, holder.expires_at)
        return Pending(spec, why, functools.partial(build_step, request))
    hold = _Kept()
    hold.callback(lambda: _release_after(lease, hold.still_running))
    with hold:
        crash_point("after-lease", spec.step_id)
        present = metadata_files(location, spec.output_path, remove_temporaries=True)
        found = (
            load_record(location, spec.output_path, step=(spec.name, spec.version))
            if RECORD_FILE in present
            else None
        )
        if isinstance(found, ForeignRecord):
            # Copied in after the plan: refused like any other step's record, never replaced.
            decide(spec, Stored(foreign=found), upstream, policy, needed=True).raise_if_refused()
            raise AssertionError(f"decide() must refuse to build over {found.path}")
        record = found
        # Someone committed after this run decided: decide again on that record. A build that
        # another runner committed since counts as this run's, even a forced one (two
        # concurrent `--force s` build s once), as on the lease-lost path.
        changed = _build_id(record) != _build_id(decision.record)
        unforced = _unforced(policy, spec)
        if (
            changed
            and record is not None
            and not (spec.step_id in policy.force and _collected_earlier_job(record))
            and _served_from_other(spec, record, upstream, unforced)
        ):
            log.info("skip %s: built by another runner", spec.step_id)
            return BuildOutcome(
                spec, BuildOutcomeKind.BUILT_BY_OTHER, record, url, reason="built by another runner"
            )
        earlier = earlier_attempt(present, lease, output_seen)
        # A freeze mark alone (a registered build with no output path, its record lost) is
        # still a build the registry may name: frozen_build asks it.
        marked = earlier is None and freeze_mark_beside(location, spec, present)
        # The recipe this build makes: the plan's static part, with the input builds it read.
        recipe = (decision.recipe or Recipe.of(spec)).consuming(upstream, policy.force)
        held = _Holding(
            request, lease, hold, upstream, decision.reason, earlier, record, recipe, marked=marked
        )
        try:
            return _build_holding(held)
        except StepTimeoutError as timed_out:
            hold.still_running, timed_out.still_running = timed_out.still_running, None
            raise


def _release_after(lease: Lease, still_running: threading.Event | None) -> None:
    """Release the lease, or, while a timed-out ``fn`` still runs on its abandoned thread, keep
    it (renewed) until that ``fn`` returns: no build may clear or fill an output that ``fn`` can
    still write into (its late files would be committed with the other build's)."""
    if still_running is None or still_running.is_set():
        lease.release()
        return

    def hold() -> None:
        with Heartbeat(lease):
            still_running.wait()
        lease.release()

    threading.Thread(target=hold, name=f"marin-fence-{lease.path}", daemon=True).start()


def _served_from_other(
    spec: StepSpec, record: ArtifactRecord, upstream: Sequence[Upstream], policy: Policy
) -> bool:
    """Whether another runner's ``record`` may be served, by the one decision function.

    Judged on the record's own lineage: an upstream rebuilt in this run is a known build by now,
    so only one whose record is missing still counts as "rebuilt". Drift is served under
    ``warn`` only from a record committed before the run: one another runner committed since,
    of another config or code, is not this run's build, so ``warn`` judges it as ``rebuild``.
    """
    known = [
        dataclasses.replace(u, rebuilt=u.rebuilt and u.record is None, committed=False)
        for u in upstream
    ]
    strict = dataclasses.replace(
        policy,
        on_drift="rebuild" if policy.on_drift == "warn" else policy.on_drift,
        on_code_drift="rebuild" if policy.on_code_drift == "warn" else policy.on_code_drift,
    )
    return decide(spec, Stored(record), known, strict, needed=True).action != Action.BUILD


def _collected_earlier_job(record: ArtifactRecord) -> bool:
    """Whether ``record`` was committed from a job an earlier build submitted (reattached or
    collected): never the forced build a ``--force`` run asked for, since forcing repairs that
    job's output. Read from the record (untrusted: a wrong answer only rebuilds)."""
    job = record.provenance.get("job") if isinstance(record.provenance, dict) else None
    return isinstance(job, dict) and job.get("build_id") not in (None, record.build_id)


def _unforced(policy: Policy, spec: StepSpec) -> Policy:
    """``policy`` without forcing ``spec``: for judging a build another runner committed after
    this run decided, which is the forced build this run asked for."""
    if spec.step_id not in policy.force:
        return policy
    return dataclasses.replace(policy, force=policy.force - {spec.step_id})


def _build_id(record: ArtifactRecord | None) -> str | None:
    return None if record is None else record.build_id


def _first_acquire(
    lease: Lease, spec: StepSpec, location: Location, wait: Wait
) -> LeaseInfo | None:
    """``_acquire``, the build's first write, refusing a file where the step folder (or a
    folder above the output) must be as a plan does (``folder_in_the_way``): looked for only
    once the lease fails on it, so that no other build pays a look for it.

    Raises:
        NotAFolderError: such a file is there (nothing was written).
    """
    try:
        return _acquire(lease, spec, wait)
    except NotADirectoryError:
        refusal = folder_in_the_way(location, spec)
        if refusal is None:
            raise
        raise refusal from None


def _acquire(lease: Lease, spec: StepSpec, wait: Wait = Wait.BLOCK) -> LeaseInfo | None:
    """Take the lease, waiting with bounded, jittered backoff while someone else holds it; under
    ``Wait.RETURN``, return the live holder at once instead (None: taken)."""
    here = wait != Wait.RETURN
    return wait_out(spec, spec.step_id, lease.try_acquire, "lease held by", here=here)


@contextlib.contextmanager
def _step_log(location: Location, spec: StepSpec, earlier: bool) -> Iterator[IO[str]]:
    """The step's ``log.txt``, only if it printed something: streamed on local disk, written
    once at the end elsewhere. An ``earlier`` attempt's log is removed when this one is silent,
    so a log beside a record is always that build's."""
    path = location.path(log_path(spec.output_path))
    if location.is_local:
        lazy = LazyLogFile(path)
        try:
            yield cast(IO[str], lazy)  # write and flush: all capture_step_output needs
        finally:
            if not lazy.close() and earlier:
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    os.unlink(path)
        return
    with _log_buffer(spec) as buf:
        try:
            yield buf
        finally:
            try:
                buf.seek(0)
                text = buf.read()
                if text:
                    location.put_file(path, text.encode())
                elif earlier:
                    with contextlib.suppress(FileNotFoundError):
                        location.fs.rm_file(path)
            except OSError as exc:
                log.warning("could not write the log of %s: %s", spec.step_id, exc)


def _log_buffer(spec: StepSpec) -> IO[str]:
    """Where a step's prints wait for ``log.txt`` off local disk: memory for ``fn``'s own, a
    file past a MiB for a remote job's, which streams in for as long as the job runs."""
    if spec.remote is None:
        return io.StringIO()
    # Closed by _step_log's with.
    spooled = tempfile.SpooledTemporaryFile(1 << 20, "w+", encoding="utf-8", errors="replace")  # noqa: SIM115
    return cast(IO[str], spooled)


_MEMORY_FIRST_BUILD = (
    "memory:// digests an output when it is rebuilt only (finding a first build's files "
    "would scan the whole process-wide store, for every step)"
)


def _output_digest(
    location: Location, spec: StepSpec, first_build: bool, result: Any
) -> OutputDigest:
    """The digest this build commits: of what its readers get, or unknown where it cannot be
    cheap."""
    if spec.source is not None:
        return OutputDigest(None, unknown="an adopted step's data was not built by Marin")
    if location.is_memory and first_build and location.exists(location.path(spec.output_path)):
        # Nothing there is one lookup, and a digest of no files: what proves later files at the
        # output path are not this build's (red team r25-6).
        return OutputDigest(None, unknown=_MEMORY_FIRST_BUILD)
    return output_digest(
        location,
        location.path(spec.output_path),
        result=result,
        artifact_type=spec.artifact_type,
        fingerprint=spec.fingerprint,
    )


def _replaced_digest(
    location: Location, spec: StepSpec, previous: ArtifactRecord | None, lease: Lease
) -> dict[str, str]:
    """The build being replaced -> its output digest, when its bytes are still the ones its
    record claims: digested now, before they are cleared.

    Its dependents were built from what was there, not from what the record claims: an output
    changed after its commit (a hand edit, another step's ``fn``) gives nothing here, so they
    are not cut off (``decide._consumed_digest``). A record that claims no digest (or one of an
    older scheme) cannot be checked, and is not digested at all.
    """
    if previous is None or not previous.build_id or spec.source is not None:
        return {}
    claimed = previous.output.digest
    if claimed is None or not is_output_digest(claimed):
        return {}
    with Heartbeat(lease):  # hashing a large local output takes a while
        there = output_digest(
            location,
            location.path(spec.output_path),
            result=previous.result,
            artifact_type=previous.artifact_type,
            fingerprint=previous.fingerprint,
        )
    if there.digest != claimed:
        # Changed bytes are news (a hand edit, another step's fn); an unknown digest is not.
        log.log(
            logging.INFO if there.digest is None else logging.WARNING,
            "clear %s: its output is not what its record claimed (%s); what was built from it "
            "is rebuilt",
            spec.step_id,
            there.unknown or "changed since its commit",
        )
        return {}
    return {**_same_bytes_before(previous, claimed), previous.build_id: claimed}


_REPLACED_KEPT = 32
"""How many earlier builds of identical bytes a record names (oldest dropped first)."""


def _same_bytes_before(previous: ArtifactRecord, claimed: str) -> dict[str, str]:
    """The builds ``previous`` replaced whose bytes were, verified, the ones it holds now.

    Their readers read exactly these bytes, so they are cut off as its own readers are: the
    chain of verified identical outputs carries over a rebuild (otherwise a reader served by
    cutoff is rebuilt at the next rebuild of its upstream). A build of other bytes ends it.
    """
    same = [
        (build, digest)
        for build, digest in previous.replaced.items()
        if isinstance(build, str) and digest == claimed and build != previous.build_id
    ]
    return dict(same[-(_REPLACED_KEPT - 1) :])


def _fsync_tree(path: str) -> None:
    """Durable mode: flush an output (file or folder) to disk before the record commits it."""
    targets = [path]
    if os.path.isdir(path):
        targets = [os.path.join(root, name) for root, dirs, files in os.walk(path)
                   for name in [*files, *dirs]] + [path]  # fmt: skip
    for target in targets:
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _canonical_result(raw_result: Any, spec: StepSpec) -> Any:
    """``fn``'s returned value as the record keeps it (plain JSON data), or a clear error."""
    if isinstance(raw_result, Canonical):  # made by the process fn ran in (a job's outcome)
        value = raw_result.value
    else:
        try:
            # A typed artifact (Marin's ``run`` returns one) is recorded as its value's fields.
            value = to_canonical(payload_of(raw_result), "result", spec.step_id, text_keys=True)
        except ConfigError as exc:
            raise ConfigError(
                f"fn returned a value with no JSON form ({exc.what})",
                "return plain data (str, numbers, lists, dicts) or None; write big values "
                "to the output path",
                spec.step_id,
            ) from None
    where = not_utf8(value, "result")
    if where is not None:  # else the record's write fails with the encoder's own error
        raise ConfigError(
            f"fn returned text that is not valid Unicode (a lone surrogate) at {where}",
            "return text that encodes as UTF-8, and bytes as bytes",
            spec.step_id,
        )
    return value


def _best_effort_status(location: Location, spec: StepSpec, state: str, **details: Any) -> None:
    """A status write that must not hide the error being reported (storage may be failing).
    An adopted step's says so (``ADOPTION``): its attempt never wrote the output path."""
    if spec.source is not None:
        details[ADOPTION] = spec.source
    details.setdefault(STEP_FIELD, spec.step_id)
    try:
        write_status(location, spec.output_path, state, **details)
    except OSError as exc:
        log.warning("could not write %s status for %s: %s", state, spec.step_id, exc)


def _run_with_config(spec: StepSpec, config: Any) -> Callable[[StepContext], Any]:
    """``spec.run``, given the config the build has made already when ``run`` would only make
    the same one again (``apply()``'s plain call: no guard, no isolation, no timeout)."""
    with_config = getattr(spec.run, "with_config", None)
    if with_config is None or getattr(spec.run, "build_config", None) != spec.build_config:
        return spec.run
    return lambda ctx: with_config(ctx, config)


class _Kept(contextlib.ExitStack):
    """An exit stack a pending build leaves open (``keep``): its ``resume`` enters it again, and
    it closes when the build ends. (Nothing in it swallows an exception.)"""

    keep = False
    still_running: threading.Event | None = None
    """A timed-out ``fn`` still running on its abandoned thread (``_release_after``)."""

    def __exit__(self, *exc_info: Any) -> Literal[False]:
        if exc_info[1] is not None or not self.keep:
            self.keep = False
            super().__exit__(*exc_info)
        return False


@dataclass(eq=False)
class _Holding:
    """One attempt at a build under its held lease: what its phases share. A remote step's
    build pending while its job runs (``remote/wait.py``) is picked up from here by its
    ``resume``, on another thread."""

    request: BuildRequest
    lease: Lease
    kept: _Kept
    """Open until the attempt ends: the lease (released last) and its place in
    ``_running_here``."""
    upstream: Sequence[Upstream]
    reason: str
    earlier: Leftover | None
    previous: ArtifactRecord | None
    recipe: Recipe
    """What this build makes (``store/identity.py``): an attempt or a job is reused only for it."""
    started_at: str = field(default_factory=now_iso)
    t0: float = field(default_factory=time.perf_counter)
    build_id: str = field(default_factory=new_id)
    """Known from the start: the OpenLineage run id."""
    running: _Kept = field(default_factory=_Kept)
    """Open until fn's output is digested: the lease's heartbeat and the step's log."""
    replaced: dict[str, str] = field(default_factory=dict)
    replacing: str = ""
    """The build id this attempt replaces (``_mark_replacing``): its status names it."""
    attempt: Any = None
    """A resumable step's attempt (``start_attempt``), else None."""
    marked: bool = False
    """A freeze mark with no record or status beside it (``freeze_mark_beside``): the lost
    record of a build that may be registered, refused as one (``refuse_frozen``)."""
    remote: RemoteBuild | None = None
    ctx: StepContext = field(init=False)
    lineage_run: Any = field(init=False)
    config: Any = field(init=False)
    heartbeat: Heartbeat = field(init=False)
    step_log: IO[str] = field(init=False)
    spec: StepSpec = field(init=False)
    location: Location = field(init=False)

    def __post_init__(self) -> None:
        self.spec, self.location = self.request.spec, self.request.location  # read often


def _build_holding(held: _Holding) -> BuildOutcome | Pending:
    """Build the step holding its lease: clear what an earlier attempt left, run ``fn``,
    commit its record (a remote step's build may be pending meanwhile, while its job runs)."""
    spec, location, request = held.spec, held.location, held.request
    # A registered build is never replaced (nor one whose record was lost: its leftovers).
    refuse_frozen(location, spec, held.previous, held.earlier is not None or held.marked)
    refuse_clearing_adopted(location, spec, held.previous, held.earlier is not None)
    _refuse_unclearable(held)
    held.kept.enter_context(_started_here(location, spec.output_path, spec.source))
    _clear_earlier(held)
    # No folder to make: the lease's folder sits beside the output, so its parent exists.
    held.ctx = run_context(spec, location, request.region, held.lease, held.recipe)
    held.lineage_run = build_started(spec, location, held.upstream, held.build_id)  # None: off
    return _committed(held, functools.partial(_start_fn, held))


def _refuse_unclearable(held: _Holding) -> None:
    """Refuse to clear an output that holds another step's metadata (``check_clearable``) or
    that a job may still write (a ``job.json`` that cannot be read, a job of an earlier remote
    build still running), keeping a dead attempt's proof that Marin wrote here if one refuses
    (nothing else is written then): its lease, taken over, goes when this one is released, and
    the next run, once the job is stopped, must still find the output Marin's to clear."""
    spec, location, earlier = held.spec, held.location, held.earlier
    try:
        if earlier is not None:
            check_clearable(location, spec)
        if spec.remote is not None:  # its job may still write the output: nothing is cleared
            refuse_unreadable_job(location, spec.output_path, spec.step_id, spec.remote)
        elif earlier is not None:  # a job of its earlier remote builds may still write it
            fence_local_build(location, spec)
    except (StorageError, RemoteJobError) as exc:
        if held.lease.took_over:
            _best_effort_status(location, spec, FAILED, error=exc.what)
        raise


def _clear_earlier(held: _Holding) -> None:
    """Digest the build being replaced, start a resumable step's attempt, and clear what an
    earlier attempt left (its status, its record, then its output)."""
    spec, location, earlier = held.spec, held.location, held.earlier
    held.replaced = _replaced_digest(location, spec, held.previous, held.lease)
    if spec.remote is not None:  # before a resume: no job it must not reuse writes then
        _fence_unreusable_job(held)
    on_code_drift = held.request.policy.on_code_drift
    held.attempt = start_attempt(location, spec, held.lease, earlier, on_code_drift, held.recipe,
                                 held.request.run)  # fmt: skip
    if earlier is not None:
        _clear_leftovers(held)
    # Only now, the output cleared: a crash while clearing leaves no attempt to resume.
    record_attempt(location, spec, held.attempt, held.recipe, held.request.run)


def _clear_leftovers(held: _Holding) -> None:
    """Clear what an earlier attempt left: its status, its record, then its output (kept when
    resumed, or while a remote step's job may write it)."""
    spec, location, earlier = held.spec, held.location, held.earlier
    # A remote step's unfinished job may be writing its output: it is reattached.
    keep = spec.remote is not None and pending_job(
        location, spec.output_path, built=earlier == Leftover.BUILD
    )
    if not held.lease.renew():  # the fence: a holder that stalled since it took the lease
        raise _lost(location, spec, held.lease)  # never deletes what a new holder committed
    _mark_replacing(held)
    delete_record(location, spec.output_path)
    if spec.source is None:  # refuse_clearing_adopted let it clear: no adopted data is there
        remove_adoption_mark(location, spec.output_path)
    if (held.attempt is None or not held.attempt.resumed) and not keep:
        crash_point("before-clear", spec.step_id)  # the record gone, the output not yet
        clear_output(location, spec, built=earlier == Leftover.BUILD)


def _fence_unreusable_job(held: _Holding) -> None:
    """A remote step's recorded job is never reattached or collected by a forced build (not
    this run's own: the job an Airflow task resumes from deferral is its own), nor over an
    output ``marin gc`` was deleting (``job_not_reused``): it is cancelled, confirmed ended
    and forgotten, and the output cleared or resumed only then."""
    spec, request = held.spec, held.request
    forced = held.recipe.step_id in held.recipe.repaired
    if forced and request.awaited_job:
        forced = request.awaited_job != getattr(read_job(held.location, spec.output_path),
                                                "job_id", None)  # fmt: skip
    why = job_not_reused(forced, read_status_file(held.location, spec.output_path))
    if why:
        fence_recorded(held.location, spec, why)


def _mark_replacing(held: _Holding) -> None:
    """Before the record goes: a RUNNING status naming the build this one replaces (the
    record's, or the one an earlier unfinished attempt named), so that what read it stays
    stale if this attempt never commits (``records.REPLACES``); else no status: the held
    lease says RUNNING."""
    location, path = held.location, held.spec.output_path
    previous = held.previous
    if previous is not None and previous.build_id:
        held.replacing = previous.build_id
    else:
        held.replacing = replaced_build(read_status_file(location, path))
    if not held.replacing:
        clear_status(location, path)
        return
    adoption = {ADOPTION: held.spec.source} if held.spec.source is not None else {}
    write_status(location, path, RUNNING, holder=held.lease.holder, started_at=held.started_at,
                 **{REPLACES: held.replacing}, **adoption)  # fmt: skip


def _committed(held: _Holding, value: Callable[[], Any]) -> BuildOutcome | Pending:
    """Get fn's value from ``value`` (``_start_fn``; or a running job's collection), commit it
    as the step's record, and end the attempt: BUILT, or FAILED if anything raises. A build
    whose job runs keeps everything open and returns ``Pending``."""
    spec = held.spec
    try:
        with held.running:  # the heartbeat: hashing a large local output takes a while
            raw_result = value()
            if isinstance(raw_result, JobRunning):
                return _pending(held, raw_result)
            if durable() and held.location.is_local:
                _fsync_tree(held.location.path(spec.output_path))
            result = _canonical_result(raw_result, spec)
            output = _output_digest(held.location, spec, held.previous is None, result)
        crash_point("after-output", spec.step_id)
        record = _record_of(held, result, output)
        _commit(held, record)
    except BaseException as exc:
        _attempt_failed(held, exc)
        raise
    build_finished(held.lineage_run, None, record)
    crash_point("after-record", spec.step_id)
    return BuildOutcome(spec, BuildOutcomeKind.BUILT, record, held.ctx.output_path,
                        duration_s=record.duration_s, reason=held.reason)  # fmt: skip


def _lost_under_fn(
    held: _Holding, exc: BaseException
) -> LeaseLostError | LeaseVanishedError | None:
    """The error of a build whose fn raised ``exc`` after the build lost its lease (None: fn's
    error stands): ``marin gc`` reclaimed its folder (its heartbeat stalled past the TTL), or
    another runner took over and cleared its output, so fn may have failed only because its
    files vanished. The loss is the error, ``exc`` named as what followed. Marin's own errors
    keep their own say."""
    if not isinstance(exc, Exception) or isinstance(exc, MarinError) or not _lease_lost(held):
        return None
    return _lost(held.location, held.spec, held.lease, raised=exc)


def _lease_lost(held: _Holding) -> bool:
    """Whether this build no longer holds its lease, as its heartbeat saw or one renewal
    proves now (fn may fail before the heartbeat's next beat). Unknown (storage failing, fn
    never started, or the lease released under it by a Ctrl-C): False, fn's error stands."""
    heartbeat = getattr(held, "heartbeat", None)
    if heartbeat is None or not held.lease.held_here:
        return False
    if heartbeat.lost.is_set():
        return True
    try:
        return not held.lease.renew()
    except OSError:
        return False


def _pending(held: _Holding, running: JobRunning) -> Pending:
    """The build waits for its job: everything it holds stays open until ``resume`` (or
    ``release``); a build abandoned meanwhile gives up at once instead."""
    abandon = held.request.abandon
    if abandon is not None and abandon.is_set():
        running.forget()
        raise AbandonedError(
            f"abandoned after an interrupt while {running.job.backend} job "
            f"{running.job.job_id} ran: nothing is committed; the job runs on",
            "run again: the next run reattaches to the job",
            held.spec.step_id,
        )
    held.kept.keep = held.running.keep = True
    resume = functools.partial(_resumed, held, running)
    return Pending(held.spec, running, resume, functools.partial(_given_up, held, running))


def _start_fn(held: _Holding) -> Any:
    """Make the config, then call ``fn`` under the lease's heartbeat, into the step's log; a
    remote step's call is run as its job (``remote/call.py``)."""
    spec, ctx = held.spec, held.ctx
    made = spec.build_config(ctx)
    held.config = to_canonical(made, "config", spec.step_id)  # a copy: fn may mutate made
    run = _run_with_config(spec, made)
    held.heartbeat = held.running.enter_context(Heartbeat(held.lease))
    held.step_log = held.running.enter_context(
        _step_log(held.location, spec, held.earlier is not None)
    )

    def call() -> Any:
        value = run(ctx)
        if not isinstance(value, JobToRun):
            return value
        request, location = held.request, held.location
        held.remote = RemoteBuild(location, spec.output_path, held.build_id, held.heartbeat.lost,
                                  held.recipe, request.policy.on_code_drift, request.wait,
                                  on_lines=lines_writer(), holds=held.lease.renew,
                                  lease_token=held.lease.token,
                                  awaited_job=request.awaited_job,
                                  **remote_attempt(location, spec, held.attempt))  # fmt: skip
        return run_job(value, held.remote)

    return _into_step_log(held, call)


def _into_step_log(held: _Holding, value: Callable[[], Any]) -> Any:
    """``value()`` with its prints in the step's log (and its traceback, if it raises), marked
    as running under the step's lease."""
    spec, location = held.spec, held.location
    with (
        capture_step_output(held.step_log, label=spec.step_id),
        enclosing(held.lease),
        running_here(location, spec),
    ):
        try:
            return value()
        except LeaseLostError:
            raise  # the step's log is the new holder's now: nothing is written into it
        except BaseException as exc:
            lost = _lost_under_fn(held, exc)  # asked first: a log write re-creates the folder
            if lost is not None:  # the folder is gc's or the new holder's: nothing written there
                raise lost from exc
            # Into the file only: the error message points here for the details.
            held.step_log.write(traceback.format_exc())
            raise


def _resumed(held: _Holding, running: JobRunning) -> BuildOutcome | Pending:
    """A pending remote build, once its job ended (or its lease was lost): collect the job and
    commit, on whatever thread resumes it, as ``build_step`` would have on one thread."""
    request = held.request
    devices = request.devices
    held.kept.keep = held.running.keep = False
    try:
        with (
            contextlib.nullcontext() if devices is None else assigned_devices(devices),
            held.kept,
        ):
            return _committed(held, lambda: _into_step_log(held, running.collect))
    except LeaseLostError as lost:
        return _after_lease_lost(request, held.upstream, lost)


def _given_up(held: _Holding, running: JobRunning, error: BaseException | None) -> None:
    """``Pending.release``: the build never commits; its lease, heartbeat and log go, and its
    end is recorded (``error``), or nothing is when it is built again later (None)."""
    running.forget()
    held.kept.keep = held.running.keep = False
    try:
        _attempt_failed(held, error)
    finally:
        held.running.close()
        held.kept.close()


def _record_of(held: _Holding, result: Any, output: OutputDigest) -> ArtifactRecord:
    """The record this build commits."""
    spec, location, upstream, ctx = held.spec, held.location, held.upstream, held.ctx
    duration = time.perf_counter() - held.t0
    finished_at = now_iso()
    provenance: dict[str, Any] = {
        **collect_provenance(finished_at, held.request.working_dir),
        "lowered": dict(spec.provenance),
        **attempt_provenance(held.attempt),
    }
    code = held.recipe.code
    if held.remote is not None and held.remote.job is not None:
        provenance["job"] = held.remote.job.to_json(code=False)  # which job built it
        provenance["job"].update(held.remote.gang)  # a gang's ranks: host, state of each
        if held.remote.job_ended_at:
            provenance["job"]["ended_at"] = held.remote.job_ended_at  # its own end: timing.py
        code = held.remote.job.code  # the code it ran (other, reattached under warn: drift)
        if held.remote.job.build_id != held.build_id and "attempt" in provenance:
            # Reattached to (or collected) an earlier driver's job: that one job ran from
            # start to end, so this attempt resumed nothing (its code is still mixed below).
            provenance["attempt"] = {**provenance["attempt"], "resumed": False}
            provenance.pop("earlier_attempts_s", None)
    if held.attempt is not None and held.attempt.resumed:
        code = mixed_digest(held.attempt.code, code)  # resumed across a code change: both
    inputs = {u.step_id: u.record.build_id for u in upstream if u.record is not None}
    dep_paths = dict(ctx.dep_paths)
    source = spec.data_url(location.url) if spec.source is not None else None
    extra = _adopted_into(location, spec, source, inputs, dep_paths)
    return ArtifactRecord(
        name=spec.name,
        version=spec.version,
        fingerprint=spec.fingerprint,
        fingerprint_payload=spec.fingerprint_payload,
        config=as_stored(held.config),
        dep_paths=dep_paths,
        output_path=ctx.output_path,
        result=as_stored(result),
        provenance=provenance,
        started_at=held.started_at,
        finished_at=finished_at,
        duration_s=round(duration, 6),
        artifact_type=spec.artifact_type,
        build_id=held.build_id,
        inputs=inputs,
        code=code,
        output=output,
        input_digests={
            u.step_id: u.record.output.digest
            for u in upstream
            if u.record is not None and u.record.output.digest is not None
        },
        replaced=held.replaced,
        source=source,
        extra=extra,
    )


def _adopted_into(
    location: Location,
    spec: StepSpec,
    source: str | None,
    inputs: dict[str, str],
    dep_paths: dict[str, str],
) -> dict[str, Any]:
    """Add the builds an adoption's data lies in or holds to its record's ``inputs`` and
    ``dep_paths`` (lineage); return its ``extra``, which names each by output path (a rebuild
    of one makes the adoption stale). Nothing for a step that is not adopted.

    Raises:
        InputChangedError: a build the data lies in or holds is being built now.
        AdoptedDataError: it lies in or holds a step's output path with no build (a failed
            or crashed attempt's): that step's next build would clear it.
    """
    if source is None:
        return {}
    output_path = spec.output_path
    unbuilt = unbuilt_step_folders(location, output_path, source)
    if any(unbuilt.values()):
        raise InputChangedError(
            f"the data it adopts ({source}) lies in or holds "
            f"{urls(location, [p for p, live in unbuilt.items() if live])}, which another "
            "runner is building now (a live lease, no record yet); nothing was recorded",
            "run again once that build is committed",
            spec.step_id,
        )
    if unbuilt:
        raise AdoptedDataError(
            f"the data it adopts ({source}) lies in or holds {urls(location, list(unbuilt))}, "
            "the output path of a step with no build there (an attempt of it failed or "
            "crashed): that step's next build would clear it; nothing was recorded",
            "move the data out of that step's output path first (or adopt it in place, as "
            "that very step's name and version)",
            spec.step_id,
        )
    adopted = adopted_builds(location, output_path, source)
    inputs.update(adopted_inputs(adopted))
    dep_paths.update({record.step_id: location.url_for(path) for path, record in adopted.items()})
    return {ADOPTED: {path: r.build_id for path, r in adopted.items()}} if adopted else {}


def _commit(held: _Holding, record: ArtifactRecord) -> None:
    """Write the record, the commit point, only while provably holding the lease, with every
    input still the build it started from and no interrupt abandoning it."""
    spec, location, lease = held.spec, held.location, held.lease
    abandon = held.request.abandon
    if abandon is not None and abandon.is_set():
        raise AbandonedError(
            "abandoned after an interrupt: fn finished, but its result is not committed",
            "run again to build it",
            spec.step_id,
        )
    check_inputs_unchanged(spec, location, held.upstream)
    if record.source is not None:
        # Before the record: with it torn or deleted, the mark still says that whatever lies
        # at the output path (the data, adopted in place, or put there since) is not Marin's.
        write_adoption_mark(location, spec.output_path, record.source)
    if held.heartbeat.lost.is_set() or not lease.commit(
        lambda: write_record(location, record, spec.output_path),
        release=not spec.resumable,  # its checkpoints go first, under the lease
    ):
        raise _lost(location, spec, lease)
    if held.replacing:  # committed: the status naming the build it replaced is done
        try:
            clear_status(location, spec.output_path)
        except OSError as exc:
            log.warning("could not remove the status of %s: %s", spec.step_id, exc)
    finish_attempt(location, spec)
    release_committed(held.remote)  # the job's files (payload, log, result) go


def _attempt_failed(held: _Holding, exc: BaseException | None) -> None:
    """The attempt ended with ``exc``: its lineage FAIL/ABORT, and its FAILED status (not for a
    lost lease, whose new holder owns the status). None: it did not end, it was put off (an
    Airflow task deferring while its job runs): a lineage ABORT only, its resume starts anew."""
    if exc is None:
        build_finished(held.lineage_run, abort="deferred while its job runs")
        return
    build_finished(held.lineage_run, exc)
    if isinstance(exc, LeaseLostError):
        return
    spec = held.spec
    _best_effort_status(
        held.location,
        spec,
        FAILED,
        holder=held.lease.holder,
        started_at=held.started_at,
        finished_at=now_iso(),
        error=f"{type(exc).__name__}: {exc}",
        traceback="".join(traceback.format_exception(exc, limit=20)),
    )  # keeps the REPLACES of the RUNNING status it overwrites (``write_status``)


def _lost(
    location: Location, spec: StepSpec, lease: Lease, raised: BaseException | None = None
) -> LeaseLostError | LeaseVanishedError:
    """Why this build no longer holds its lease, truthfully: another runner took it over
    (``LeaseLostError``: the caller then serves that runner's build), or it was deleted and
    nobody took over (``LeaseVanishedError``). Only this rare path looks at storage for it.
    ``raised``: fn's exception, when fn failed after the loss (named as what followed it)."""
    then = "" if raised is None else f"; fn then failed ({one_line(raised)})"
    taken = LeaseLostError(
        f"lost the lease while building; another runner took over{then}",
        "nothing was committed by this runner; its result is discarded",
        spec.step_id,
    )
    if not lease.vanished:
        return taken
    folder = metadata_dir(spec.output_path)
    url = location.url_for(folder)
    # No lease file. On local disk the lease's lock found whether its whole folder went.
    gone = lease.folder_gone or (
        not location.is_local and not location.exists(location.path(folder))
    )
    if not gone:
        # A runner that took over and finished released the lease: its record or its FAILED
        # status is there (a status left by `marin unlock` says so).
        if read_record(location, spec.output_path, step=(spec.name, spec.version)) is not None:
            return taken
        status = read_status_file(location, spec.output_path)
        if status is not None and "marin unlock" not in str(status.get("error", "")):
            return taken
    if gone:
        what, fix = _folder_deleted(url, lease)
    else:
        what = (
            f"the step's lease {location.url_for(lease_path(spec.output_path))} was deleted "
            "while fn ran (broken with `marin unlock`, or by hand)"
        )
        fix = "run again; nothing was committed by this attempt"
    return LeaseVanishedError(what + then + "; its result is discarded", fix, spec.step_id)


GC_RECLAIMS = "reclaims the folder of a build whose lease looked dead"
KEEP_THE_LEASE = (
    f"use a longer lease ({TTL_ENV}) and keep its heartbeat renewing it (a process that is not "
    "paused, suspended or starved of CPU), so that `marin gc` never takes a live build for a "
    "dead one"
)


def _folder_deleted(url: str, lease: Lease) -> tuple[str, str]:
    """What and fix of a build whose metadata folder was deleted while ``fn`` ran: by ``marin
    gc`` reclaiming what looked like a dead build (its lease unrenewed past its TTL: the
    heartbeat stalled), by ``fn`` itself, or by hand. A lapsed lease names gc first."""
    what = f"the step's metadata folder {url} was deleted while fn ran"
    lapsed = time.monotonic() - lease.renewed_at
    if lease.renewed_at and lapsed > lease.ttl:
        return (
            f"{what}: its lease went unrenewed for {lapsed:.0f}s, past its TTL of "
            f"{lease.ttl:g}s, and `marin gc` {GC_RECLAIMS} (else fn, or someone by hand, "
            "deleted it)",
            f"run again (nothing was committed by this attempt); {KEEP_THE_LEASE}",
        )
    return (
        f"{what}: by fn, by hand, or by `marin gc`, which {GC_RECLAIMS} (expired, or its "
        "holder's process gone)",
        "run again; fn must write only at the output path, never under its .marin folder; if "
        f"`marin gc` reclaimed it, {KEEP_THE_LEASE}",
    )


@contextlib.contextmanager
def _started_here(location: Location, output_path: str, adoption: str | None) -> Iterator[None]:
    """While this process's attempt runs (past its checks, lease held): see ``mark_interrupted``."""
    with _running_lock:
        _running_here[(location.url, output_path)] = (location, adoption)
    try:
        yield
    finally:
        with _running_lock:
            _running_here.pop((location.url, output_path), None)


_running_lock = threading.Lock()
_running_here: dict[tuple[str, str], tuple[Location, str | None]] = {}
"""Steps whose attempt this process started (past its checks) and that have not ended."""


def mark_interrupted() -> None:
    """The process is about to exit mid-build: mark FAILED exactly the attempts it started.

    Only attempts past their checks are marked: a step still waiting for its lease wrote
    nothing, and a FAILED status would wrongly claim Marin wrote its output folder.
    """
    with _running_lock:
        attempts = list(_running_here.items())
    for (_, path), (location, adoption) in attempts:
        with contextlib.suppress(OSError):  # an adoption's says so: it never wrote the output
            mark = {ADOPTION: adoption} if adoption is not None else {}
            write_status(location, path, FAILED, error="interrupted", **mark)
