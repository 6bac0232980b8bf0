"""Resumable steps at build time: keep, or clear, what an earlier attempt left; fence writers.

``build_step`` calls three functions here, and nothing else changes for a step that is not
``resumable`` (its debris is cleared as before):

- ``start_attempt``, by the lease holder before ``fn`` runs: judges the earlier attempt
  (``plan.resume_verdict.judge``: the one identity rule, against the recipe this build makes
  with the input builds it read; code drift by ``on_code_drift``), clears the checkpoint
  folder when it is not resumed (``build_step`` clears the output path then), and writes this
  attempt's ``attempt.json``, naming that recipe;
- ``checkpoint_url`` and ``LeaseCheck``: the context's ``checkpoint_path`` and
  ``still_holds_lease()``;
- ``finish_attempt``, after the record is written and before the lease is released: removes
  ``attempt.json`` and (unless ``keep_checkpoints``) the checkpoint folder.

A runner that starts attempts elsewhere (a remote job) calls ``start_attempt`` and
``finish_attempt`` the same way, and passes ``LeaseCheck`` (it pickles) to the job, which must
stop once it answers False. docs/reliability.md, "Resumable steps", says what is protected.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from marin.execution.digest.code import mixed_digest
from marin.execution.pipeline.provenance import now_iso
from marin.execution.pipeline.remote_option import ranks_of
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.resume_verdict import ResumeVerdict, judge
from marin.execution.remote.fence import fence_cleared, fence_previous
from marin.execution.store.identity import Recipe
from marin.execution.store.lease import Heartbeat, Lease
from marin.execution.store.location import Location, with_retries
from marin.execution.store.records import gc_was_deleting, parse_stored_time, read_status_file
from marin.execution.store.step_folder import (
    Attempt,
    UnreadableAttempt,
    checkpoint_dir,
    load_attempt,
    remove_attempt,
    write_attempt,
)
from marin.execution.vocabulary import Leftover

log = logging.getLogger("marin")

TAKEN_OVER_IN_THREAD = (
    "its attempt was taken over from a thread of this very process, which cannot be stopped "
    "and may still be writing; it is cleared (isolate=True lets a takeover resume)"
)


def watch_interval(ttl: float) -> float:
    """How often an isolated step's runner checks its lease: a third of the TTL, at most 2 s."""
    return max(min(ttl / 3, 2.0), 0.05)


class LeaseCheck:
    """``current_context().still_holds_lease()``: one read of the step's lease file.

    True only while the lease holds this attempt's token and (``strict``) has not expired: a
    stalled holder whose lease ran out says False even before anyone takes over. The watcher
    that kills an isolated step's process asks ``watcher`` instead (token only), so a holder
    that merely stalled is not killed while nobody else holds the step. It pickles (the lease's
    location and token), so an isolated child asks storage itself.
    """

    def __init__(self, lease: Lease, *, strict: bool = True) -> None:
        self.lease = lease
        self.strict = strict
        self.interval = watch_interval(lease.ttl)
        """How often a watcher (``IsolatedCall``) asks."""

    def __call__(self) -> bool:
        try:
            info = self.lease.read()
        except OSError:
            return not self.strict  # unknown: never publish on a guess, never kill on one
        if info is None or info.token != self.lease.token:
            return False
        return not (self.strict and info.expired)

    @property
    def watcher(self) -> LeaseCheck:
        """The same check, by token only: False once another attempt took the lease."""
        return LeaseCheck(self.lease, strict=False)


def checkpoint_url(spec: StepSpec, location: Location) -> str | None:
    """``current_context().checkpoint_path``: a resumable step's checkpoint folder, else None."""
    return location.url_for(checkpoint_dir(spec.output_path)) if spec.resumable else None


_lock = threading.Lock()
_in_thread: dict[tuple[str, str], int] = {}
"""Resumable attempts whose ``fn`` runs on a thread of this process -> how many (see
``running_here``): a takeover of one of them must not resume what that thread still writes."""


@contextlib.contextmanager
def running_here(location: Location, spec: StepSpec) -> Iterator[None]:
    """While a resumable step's in-thread ``fn`` runs; an isolated one is killed instead, and a
    remote one's job cancelled (``remote/fence.py``)."""
    if not spec.resumable or spec.isolate or spec.remote is not None:
        yield
        return
    key = (location.url, spec.output_path)
    with _lock:
        _in_thread[key] = _in_thread.get(key, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _in_thread[key] -= 1
            if not _in_thread[key]:
                del _in_thread[key]


def verdict_for(
    location: Location,
    spec: StepSpec,
    lease: Lease,
    earlier: Leftover | None,
    on_code_drift: str,
    recipe: Recipe,
    run: str = "",
) -> ResumeVerdict | None:
    """Whether the lease holder resumes what an earlier attempt left (None: nothing is there).
    ``run``: the build's run (``BuildRequest.run``)."""
    if earlier != Leftover.DEBRIS:
        return None  # nothing left, or a committed build that is replaced whole
    previous = load_attempt(location, spec.output_path)
    forced = recipe.step_id in recipe.repaired and not _forced_here(location, spec, previous, run)
    half_deleted = gc_was_deleting(read_status_file(location, spec.output_path))
    verdict = judge(recipe, previous, on_code_drift, spec.fingerprint_payload, forced,
                    ranks_of(spec.run), half_deleted)  # fmt: skip
    if spec.remote is not None:
        fence = fence_previous if verdict.resume else fence_cleared
        with Heartbeat(lease):  # a backend may take a while to confirm a cancel
            fence(location, spec, verdict.previous)  # cancelled, not waited out
    elif verdict.resume and lease.took_over:
        with _lock:
            alive_here = (location.url, spec.output_path) in _in_thread
        if alive_here:
            return ResumeVerdict(False, TAKEN_OVER_IN_THREAD, verdict.previous)
        _let_the_displaced_stop(lease)
    return verdict


_started_forced: dict[tuple[str, str], tuple[str, int, str, str]] = {}
"""Attempts a run of this process started for a forced step (``--force``), with the run: the
partial output they leave is the repair's own, so a retry in the same run resumes it instead of
clearing it again. Another run forcing the step (a later run of this process) clears it."""


def _forced_here(
    location: Location, spec: StepSpec, previous: Attempt | UnreadableAttempt | None, run: str
) -> bool:
    """Whether ``previous`` is an attempt the run ``run`` started after forcing the step."""
    if not isinstance(previous, Attempt) or not run:
        return False
    with _lock:
        started = _started_forced.get((location.url, spec.output_path))
    return started == (run, previous.number, previous.started_at, previous.holder)


def _let_the_displaced_stop(lease: Lease) -> None:
    """Before resuming a lease taken over from a holder that may be alive (expired, not dead):
    wait out that holder's watch interval (a third of its TTL, at most 2 s) and a half, so its
    watcher has killed its isolated process before this attempt touches the checkpoints. A
    dead local holder's process died with it (``isolated_child._die_with``): no wait."""
    old = lease.displaced
    if old is None or old.holder_dead:
        return
    wait = 1.5 * watch_interval(old.ttl or lease.ttl)
    log.info("wait %.1fs: the displaced holder %s stops its attempt first", wait, old.holder)
    time.sleep(wait)


def start_attempt(
    location: Location,
    spec: StepSpec,
    lease: Lease,
    earlier: Leftover | None,
    on_code_drift: str,
    recipe: Recipe | None = None,
    run: str = "",
) -> Attempt | None:
    """For a resumable step (else None): resume or clear. The attempt's record is written by
    ``record_attempt`` once the output is cleared, never before: a holder killed while it
    clears leaves no record of the recipe beside a half-cleared output (it would be resumed).

    Called holding the lease, before the output path is cleared: the caller clears it unless
    the returned attempt ``resumed``; a resumed attempt's ``code`` is the mix of the code that
    made the partial output and the recipe's (``mixed_digest``). An attempt that is not
    resumed retires what an earlier one left first (its record, then its checkpoints), as a
    build of a step that is not resumable does over leftovers. ``recipe`` is the build's,
    with the input builds it read (without one, the step's static recipe: input builds are
    then not compared). ``run``: the build's run (``BuildRequest.run``): a forced step's
    partial output is resumed only by a retry of the run that started it. Raises
    ``CodeDriftError`` under ``on_code_drift="error"`` for a partial output of other code
    (nothing is written then).
    """
    if not spec.resumable:
        if earlier is not None:  # a resumable attempt of this step's earlier options
            retire_attempt(location, spec)
        return None
    recipe = recipe or Recipe.of(spec)
    verdict = verdict_for(location, spec, lease, earlier, on_code_drift, recipe, run)
    if verdict is not None:
        log.info("%s %s: %s", "resume" if verdict.resume else "clear", spec.step_id, verdict.reason)
    resumed = verdict is not None and verdict.resume
    if not resumed:
        retire_attempt(location, spec)
    code, first = recipe.code, ""
    if resumed and verdict is not None and verdict.previous is not None:
        # Resumed across a code change (under warn): what it makes is made by both codes.
        code = mixed_digest(verdict.previous.code, code)
        first = verdict.previous.first_started_at or verdict.previous.started_at
    return Attempt(
        number=verdict.next_number if verdict is not None else 1,
        fingerprint=recipe.fingerprint,
        code=code,
        started_at=now_iso(),
        holder=lease.holder,
        resumed=resumed,
        inputs=recipe.input_builds,
        placement=recipe.placement,
        payload=spec.fingerprint_payload,
        ranks=ranks_of(spec.run),
        first_started_at=first,
    )


def record_attempt(
    location: Location, spec: StepSpec, attempt: Attempt | None, recipe: Recipe, run: str
) -> None:
    """Write ``start_attempt``'s attempt (none: not resumable), once the output is cleared (or
    resumed), and remember a forced run's own attempt (``_started_forced``)."""
    if attempt is None:
        return
    write_attempt(location, spec.output_path, attempt)
    if recipe.step_id in recipe.repaired:
        with _lock:
            key = (location.url, spec.output_path)
            _started_forced[key] = (run, attempt.number, attempt.started_at, attempt.holder)


def retire_attempt(location: Location, spec: StepSpec) -> None:
    """Before an output is cleared: an earlier attempt's record goes, then its checkpoints, so
    that no claim of a recipe outlives the output it described."""
    remove_attempt(location, spec.output_path)
    if remove_checkpoints(location, spec):
        # Said, never silent: on a first build no earlier attempt is named for it.
        where = location.url_for(checkpoint_dir(spec.output_path))
        log.info(
            "clear %s: removing what was left at its checkpoint folder %s", spec.step_id, where
        )


def remove_checkpoints(location: Location, spec: StepSpec) -> bool:
    """Remove the step's checkpoint folder (a literal path), if it is there: whether it was."""
    folder = location.path(checkpoint_dir(spec.output_path))
    if not location.exists(folder):
        return False
    with_retries(lambda: location.remove_tree(folder), f"clear {folder}")
    return True


def finish_attempt(location: Location, spec: StepSpec) -> None:
    """After the commit, still holding the lease: the attempt record goes, and the checkpoint
    folder too unless the step keeps it. A failure here only warns: the build is committed."""
    if not spec.resumable:
        return
    try:
        if not spec.keep_checkpoints:
            remove_checkpoints(location, spec)
        remove_attempt(location, spec.output_path)
    except OSError as exc:
        log.warning("could not remove the checkpoints of %s: %s", spec.step_id, exc)


def attempt_provenance(attempt: Attempt | None) -> dict[str, Any]:
    """The record's ``provenance.attempt``: which attempt committed, and whether it resumed;
    for a resumed one, ``provenance.earlier_attempts_s``: how long before it attempt 1 began."""
    if attempt is None:
        return {}
    found: dict[str, Any] = {"attempt": {"number": attempt.number, "resumed": attempt.resumed}}
    start = parse_stored_time(attempt.started_at)
    first = parse_stored_time(attempt.first_started_at)
    if attempt.resumed and start is not None and first is not None and first <= start:
        found["earlier_attempts_s"] = round((start - first).total_seconds(), 3)  # timing.py
    return found
