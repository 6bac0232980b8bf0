"""``build_step``: the one build/commit path that every runner uses.

The local ``StepRunner``, the Prefect tasks and the Airflow tasks all call this function, so a
local run, a Prefect run and an Airflow run on one prefix share one lease, one record and one
status file, and see each other's results.

The order of writes is the whole crash-safety story:
1. refuse an output path that holds data Marin did not write, then take the lease (held, it is
   the step's RUNNING status: no status file is written), then re-check: another runner may
   have finished meanwhile;
2. if an earlier attempt left anything (a record, a status file, or a lease this one took
   over), drop its status file and record, then clear the output path (only then: see
   ``_earlier_attempt``);
3. run ``fn`` under a lease heartbeat (``log.txt`` is created only if it prints);
4. check the lease is still ours (a runner whose lease was taken over must not commit);
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
import random
import threading
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, cast

from marin.execution.artifact import load_dependency
from marin.execution.canonical import to_canonical
from marin.execution.context import StepContext
from marin.execution.decide import Decision, Policy, Stored, Upstream, decide
from marin.execution.errors import AbandonedError, ConfigError, LeaseLostError, StorageError
from marin.execution.executors import Deferred
from marin.execution.faults import crash_point
from marin.execution.inspect import read_stored_step
from marin.execution.lease import Heartbeat, Lease
from marin.execution.names import METADATA_SUFFIX
from marin.execution.options import DEFAULT_ON_DRIFT
from marin.execution.provenance import collect_provenance, now_iso
from marin.execution.records import (
    FAILED,
    ArtifactRecord,
    clear_status,
    delete_record,
    log_path,
    metadata_dir,
    metadata_files,
    read_record,
    write_record,
    write_status,
)
from marin.execution.step_logs import LazyLogFile, capture_step_output
from marin.execution.step_spec import StepSpec
from marin.execution.storage import Location, durable, with_retries
from marin.execution.vocabulary import Action, BuildOutcomeKind

log = logging.getLogger("marin")

LEASE_WAIT_FIRST_DELAY_S = 0.02
LEASE_WAIT_MAX_DELAY_S = 1.0
LEASE_WAIT_LOG_EVERY_S = 30.0


@dataclass(frozen=True)
class BuildOutcome:
    spec: StepSpec
    action: BuildOutcomeKind
    record: ArtifactRecord
    output_url: str
    duration_s: float = 0.0
    drift: tuple[str, ...] = field(default=())
    reason: str = ""
    """Why it was built or served (the decision's reason)."""


def run_context(spec: StepSpec, location: Location, region: str | None = None) -> StepContext:
    return StepContext(
        output_path=location.url_for(spec.output_path),
        prefix=location.url,
        region=region,
        dep_paths={dep.step_id: dep.data_url(location.url) for dep in spec.deps},
        runtime_args=spec.runtime_args or {},
        loader=functools.partial(load_dependency, location, spec),
    )


def warn_if_served_stale(decision: Decision) -> None:
    """The one warning for a step served although drifted (``warn``) or stale (no cascade)."""
    if not decision.served_with_warning:
        return
    spec = decision.spec
    if decision.drift:
        log.warning(
            "drift %s: config changed without a version bump; serving the cached artifact "
            "(bump the version, or use the drift policy rebuild):\n  %s",
            spec.step_id,
            "\n  ".join(decision.drift),
        )
    if decision.stale:
        log.warning(
            "stale %s: served without rebuilding (no cascade): %s",
            spec.step_id,
            "; ".join(decision.stale),
        )


def read_upstream(spec: StepSpec, location: Location) -> list[Upstream]:
    """Each dependency's current record, for the decision and for the new record's lineage."""
    unique = {dep.step_id: dep for dep in spec.deps}
    return [
        Upstream(step_id, read_record(location, dep.output_path)) for step_id, dep in unique.items()
    ]


def build_step(
    spec: StepSpec,
    location: Location,
    *,
    on_drift: str = DEFAULT_ON_DRIFT,
    force: bool = False,
    cascade: bool = True,
    policy: Policy | None = None,
    region: str | None = None,
    lease_ttl: float | None = None,
    decision: Decision | None = None,
    upstream: Sequence[Upstream] | None = None,
    abandon: threading.Event | None = None,
    defer_if_held: bool = False,
) -> BuildOutcome:
    """Make sure ``spec`` is built under ``location``; build it here if nobody has.

    ``policy`` (else ``on_drift``, ``force`` and ``cascade``) is the run's policy. ``decision``
    is the plan's decision to build this step; without one, the step is decided here first, from
    its own record and ``upstream`` (each dependency's current record; read when not given).
    Either way, after taking the lease the step is decided again if its record changed since,
    so a step another runner just built is served, not rebuilt.

    If this runner's lease is taken over while ``fn`` runs (it stalled past the TTL), its result
    is discarded, never committed; it then waits for the new holder and serves that runner's
    record ("built-by-other"), or raises ``LeaseLostError`` if the new holder did not commit.

    ``abandon``: once set (a second Ctrl-C in library mode), a build whose ``fn`` is still
    running keeps its lease until ``fn`` returns, and then never commits.

    ``defer_if_held``: when another runner's live lease holds the step, raise ``Deferred`` at
    once (having written nothing) instead of waiting for it, so a run loop can go on with other
    steps meanwhile (drivers sharing one prefix) and call again later.
    """
    if policy is None:
        policy = Policy(on_drift, frozenset({spec.step_id} if force else ()), cascade)
    url = location.url_for(spec.output_path)
    ups = list(upstream) if upstream is not None else read_upstream(spec, location)
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

    crash_point("before-lease", spec.step_id)
    try:
        return _lease_and_build(
            spec, location, policy, decision, ups, region, lease_ttl, url, abandon, defer_if_held
        )
    except LeaseLostError as lost:
        log.warning("discard %s: %s", spec.step_id, lost.what)
        lease = Lease(location, spec.output_path, ttl=lease_ttl)
        _acquire(lease, spec)  # wait for the runner that took over
        try:
            record = read_record(location, spec.output_path)
            if record is None and lease.took_over:
                # That runner died too; keep the proof that Marin wrote here for the next one.
                _best_effort_status(location, spec, FAILED, error="interrupted (lease expired)")
        finally:
            lease.release()
        # The runner that took over finished this very build: serve it, even if it was forced.
        unforced = dataclasses.replace(policy, force=policy.force - {spec.step_id})
        if record is not None and _served_from_other(spec, record, ups, unforced):
            log.info("skip %s: built by another runner", spec.step_id)
            return BuildOutcome(
                spec, BuildOutcomeKind.BUILT_BY_OTHER, record, url, reason="built by another runner"
            )
        raise


def _lease_and_build(
    spec: StepSpec,
    location: Location,
    policy: Policy,
    decision: Decision,
    upstream: Sequence[Upstream],
    region: str | None,
    lease_ttl: float | None,
    url: str,
    abandon: threading.Event | None,
    defer_if_held: bool = False,
) -> BuildOutcome:
    output_seen = _output_left_by_marin(location, spec)  # before the lease: see there
    lease = Lease(location, spec.output_path, ttl=lease_ttl)
    _acquire(lease, spec, defer=defer_if_held)
    try:
        crash_point("after-lease", spec.step_id)
        present = metadata_files(location, spec.output_path)
        record = read_record(location, spec.output_path) if "record.json" in present else None
        # Someone committed while we waited for the lease: decide again on that record.
        changed = _build_id(record) != _build_id(decision.record)
        if changed and record is not None and _served_from_other(spec, record, upstream, policy):
            log.info("skip %s: built by another runner", spec.step_id)
            return BuildOutcome(
                spec, BuildOutcomeKind.BUILT_BY_OTHER, record, url, reason="built by another runner"
            )
        earlier = _earlier_attempt(present, lease, output_seen)
        return _build_holding(
            spec, location, lease, region, upstream, decision.reason, abandon, earlier
        )
    finally:
        lease.release()


def _served_from_other(
    spec: StepSpec, record: ArtifactRecord, upstream: Sequence[Upstream], policy: Policy
) -> bool:
    """Whether another runner's ``record`` may be served, by the one decision function.

    Judged on the record's own lineage: an upstream rebuilt in this run is a known build by now,
    so only one whose record is missing still counts as "rebuilt".
    """
    known = [Upstream(u.step_id, u.record, u.rebuilt and u.record is None) for u in upstream]
    return decide(spec, Stored(record), known, policy, needed=True).action != Action.BUILD


def _build_id(record: ArtifactRecord | None) -> str | None:
    return None if record is None else record.build_id


def _acquire(lease: Lease, spec: StepSpec, *, defer: bool = False) -> None:
    """Take the lease, waiting with bounded, jittered backoff while someone else holds it; with
    ``defer``, raise ``Deferred`` instead of waiting."""
    delay = LEASE_WAIT_FIRST_DELAY_S
    last_holder: str | None = None
    last_log = 0.0
    while True:
        holder = lease.try_acquire()
        if holder is None:
            return
        if defer:
            raise Deferred(spec.step_id, holder.holder, holder.expires_at)
        now = time.monotonic()
        if holder.holder != last_holder or now - last_log > LEASE_WAIT_LOG_EVERY_S:
            log.info("wait %s: lease held by %s", spec.step_id, holder.describe())
            last_holder, last_log = holder.holder, now
        time.sleep(delay * (0.5 + random.random() / 2))
        delay = min(delay * 2, LEASE_WAIT_MAX_DELAY_S)


def _output_left_by_marin(location: Location, spec: StepSpec) -> bool:
    """Whether something is at the output path; fail, having written nothing, if it is not
    provably Marin's.

    An output path may be cleared only when Marin provably wrote there: its metadata folder
    beside it (``<output>.marin/``: a record, a status, a lease, a log). Checked before the lease
    is taken, so that a held or taken-over lease is itself that proof (``_earlier_attempt``):
    any attempt that held it had passed this check. ``memory://`` lives in this process, where
    only its own code writes, and a folder check there scans the whole store (quadratic over a
    run): it answers False, and only a record, status or taken-over lease clears there.
    """
    if location.is_memory:
        return False
    out = location.path(spec.output_path)
    if not location.exists(out):
        return False  # the common first build: nothing there
    if location.exists(location.path(metadata_dir(spec.output_path))):
        return True
    raise StorageError(
        f"output path {location.url_for(spec.output_path)} already exists and was not "
        f"written by Marin (no {metadata_dir(spec.output_path).rsplit('/', 1)[-1]} folder "
        "beside it)",
        "move it away (or delete it yourself), then run again; Marin never deletes "
        "data it did not write",
        spec.step_id,
    )


def _earlier_attempt(present: set[str], lease: Lease, output_seen: bool) -> str | None:
    """What an earlier attempt left at the output path: ``"build"``, ``"debris"`` or None.

    Asked by the lease holder, from the metadata files ``present`` beside the output. A record
    means an earlier build; a status file (a FAILED attempt, or one of an older version), a
    lease taken over from an attempt that died, or an output ``_output_left_by_marin`` saw
    before the lease means debris may be there. With none of these, nothing is cleared.
    """
    if "record.json" in present:
        return "build"
    if "status.json" in present or lease.took_over or output_seen:
        return "debris"
    return None


def _check_clearable(location: Location, spec: StepSpec) -> None:
    """Refuse, before anything is written, to clear a folder holding another step's metadata."""
    out = location.path(spec.output_path)
    foreign = _foreign_metadata(out, location.list_tree(out))
    if foreign is not None:
        raise StorageError(
            f"output path {location.url_for(spec.output_path)} holds another step's "
            f"metadata ({foreign}); clearing it would delete that step's artifact",
            "rename one of the two steps so that neither output is inside the other",
            spec.step_id,
        )


def _clear_output(location: Location, spec: StepSpec, built: bool) -> None:
    """Remove the output path, literally (never as a glob); ``built`` picks the message."""
    out = location.path(spec.output_path)
    if location.exists(out):
        if built:
            log.info("clear %s: replacing the previous build at %s", spec.step_id, out)
        else:
            log.info("clear %s: removing debris from an earlier attempt at %s", spec.step_id, out)
        with_retries(lambda: location.remove_tree(out), f"clear {out}")


def _foreign_metadata(out: str, files: list[str]) -> str | None:
    """The first file under ``out`` that sits in a ``*.marin`` metadata folder, if any."""
    base = out.rstrip("/") + "/"
    for file in files:
        relative = file[len(base) :] if file.startswith(base) else ""
        if any(part.endswith(METADATA_SUFFIX) for part in relative.split("/")[:-1]):
            return file
    return None


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
    buffer = io.StringIO()
    try:
        yield buffer
    finally:
        try:
            text = buffer.getvalue()
            if text:
                location.put_file(path, text.encode())
            elif earlier:
                with contextlib.suppress(FileNotFoundError):
                    location.fs.rm_file(path)
        except OSError as exc:
            log.warning("could not write the log of %s: %s", spec.step_id, exc)


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


def _best_effort_status(location: Location, spec: StepSpec, state: str, **details: Any) -> None:
    """A status write that must not hide the error being reported (storage may be failing)."""
    try:
        write_status(location, spec.output_path, state, **details)
    except OSError as exc:
        log.warning("could not write %s status for %s: %s", state, spec.step_id, exc)


def _build_holding(
    spec: StepSpec,
    location: Location,
    lease: Lease,
    region: str | None,
    upstream: Sequence[Upstream],
    reason: str,
    abandon: threading.Event | None,
    earlier: str | None,
) -> BuildOutcome:
    started_at, t0 = now_iso(), time.perf_counter()
    if earlier is not None:
        try:
            _check_clearable(location, spec)  # may refuse: nothing is written then
        except StorageError as exc:
            if lease.took_over:  # keep the dead attempt's proof for the next one
                _best_effort_status(location, spec, FAILED, error=exc.what)
            raise
    with _started_here(location, spec.output_path):
        if earlier is not None:
            clear_status(location, spec.output_path)  # the held lease says RUNNING now
            delete_record(location, spec.output_path)
            _clear_output(location, spec, built=earlier == "build")
        # No folder to make: the lease's folder sits beside the output, so its parent exists.
        ctx = run_context(spec, location, region)
        try:
            config = to_canonical(spec.build_config(ctx), "config", spec.step_id)
            log_file = _step_log(location, spec, earlier is not None)
            with Heartbeat(lease) as heartbeat, log_file as step_log:
                with capture_step_output(step_log, label=spec.step_id):
                    try:
                        raw_result = spec.run(ctx)
                    except BaseException:
                        # Into the file only: the error message points here for the details.
                        step_log.write(traceback.format_exc())
                        raise
                if durable() and location.is_local:
                    _fsync_tree(location.path(spec.output_path))
            try:
                result = to_canonical(raw_result, "result", spec.step_id)
            except ConfigError as exc:
                raise ConfigError(
                    f"fn returned a value with no JSON form ({exc.what})",
                    "return plain data (str, numbers, lists, dicts) or None; write big values "
                    "to the output path",
                    spec.step_id,
                ) from None
            crash_point("after-output", spec.step_id)
            duration = time.perf_counter() - t0
            provenance: dict[str, Any] = {**collect_provenance(), "lowered": dict(spec.provenance)}
            record = ArtifactRecord(
                name=spec.name,
                version=spec.version,
                fingerprint=spec.fingerprint,
                fingerprint_payload=spec.fingerprint_payload,
                config=config,
                dep_paths=dict(ctx.dep_paths),
                output_path=ctx.output_path,
                result=result,
                provenance=provenance,
                started_at=started_at,
                finished_at=now_iso(),
                duration_s=round(duration, 6),
                artifact_type=spec.artifact_type,
                build_id=uuid.uuid4().hex,
                inputs={u.step_id: u.record.build_id for u in upstream if u.record is not None},
            )
            if abandon is not None and abandon.is_set():
                raise AbandonedError(
                    "abandoned after an interrupt: fn finished, but its result is not committed",
                    "run again to build it",
                    spec.step_id,
                )
            # The commit point: written only while provably holding the lease.
            if heartbeat.lost.is_set() or not lease.commit(
                lambda: write_record(location, record, spec.output_path), release=True
            ):
                raise LeaseLostError(
                    "lost the lease while building; another runner took over",
                    "nothing was committed by this runner; its result is discarded",
                    spec.step_id,
                )
        except BaseException as exc:
            if not isinstance(exc, LeaseLostError):
                _best_effort_status(
                    location,
                    spec,
                    FAILED,
                    holder=lease.holder,
                    started_at=started_at,
                    finished_at=now_iso(),
                    error=f"{type(exc).__name__}: {exc}",
                    traceback=traceback.format_exc(limit=20),
                )
            raise
        crash_point("after-record", spec.step_id)
        return BuildOutcome(
            spec,
            BuildOutcomeKind.BUILT,
            record,
            ctx.output_path,
            duration_s=duration,
            reason=reason,
        )


@contextlib.contextmanager
def _started_here(location: Location, output_path: str) -> Iterator[None]:
    """While this process's attempt runs (past its checks, lease held): see ``mark_interrupted``."""
    with _running_lock:
        _running_here[(location.url, output_path)] = location
    try:
        yield
    finally:
        with _running_lock:
            _running_here.pop((location.url, output_path), None)


_running_lock = threading.Lock()
_running_here: dict[tuple[str, str], Location] = {}
"""Steps whose attempt this process started (past its checks) and that have not ended."""


def mark_interrupted() -> None:
    """The process is about to exit mid-build: mark FAILED exactly the attempts it started.

    Only attempts past their checks are marked: a step still waiting for its lease wrote
    nothing, and a FAILED status would wrongly claim Marin wrote its output folder.
    """
    with _running_lock:
        attempts = list(_running_here.items())
    for (_, path), location in attempts:
        with contextlib.suppress(OSError):
            write_status(location, path, FAILED, error="interrupted")
