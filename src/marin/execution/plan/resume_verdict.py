"""Resumable steps at plan time: what an earlier attempt left, and whether it may be resumed.

A resumable step's attempt writes ``<output>.marin/attempt.json`` before ``fn`` runs: the recipe
it ran for (placement, fingerprint and its payload, code digest, the input builds it read), its
number, when it
started, its holder and (a remote step) its job. The store names and parses the file
(``store/step_folder.py``). Its partial output (the output path and
``<output>.marin/checkpoints/``) is kept only for a later attempt of the same recipe, which the
one identity rule says (``store/identity.py``); ``judge`` words it, one pure function used by
``marin plan``, ``marin why``, ``build_step`` and any runner that starts attempts elsewhere
(remote jobs). The file is untrusted data: anything malformed (``UnreadableAttempt``) leaves
the partial output's recipe unknown, so it is cleared, never resumed on a guess, and the plan
says so as the run's log does.
"""

from __future__ import annotations

from dataclasses import dataclass

from marin.execution.digest.config_drift import explain_drift
from marin.execution.errors import CodeDriftError
from marin.execution.store.identity import Recipe, claim_of, judge_claim
from marin.execution.store.records import GC_WAS_DELETING
from marin.execution.store.step_folder import (
    CHECKPOINTS_WITHOUT_ATTEMPT,
    Attempt,
    UnreadableAttempt,
)
from marin.execution.vocabulary import Claim, Mismatch


def _other_recipe(previous: Attempt, recipe: Recipe, payload: str | None) -> str:
    """Why a partial output of another fingerprint is cleared: the changed fields, as drift
    names them (``config.lr: 0.1 -> 0.2``), when the attempt kept its payload and ``payload``
    (the step's fingerprint payload now) is given."""
    fields = [f"{previous.fingerprint[:12]}, now {recipe.fingerprint[:12]}"]
    if previous.payload is not None and payload is not None:
        fields = explain_drift(previous.payload, payload, limit=5) or fields
    return (
        f"has another fingerprint: the config or version changed ({'; '.join(fields)}); "
        "it is cleared"
    )


def _world(previous: Attempt, ranks: int) -> str:
    """``, written by 2 ranks, now 3 ...`` when the partial output was written by another
    world size (both known); else ""."""
    if not previous.ranks or not ranks or previous.ranks == ranks:
        return ""
    return (
        f", written by {previous.ranks} ranks, now {ranks} (ranks is placement, not identity: "
        f"kept; a new job runs {ranks} ranks, a job of it still running is reattached as it is)"
    )


@dataclass(frozen=True)
class ResumeVerdict:
    """Whether a resumable step's partial output is resumed or cleared, and why (one line)."""

    resume: bool
    reason: str
    previous: Attempt | None = None

    @property
    def next_number(self) -> int:
        """The number of the attempt that starts now: one more than the one it resumes."""
        return self.previous.number + 1 if self.resume and self.previous else 1

    def line(self) -> str:
        """``resume: ...`` or ``clear: ...``, as ``marin plan`` and ``marin why`` print it."""
        return ("resume: " if self.resume else "clear: ") + self.reason


FORCED = "--force rebuilds the step from scratch"


def _cleared_first(previous: Attempt, forced: bool, half_deleted: bool) -> str:
    """Why ``previous`` is cleared whatever its recipe ('' if it is judged by it): forced, half
    deleted by ``marin gc``, or no placement recorded (where it was made is unknown)."""
    if forced:
        return FORCED
    if half_deleted:
        return f"{GC_WAS_DELETING} and did not finish"
    return "" if previous.placement else "it did not record where it was made (placement)"


def without_attempt(found: UnreadableAttempt | None) -> ResumeVerdict:
    """The verdict on a partial output without an attempt record, or beside an
    ``attempt.json`` that is no attempt (``found``): cleared, its recipe unknown."""
    if found is None:
        return ResumeVerdict(False, "partial output without an attempt record is cleared")
    if found == CHECKPOINTS_WITHOUT_ATTEMPT:
        return ResumeVerdict(
            False,
            "what is at its checkpoint folder was left by no attempt Marin recorded (no "
            "attempt.json): it is cleared",
        )
    return ResumeVerdict(
        False,
        f"partial output with an unreadable attempt.json ({found.why}) is cleared: the recipe "
        "that made it is unknown",
    )


def judge(
    recipe: Recipe,
    previous: Attempt | UnreadableAttempt | None,
    on_code_drift: str,
    payload: str | None = None,
    forced: bool | None = None,
    ranks: int = 0,
    half_deleted: bool = False,
) -> ResumeVerdict:
    """Resume ``previous``'s partial output only when it is ``recipe``'s (``judge_claim``).
    ``payload``: the step's fingerprint payload, to name the config fields that changed.
    A forced step (``forced``; None: the recipe's step is among its ``repaired``, ``--force``
    names) clears it: forcing repairs, and a damaged checkpoint is what it repairs.
    Another fingerprint, placement or input build clears it; so does an unknown (an attempt
    that did not record its input builds). A changed code digest follows ``on_code_drift``:
    ``warn`` resumes and says so, ``rebuild`` clears, ``error`` raises ``CodeDriftError`` (at
    plan time: before anything runs). Another world size (``ranks``) resumes, saying so. One
    ``marin gc`` was deleting (``half_deleted``), or with no readable attempt, is cleared. Pure."""
    if not isinstance(previous, Attempt):
        return without_attempt(previous)
    which = f"attempt {previous.number} ({previous.age()}"
    forced = recipe.step_id in recipe.repaired if forced is None else forced
    cleared = _cleared_first(previous, forced, half_deleted)
    if cleared:
        return ResumeVerdict(False, f"partial output from {which}) is cleared: {cleared}", previous)
    verdict = judge_claim(recipe, claim_of(previous), on_code_drift)
    if verdict.differs == Mismatch.CONFIG:
        return ResumeVerdict(
            False,
            f"partial output from {which}) {_other_recipe(previous, recipe, payload)}",
            previous,
        )
    changed = "; ".join(verdict.code_drift)
    world = _world(previous, ranks)
    if verdict.claim == Claim.OURS and not verdict.code_drift:
        return ResumeVerdict(True, f"partial output from {which}, same fingerprint){world}",
                             previous)  # fmt: skip
    if verdict.claim == Claim.OURS:
        return ResumeVerdict(
            True,
            f"partial output from {which}, same fingerprint; code changed: {changed}; resumed "
            f"anyway (on_code_drift=warn){world}",
            previous,
        )
    if verdict.differs == Mismatch.CODE:
        if on_code_drift == "error":
            raise CodeDriftError(
                f"code changed since the partial output of {which}) was written: {changed}",
                "resume it anyway with --on-code-drift warn, clear it with --on-code-drift "
                "rebuild, or restore the code",
                recipe.step_id,
            )
        return ResumeVerdict(
            False,
            f"partial output from {which}) ran other code ({changed}); it is cleared "
            "(on_code_drift=rebuild)",
            previous,
        )
    why = verdict.reason.removeprefix(f"attempt {previous.number}").strip()
    return ResumeVerdict(False, f"partial output from {which}) {why}; it is cleared", previous)
