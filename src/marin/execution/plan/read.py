"""Read what storage holds for many steps at once: their records and statuses.

This is the only I/O of a plan; the decision itself is ``marin.execution.plan.decide``. Reads go to
storage, which may be an object store 20 ms away, so a batch of steps is read on a pool of I/O
threads rather than one after another, once storage proves slow.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from marin.execution.heap import frozen_heap
from marin.execution.pipeline.graph import Graph
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.decide import NOTHING_STORED, Plan, Stored, plan_graph
from marin.execution.plan.options import RunOptions, check_prefix_fits
from marin.execution.store.location import Location
from marin.execution.store.placement import adopted_now
from marin.execution.store.records import (
    ArtifactRecord,
    lease_path,
    load_record,
    read_attempt,
    record_path,
    shared_build,
    status_path,
)
from marin.execution.store.step_folder import (
    CHECKPOINTS_WITHOUT_ATTEMPT,
    Attempt,
    UnreadableAttempt,
    checkpoint_dir,
    load_attempt,
)

IO_PARALLELISM = 64
SERIAL_MAX_S = 200e-6
"""Mean seconds per step above which the remaining steps are read on threads."""
_FIRST_PROBE, _PROBE_EVERY = 2, 16


def read_stored_step(spec: StepSpec, location: Location) -> Stored:
    """The step's record, and (only when there is no record) its status, which explains why,
    a record of another step found in its place, and (placed in a user's folder) the shared
    build."""
    if location.is_memory and not (
        location.has_file(location.path(record_path(spec.output_path)))
        or location.has_file(location.path(status_path(spec.output_path)))
        or location.has_file(location.path(lease_path(spec.output_path)))
    ):
        if not spec.user_home:
            return NOTHING_STORED  # three dict lookups instead of three raised FileNotFoundErrors
        return Stored(shared=shared_build(location, spec.output_path, spec.user_home))
    found = load_record(location, spec.output_path, step=(spec.name, spec.version))
    if isinstance(found, ArtifactRecord):
        return stored_build(location, spec, found)
    attempt = _attempt(location, spec) if spec.resumable else None
    shared = shared_build(location, spec.output_path, spec.user_home)
    return Stored(None, read_attempt(location, spec.output_path), found, attempt, shared)


def _attempt(location: Location, spec: StepSpec) -> Attempt | UnreadableAttempt | None:
    """A resumable step's ``attempt.json``; with none, ``CHECKPOINTS_WITHOUT_ATTEMPT`` when its
    checkpoint folder is there (one more lookup), which its build clears, as the plan says."""
    found = load_attempt(location, spec.output_path)
    if found is None and location.exists(location.path(checkpoint_dir(spec.output_path))):
        return CHECKPOINTS_WITHOUT_ATTEMPT
    return found


def stored_build(location: Location, spec: StepSpec, record: ArtifactRecord) -> Stored:
    """A committed ``record`` as ``decide`` judges it for ``spec``: an adoption's with the
    builds it adopts now (a rebuild of one makes it stale)."""
    if spec.source is not None and record.source is not None:
        return Stored(record, adopts=adopted_now(location, spec.output_path, record))
    return Stored(record)


def read_stored(specs: Iterable[StepSpec], location: Location) -> dict[str, Stored]:
    """What storage holds for each of ``specs``, by output path (mutable steps are not read:
    they rebuild whatever is stored).

    The first steps are read one after another and timed. While a step costs less than
    ``SERIAL_MAX_S`` (local disk, ``memory://``: tens of microseconds), threads would only add
    overhead, so reading stays serial. Once storage proves slow (an object store, a network file
    system), the rest are read on ``IO_PARALLELISM`` threads at once. The graph is out of the
    collector's scans meanwhile (``marin.execution.heap``).

    Raises:
        InvalidStepError: a step runs ``fn`` in another process on a ``memory://`` prefix
            (``check_prefix_fits``: every runner plans through here).
    """
    specs = list(specs)
    check_prefix_fits(specs, location)
    with frozen_heap():
        return _read_stored(specs, location)


def _read_stored(specs: Iterable[StepSpec], location: Location) -> dict[str, Stored]:
    todo = [s for s in specs if not s.mutable]
    out: dict[str, Stored] = {}
    started = time.perf_counter()
    for i, spec in enumerate(todo):
        out[spec.output_path] = read_stored_step(spec, location)
        done = i + 1
        probe = done % _PROBE_EVERY == 0 or done == _FIRST_PROBE
        slow = probe and (time.perf_counter() - started) / done > SERIAL_MAX_S
        if slow and not location.reads_in_process:  # a dict here: threads only add work
            break
    rest = todo[len(out) :]
    if len(rest) == 1:
        out[rest[0].output_path] = read_stored_step(rest[0], location)
    elif rest:
        with ThreadPoolExecutor(min(IO_PARALLELISM, len(rest)), "marin-inspect") as pool:
            for spec, stored in zip(
                rest, pool.map(lambda s: read_stored_step(s, location), rest), strict=True
            ):
                out[spec.output_path] = stored
    return out


def plan_run(graph: Graph, location: Location, options: RunOptions) -> Plan:
    """Read the whole graph's stored state, then decide every step: what a run would do.

    A stored file that is corrupt or another step's is data, not an error: the step is not
    built (``load_record``).

    Raises:
        InvalidStepError: a ``force`` name names no step of ``graph``.
        DriftError: under ``on_drift="error"``, one error naming every drifted step
            (``CodeDriftError`` when only code changed, under ``on_code_drift="error"``).
        FingerprintMismatchError: a step pinned by ``expected_fingerprint`` has a stored build
            of another fingerprint.
        ArtifactTypeMismatchError: a stored build was built as another ``artifact_type``.
        FailedBeforeError: under ``force_run_failed=False``, a needed step's last attempt failed.
        StorageError: storage kept failing (after retries), or a symbolic link below the prefix
            (``SymlinkError``) or a metadata file that is not a regular file was found.
    """
    steps = list(graph.steps)
    policy = options.policy(steps)
    return plan_graph(steps, list(graph.targets), read_stored(steps, location), policy)
