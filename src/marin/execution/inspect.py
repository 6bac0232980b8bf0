"""What would a run do with each step, and why? Shared by ``StepRunner`` and ``marin plan``.

Status and record reads go to storage, which may be an object store 20 ms away, so a batch of
steps is inspected on a pool of I/O threads rather than one after another.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from marin.execution.drift import explain_drift
from marin.execution.records import FAILED, RUNNING, ArtifactRecord, read_record, read_status
from marin.execution.step_spec import StepSpec
from marin.execution.storage import Location

IO_PARALLELISM = 64
SERIAL_MAX_S = 200e-6
"""Mean seconds per step above which the remaining steps are inspected on threads."""
_FIRST_PROBE, _PROBE_EVERY = 2, 16

BUILT, RUN, DRIFT, DEV, FAILED_BEFORE = "built", "run", "drift", "dev", "failed-before"


@dataclass(frozen=True)
class StepState:
    spec: StepSpec
    action: str
    """``built``, ``run``, ``drift``, ``dev`` or ``failed-before``."""
    reason: str
    record: ArtifactRecord | None = None
    status: dict[str, Any] | None = None
    drift: tuple[str, ...] = field(default=())

    @property
    def needs_build(self) -> bool:
        return self.action in (RUN, DEV, FAILED_BEFORE)


def inspect_step(spec: StepSpec, location: Location, *, forced: bool = False) -> StepState:
    if forced:
        return StepState(spec, RUN, "forced")
    if spec.mutable:
        return StepState(spec, DEV, f"version {spec.version!r} is mutable: rebuilds every run")
    record = read_record(location, spec.output_path)
    if record is None:
        status = read_status(location, spec.output_path)
        state = (status or {}).get("state")
        if state == FAILED:
            error = (status or {}).get("error", "")
            return StepState(spec, FAILED_BEFORE, f"previous failure: {error}", status=status)
        if state == RUNNING:
            return StepState(
                spec, RUN, "unfinished earlier attempt (or running elsewhere now)", status=status
            )
        return StepState(spec, RUN, "new: no record yet", status=status)
    if record.fingerprint == spec.fingerprint:
        return StepState(spec, BUILT, "record matches fingerprint", record=record)
    drift = tuple(explain_drift(record.fingerprint_payload, spec.fingerprint_payload))
    return StepState(
        spec, DRIFT, "config changed without a version bump", record=record, drift=drift
    )


def inspect_steps(
    specs: Iterable[StepSpec], location: Location, *, forced: frozenset[str] = frozenset()
) -> list[StepState]:
    """Inspect ``specs`` (results in the same order), on I/O threads when storage is slow.

    The first steps are read one after another and timed. While a step costs less than
    ``SERIAL_MAX_S`` (local disk, ``memory://``: tens of microseconds), threads would only add
    overhead, so reading stays serial. Once storage proves slow (an object store, a network
    file system), the rest are read on ``IO_PARALLELISM`` threads at once.
    """
    specs = list(specs)
    states: list[StepState] = []
    started = time.perf_counter()
    for i, spec in enumerate(specs):
        states.append(inspect_step(spec, location, forced=spec.step_id in forced))
        done = i + 1
        probe = done % _PROBE_EVERY == 0 or done == _FIRST_PROBE
        if probe and (time.perf_counter() - started) / done > SERIAL_MAX_S:
            break
    rest = specs[len(states) :]
    if not rest:
        return states
    if len(rest) == 1:
        return [*states, inspect_step(rest[0], location, forced=rest[0].step_id in forced)]
    with ThreadPoolExecutor(min(IO_PARALLELISM, len(rest)), "marin-inspect") as pool:
        states.extend(
            pool.map(lambda s: inspect_step(s, location, forced=s.step_id in forced), rest)
        )
    return states
