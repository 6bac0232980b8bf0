"""``build_step``: the one build/commit path that every runner uses.

The local ``StepRunner``, the Prefect tasks and the Airflow tasks all call this function, so a
local run, a Prefect run and an Airflow run on one prefix share one lease, one record and one
status file, and see each other's results.

The order of writes is the whole crash-safety story:
1. take the lease, then re-check: another runner may have finished meanwhile;
2. remove an earlier attempt's status file and record, then clear debris from the output path
   (no RUNNING status is written: the held lease says so, see ``records.read_status``);
3. run ``fn`` under a lease heartbeat;
4. check the lease is still ours (a runner whose lease was taken over must not commit);
5. write the record (the commit point, and the SUCCESS status) under ``Lease.commit``, which
   re-proves ownership, then release the lease. A failure writes a FAILED status file instead.
A crash anywhere before 5 leaves no record, so the step is simply not built. A corrupt record
reads as "not built"; a crashed local record write leaves only a temporary file, cleared in 2.
``marin.execution.faults`` names the crash points the tests kill processes at.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from marin.execution.canonical import to_canonical
from marin.execution.context import StepContext
from marin.execution.drift import explain_drift
from marin.execution.errors import ConfigError, DriftError, LeaseLostError
from marin.execution.faults import crash_point
from marin.execution.lease import Heartbeat, Lease
from marin.execution.provenance import collect_provenance, now_iso
from marin.execution.records import (
    FAILED,
    ArtifactRecord,
    clear_metadata_debris,
    clear_status,
    delete_record,
    log_path,
    read_record,
    write_record,
    write_status,
)
from marin.execution.step_logs import LazyLogFile, capture_step_output
from marin.execution.step_spec import StepSpec
from marin.execution.storage import Location, durable, with_retries

log = logging.getLogger("marin")

DRIFT_POLICIES = ("warn", "rebuild", "error")
BUILT, CACHED, BUILT_BY_OTHER = "built", "cached", "built-by-other"
LEASE_WAIT_FIRST_DELAY_S = 0.02
LEASE_WAIT_MAX_DELAY_S = 1.0
LEASE_WAIT_LOG_EVERY_S = 30.0


@dataclass(frozen=True)
class BuildOutcome:
    spec: StepSpec
    action: str
    """``built``, ``cached`` or ``built-by-other``."""
    record: ArtifactRecord
    output_url: str
    duration_s: float = 0.0
    drift: tuple[str, ...] = field(default=())


def check_drift_policy(on_drift: str) -> str:
    if on_drift not in DRIFT_POLICIES:
        raise ValueError(
            f"error: on_drift={on_drift!r} is not a policy: use one of {', '.join(DRIFT_POLICIES)}"
        )
    return on_drift


def run_context(spec: StepSpec, location: Location, region: str | None = None) -> StepContext:
    return StepContext(
        output_path=location.url_for(spec.output_path),
        prefix=location.url,
        region=region,
        dep_paths={dep.step_id: location.url_for(dep.output_path) for dep in spec.deps},
    )


def usable_record(
    spec: StepSpec, record: ArtifactRecord | None, on_drift: str
) -> tuple[ArtifactRecord | None, tuple[str, ...]]:
    """Apply the drift policy to a committed record: return it if it may be served."""
    if record is None:
        return None, ()
    if record.fingerprint == spec.fingerprint:
        return record, ()
    drift = tuple(explain_drift(record.fingerprint_payload, spec.fingerprint_payload))
    if on_drift == "error":
        raise DriftError(
            "config changed without a version bump: " + "; ".join(drift),
            "bump the step's version, or run with --on-drift rebuild or warn",
            spec.step_id,
        )
    if on_drift == "warn":
        log.warning(
            "drift %s: config changed without a version bump; serving the cached artifact "
            "(bump the version or use --on-drift rebuild):\n  %s",
            spec.step_id,
            "\n  ".join(drift),
        )
        return record, drift
    return None, drift


def build_step(
    spec: StepSpec,
    location: Location,
    *,
    on_drift: str = "warn",
    force: bool = False,
    region: str | None = None,
    lease_ttl: float | None = None,
    precheck: bool = True,
) -> BuildOutcome:
    """Make sure ``spec`` is built under ``location``; build it here if nobody has.

    ``precheck=False`` skips the first record read, for callers (the ``StepRunner``) that have
    just inspected the step; the re-check after taking the lease always happens.

    If this runner's lease is taken over while ``fn`` runs (it stalled past the TTL), its result
    is discarded, never committed; it then waits for the new holder and serves that runner's
    record ("built-by-other"), or raises ``LeaseLostError`` if the new holder did not commit.
    """
    check_drift_policy(on_drift)
    url = location.url_for(spec.output_path)
    rebuild = force or spec.mutable
    if not rebuild and precheck:
        record = read_record(location, spec.output_path)
        cached, drift = usable_record(spec, record, on_drift)
        if cached is not None:
            return BuildOutcome(spec, CACHED, cached, url, drift=drift)

    crash_point("before-lease", spec.step_id)
    try:
        return _lease_and_build(spec, location, rebuild, region, lease_ttl, url)
    except LeaseLostError as lost:
        log.warning("discard %s: %s", spec.step_id, lost.what)
        lease = Lease(location, spec.output_path, ttl=lease_ttl)
        _acquire(lease, spec)  # wait for the runner that took over
        try:
            record = read_record(location, spec.output_path)
        finally:
            lease.release()
        if record is not None and record.fingerprint == spec.fingerprint:
            log.info("skip %s: built by another runner", spec.step_id)
            return BuildOutcome(spec, BUILT_BY_OTHER, record, url)
        raise


def _lease_and_build(
    spec: StepSpec,
    location: Location,
    rebuild: bool,
    region: str | None,
    lease_ttl: float | None,
    url: str,
) -> BuildOutcome:
    lease = Lease(location, spec.output_path, ttl=lease_ttl)
    _acquire(lease, spec)
    try:
        crash_point("after-lease", spec.step_id)
        if not rebuild:
            # Someone may have committed while we waited for the lease.
            record = read_record(location, spec.output_path)
            if record is not None and record.fingerprint == spec.fingerprint:
                log.info("skip %s: built by another runner", spec.step_id)
                return BuildOutcome(spec, BUILT_BY_OTHER, record, url)
        return _build_holding(spec, location, lease, region)
    finally:
        lease.release()


def _acquire(lease: Lease, spec: StepSpec) -> None:
    """Take the lease, waiting with bounded, jittered backoff while someone else holds it."""
    delay = LEASE_WAIT_FIRST_DELAY_S
    last_holder: str | None = None
    last_log = 0.0
    while True:
        holder = lease.try_acquire()
        if holder is None:
            return
        now = time.monotonic()
        if holder.holder != last_holder or now - last_log > LEASE_WAIT_LOG_EVERY_S:
            log.info("wait %s: lease held by %s", spec.step_id, holder.describe())
            last_holder, last_log = holder.holder, now
        time.sleep(delay * (0.5 + random.random() / 2))
        delay = min(delay * 2, LEASE_WAIT_MAX_DELAY_S)


def _clear_output(location: Location, spec: StepSpec) -> None:
    fs, out = location.fs, location.path(spec.output_path)
    if with_retries(lambda: fs.exists(out), f"check {out}"):
        log.info("clear %s: removing debris from an earlier attempt at %s", spec.step_id, out)
        with_retries(lambda: fs.rm(out, recursive=True), f"clear {out}")
    clear_metadata_debris(location, spec.output_path)
    if location.is_local:
        os.makedirs(os.path.dirname(out), exist_ok=True)


@contextlib.contextmanager
def _step_log(location: Location, spec: StepSpec, earlier: bool) -> Iterator[IO[str]]:
    """The step's ``log.txt``, only if it printed something: streamed on local disk, written
    once at the end elsewhere. An ``earlier`` attempt's log is removed when this one is silent,
    so the log beside a record is always that build's."""
    path = location.path(log_path(spec.output_path))
    if location.is_local:
        lazy = LazyLogFile(path)
        try:
            yield lazy  # type: ignore[misc]  # write/flush: all a stream needs here
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
    spec: StepSpec, location: Location, lease: Lease, region: str | None
) -> BuildOutcome:
    started_at, t0 = now_iso(), time.perf_counter()
    # The lease is this attempt's RUNNING status (see records.read_status): no status write.
    # Debris in the output can only come from an earlier attempt, and every earlier attempt left
    # a trace: a FAILED status, a lease we took over (it crashed), or a record (a rebuild).
    # Local disk checks anyway (a stat is cheap); remote stores save a round trip (and on
    # memory:// a scan of the whole store).
    had_status = clear_status(location, spec.output_path)
    had_record = delete_record(location, spec.output_path)
    earlier = had_status or had_record or lease.took_over
    if location.is_local or earlier:
        _clear_output(location, spec)
    ctx = run_context(spec, location, region)
    try:
        config = to_canonical(spec.build_config(ctx), "config", spec.step_id)
        with Heartbeat(lease) as heartbeat, _step_log(location, spec, earlier) as step_log:
            with capture_step_output(step_log):
                raw_result = spec.run(ctx)
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
        )
        # The commit point: written only while provably holding the lease.
        if heartbeat.lost.is_set() or not lease.commit(
            lambda: write_record(location, record, spec.output_path)
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
    # No SUCCESS status write: the record says so (records.read_status).
    return BuildOutcome(spec, BUILT, record, ctx.output_path, duration_s=duration)
