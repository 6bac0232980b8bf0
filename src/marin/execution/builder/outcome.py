"""What ``build_step`` returns: the step built (``BuildOutcome``), or not yet (``Pending``).

A build that must wait for someone else (another runner's lease on the step, the step's remote
job) waits in its thread under ``Wait.BLOCK``; otherwise it returns ``Pending``, which says what
it waits for (``why``) and how it goes on (``resume``). Whoever holds a ``Pending`` owns it: it
waits, then calls ``resume()`` (a build again: an outcome, or another ``Pending``), or gives it
up with ``release()``. A pending build holds exactly what ``why`` says: nothing for a lease
held elsewhere, its lease, heartbeat and log for a running job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.remote.wait import JobRunning
from marin.execution.store.records import ArtifactRecord
from marin.execution.vocabulary import BuildOutcomeKind


@dataclass(frozen=True)
class BuildOutcome:
    """What ``build_step`` did with a step: built it here, served it (cached), or found it built
    by another runner; with the committed record and where the artifact lives.

    Invariant: ``record`` is always a committed record of ``spec`` (a failure raises instead)."""

    spec: StepSpec
    action: BuildOutcomeKind
    record: ArtifactRecord
    output_url: str
    duration_s: float = 0.0
    drift: tuple[str, ...] = field(default=())
    reason: str = ""
    """Why it was built or served (the decision's reason)."""


@dataclass(frozen=True)
class LeaseHeld:
    """Why a build is pending: another runner's live lease holds the step. Nothing was written
    and nothing is held; ``expires_at`` (the holder's clock, seconds since the epoch) is when the
    lease may be taken over if its holder stops renewing it."""

    holder: str
    expires_at: float


def _holds_nothing(error: BaseException | None) -> None:
    """``release`` of a build that holds nothing."""


@dataclass(frozen=True)
class Pending:
    """A build that cannot go on now (``BuildRequest.wait`` is not ``BLOCK``): ``why`` it waits,
    ``resume()`` to go on once that is over, ``release(error)`` to give it up instead.

    ``release`` frees what the build holds (its lease, heartbeat and log) and never commits;
    ``error`` is the end it records (a FAILED status and a lineage FAIL or ABORT), None when
    whoever gave it up builds it again later (an Airflow task deferring while its job runs:
    nothing is recorded, and the job runs on)."""

    spec: StepSpec
    why: LeaseHeld | JobRunning
    resume: Callable[[], BuildOutcome | Pending]
    release: Callable[[BaseException | None], None] = _holds_nothing


def waited_here(result: BuildOutcome | Pending) -> BuildOutcome:
    """``result`` of a build that waits in its thread (``Wait.BLOCK``, the default): always an
    outcome.

    Raises:
        TypeError: ``result`` is ``Pending``: the request did not ask to wait here.
    """
    if isinstance(result, Pending):
        raise TypeError(f"{result.spec.step_id}: a pending build where one waited here")
    return result
