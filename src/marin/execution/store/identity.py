"""One identity of a build: whether stored work is this recipe's (docs/caching.md, "Whose work").

A build's **recipe** is its placement (the output path it writes, below the prefix: scope, user
and version codex resolved), its fingerprint (config and dependencies' versions), its code
digest, and the exact input builds it consumes (each dependency's build id). Work is reused by
several mechanisms (serving a record, early cutoff, reattaching to or collecting a remote job,
resuming a partial attempt; ``gc`` keeps what a recipe claims), and each asks one function,
``judge_claim``, whether a stored thing (a record, an ``attempt.json``, a ``job.json``) claims
the recipe at hand. Its verdict:

- **ours**: the same placement, config, input builds and code; for a record, a dependency
  rebuilt into the very bytes it read counts as the same input (early cutoff; never an input
  named by ``--force``; never for an attempt or a job, which may have read that input while
  it was being rebuilt: their commit is what checks their inputs). Under
  ``on_code_drift="warn"`` a code change is advisory: ours, with a note.
- **not ours**, with a one-line reason: another placement, config, input build, or (under
  ``rebuild`` and ``error``) other code. An attempt or a job that names an input the step
  does not have read another set of inputs: not ours either (exact input builds are the
  same set; a record may also name the builds its adopted data lies in), and so is one that
  read an adoption whose source was rebuilt since its record (``Upstream.moved``): it may
  have read the old data.
- **unknown**: what the thing claims cannot be compared: it did not record the input builds it
  read (written by an older version), or a code digest is unknown (under ``rebuild`` and
  ``error``). Unknown is never "unchanged": a caller reuses unknown work only where its policy
  says so (a record is served, with a note; a partial attempt or a job is replaced).

The verdict also carries what each policy needs (config changed, the lineage lines, the code
drift lines), so ``decide`` applies ``on_drift``, ``cascade`` and ``on_code_drift`` to exactly
what this function found. Pure: no storage, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from marin.execution.digest.code import CodeDigest, code_digest
from marin.execution.digest.code_drift import explain_code_drift
from marin.execution.digest.output import same_digest
from marin.execution.store.placement import recorded_adoption
from marin.execution.store.records import (
    NO_SHARED_BUILD,
    UNKNOWN_BUILD,
    ArtifactRecord,
    SharedBuild,
)
from marin.execution.store.step_folder import Attempt, JobRecord
from marin.execution.vocabulary import Claim, Mismatch

LINEAGE_OK, LINEAGE_STALE, LINEAGE_UNKNOWN, LINEAGE_NONE = "ok", "stale", "unknown", "none"
"""Lineage of a claim against the recipe's input builds (``none``: not compared)."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """One dependency as a recipe consumes it (and as its dependent sees it when deciding)."""

    step_id: str
    record: ArtifactRecord | None
    """Its current record (None: not built, or not read because it is rebuilt anyway)."""
    rebuilt: bool = False
    """It is built in this run (planned, or done already), so it becomes a new build."""
    committed: bool = False
    """Rebuilt and committed already: ``record`` is the new build, so a dependent can compare
    its output with the one it consumed (early cutoff) instead of assuming it changed."""
    replaced: str = ""
    """Without a record: the build an unfinished rebuild deleted (its status names it; "":
    none). What read that build is stale: the step is being replaced, not merely missing."""
    shared: SharedBuild = NO_SHARED_BUILD
    """Without a record, placed in a user's folder: what the step's shared placement holds
    (``shared_build``: a record, or an unfinished rebuild's status). What read the step is
    stale: the user's run builds its own."""
    new_config: bool = False
    """Rebuilt in this run with another config than its record's: its output digest covers
    the config, so a dependent is never cut off (its build is not pending that output)."""
    adopts: Mapping[str, str] | None = field(default=None, compare=False)
    """For an adoption's record: the builds its data lies in or holds as the run read them
    (``placement.adopted_now``; None: not read). Other than the ones the record names
    (``moved``), the data changed since it was adopted, before this run: its record may
    still be served (``--no-cascade``), but what an attempt or a job read of it may be
    the old data."""

    @property
    def moved(self) -> bool:
        """An adoption whose source's builds changed since its record was written."""
        if self.adopts is None or self.record is None or self.record.source is None:
            return False
        return dict(self.adopts) != recorded_adoption(self.record)


class _Spec(Protocol):
    """What a recipe is made from (a ``StepSpec``)."""

    @property
    def step_id(self) -> str: ...
    @property
    def output_path(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def code(self) -> CodeDigest | None: ...
    @property
    def run(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class Recipe:
    """The identity of one build of a step: see the module docstring.

    The plan computes the static part once per step (``Recipe.of``); a build completes it with
    the input builds it consumes (``consuming``), read when it starts."""

    step_id: str
    placement: str
    """The output path below the prefix (``users/alice/model/v3``): scope, user, version."""
    fingerprint: str
    code: CodeDigest
    inputs: tuple[Upstream, ...] | None = None
    """Each dependency's build; None before they are known (the plan's static part): input
    builds are then not compared."""
    repaired: frozenset[str] = frozenset()
    """Inputs named by ``--force``: a rebuild of one is never cut off (forcing repairs)."""

    @classmethod
    def of(cls, spec: _Spec) -> Recipe:
        """The static part of ``spec``'s recipe: placement, fingerprint, code digest."""
        code = spec.code if spec.code is not None else code_digest(spec.run)
        return cls(spec.step_id, spec.output_path, spec.fingerprint, code)

    def consuming(
        self, upstream: Sequence[Upstream], repaired: frozenset[str] = frozenset()
    ) -> Recipe:
        """This recipe, reading ``upstream`` (``repaired``: the run's ``--force`` names)."""
        return Recipe(self.step_id, self.placement, self.fingerprint, self.code,
                      tuple(upstream), repaired)  # fmt: skip

    @property
    def input_builds(self) -> dict[str, str]:
        """Dependency -> the build id it consumes, as a record, an attempt and a job store it."""
        return {u.step_id: u.record.build_id for u in self.inputs or () if u.record is not None}


@dataclass(frozen=True, slots=True)
class Claimed:
    """The recipe a stored thing says it was made for."""

    what: str
    """``record``, ``attempt 2``, ``local job marin-...``: how a reason names it."""
    placement: str
    """The output path it was made for ("": not recorded; the file's place is its claim)."""
    fingerprint: str
    code: CodeDigest
    inputs: Mapping[str, str]
    """Dependency -> the build id it read (a dependency missing: not recorded)."""
    input_digests: Mapping[str, str] = field(default_factory=dict)
    """Dependency -> the output digest of the build it read (where known)."""
    url: bool = False
    """``placement`` is a URL (a record's ``output_path``): compared by its tail below the
    prefix, so that a prefix moved as a whole keeps its records (as ``load_record`` does).
    Only a record is committed work: its commit checked that each input was still the build
    it read, so only a record is cut off into an input rebuilt into the same bytes (an attempt
    or a job may have read that input while it was being rebuilt)."""


def claim_of(thing: ArtifactRecord | Attempt | JobRecord) -> Claimed:
    """What a record, an attempt or a job claims."""
    if isinstance(thing, ArtifactRecord):
        return Claimed("record", thing.output_path, thing.fingerprint, thing.code, thing.inputs,
                       thing.input_digests, url=True)  # fmt: skip
    if isinstance(thing, Attempt):
        what = f"attempt {thing.number}"
        return Claimed(what, thing.placement, thing.fingerprint, thing.code, thing.inputs)
    what = f"{thing.backend} job {thing.job_id}"
    return Claimed(what, thing.placement, thing.fingerprint, thing.code, thing.inputs)


@dataclass(frozen=True, slots=True)
class Lineage:
    """A claim's input builds against the recipe's."""

    state: str = LINEAGE_NONE
    """``ok``, ``stale``, ``unknown`` (an input's build not recorded), ``none`` (not compared)."""
    stale: tuple[str, ...] = ()
    """``upstream X was rebuilt after this step`` / ``... is rebuilt in this run``."""
    pending: tuple[str, ...] = ()
    """Stale only through these inputs, rebuilt in this run and not committed yet: their new
    output may turn out to be the bytes it read (then it is ours after all)."""
    unchanged: tuple[str, ...] = ()
    """Inputs rebuilt since, into the very bytes it read (early cutoff)."""


NO_LINEAGE = Lineage()
_OK = Lineage(LINEAGE_OK)
_UNKNOWN = Lineage(LINEAGE_UNKNOWN)


@dataclass(frozen=True, slots=True)
class Verdict:
    """``judge_claim``'s answer: ours, not ours (``reason``), or unknown (``reason``), with
    what each reuse policy needs."""

    claim: Claim
    reason: str = ""
    """One line: why not ours, or why unknown ("" when ours)."""
    note: str = ""
    """Ours despite an advisory difference (other code under ``warn``): what is overlooked."""
    config_changed: bool = False
    lineage: Lineage = NO_LINEAGE
    code_drift: tuple[str, ...] = ()
    """One line per changed function or class (both digests known, and different)."""
    code_unknown: str = ""
    """Why the code could not be compared ("" when it could)."""
    differs: Mismatch | None = None
    """The first part the claim differs in (None: none, or only code under ``warn``)."""

    @property
    def ours(self) -> bool:
        return self.claim == Claim.OURS


def judge_claim(recipe: Recipe, claimed: Claimed, on_code_drift: str) -> Verdict:
    """Whether ``claimed`` is ``recipe``'s work: the one rule every reuse asks (module
    docstring). ``on_code_drift`` is the run's code drift policy (``warn``, ``rebuild``,
    ``error``): under ``warn`` a code difference is advisory. Pure; never raises."""
    what = claimed.what
    moved = bool(claimed.placement) and not _same_placement(claimed, recipe.placement)
    config_changed = claimed.fingerprint != recipe.fingerprint
    lineage = _lineage(recipe, claimed)
    drift = tuple(explain_code_drift(claimed.code, recipe.code))
    unknown_code = "" if drift else _code_unknown(claimed.code, recipe.code)
    strict_code = on_code_drift != "warn"
    claim, differs, why, note = Claim.OURS, None, "", ""
    if moved:
        claim, differs = Claim.NOT_OURS, Mismatch.PLACEMENT
        why = f"{what} was made for {claimed.placement}, not {recipe.placement}"
    elif config_changed:
        claim, differs = Claim.NOT_OURS, Mismatch.CONFIG
        was, now = claimed.fingerprint[:12] or "none recorded", recipe.fingerprint[:12]
        why = f"{what} ran another config (fingerprint {was}, now {now})"
    elif lineage.state == LINEAGE_STALE:
        claim, differs = Claim.NOT_OURS, Mismatch.INPUTS
        why = f"{what} read other input builds: " + "; ".join(lineage.stale)
    elif drift and strict_code:
        claim, differs = Claim.NOT_OURS, Mismatch.CODE
        why = f"{what} ran other code ({'; '.join(drift)})"
    elif lineage.state == LINEAGE_UNKNOWN:
        claim, differs = Claim.UNKNOWN, Mismatch.INPUTS_UNKNOWN
        why = f"{what} did not record which input builds it read"
    elif unknown_code and strict_code:
        claim, differs = Claim.UNKNOWN, Mismatch.CODE_UNKNOWN
        why = f"{what}: its code cannot be compared ({unknown_code}): unknown, never unchanged"
    elif drift:
        note = f"{what} ran other code ({'; '.join(drift)}); reused (on_code_drift=warn)"
    return Verdict(claim, why, note, config_changed, lineage, drift, unknown_code, differs)


def _same_placement(claimed: Claimed, placement: str) -> bool:
    """The claimed output path is ``placement`` (a record's URL: its tail below the prefix)."""
    if claimed.url:
        return claimed.placement == placement or claimed.placement.endswith("/" + placement)
    return claimed.placement == placement


def _code_unknown(stored: CodeDigest, current: CodeDigest) -> str:
    """Why two code digests cannot be compared, or "" when they can."""
    for digest in (current, stored):
        if digest.digest is None:
            return digest.unknown or "no code digest"
        if digest.unseen:  # a callee whose changes cannot be seen: never "unchanged"
            return "unseen: " + ", ".join(digest.unseen[:3])
    if stored.scheme != current.scheme:
        return f"digests of two schemes ({stored.scheme}, {current.scheme})"
    return ""


def _lineage(recipe: Recipe, claimed: Claimed) -> Lineage:
    """The claim's input builds against the recipe's (``Lineage``); not compared before the
    recipe's inputs are known.

    An input of the recipe rebuilt in this run and not committed yet is a new build no claim
    can have read (stale, pending its output); a missing input (not built, not rebuilt) leaves
    the claim valid (an intermediate that is pruned), unless ``_gone_input`` says otherwise; an
    input whose build the claim did not record is unknown, unless it is rebuilt (then it
    changed, as planned). An attempt or a job naming an input the recipe lacks is stale
    (``_not_inputs``).
    """
    if recipe.inputs is None:
        return NO_LINEAGE
    stale: list[str] = []
    pending: list[str] = []
    unchanged: list[str] = []
    unknown = False
    for dep in recipe.inputs:
        if dep.rebuilt and not dep.committed:
            stale.append(f"upstream {dep.step_id} is rebuilt in this run")
            if dep.step_id not in recipe.repaired and not dep.new_config:
                pending.append(dep.step_id)
            continue
        consumed = claimed.inputs.get(dep.step_id)
        if dep.record is None:
            gone = _gone_input(dep, consumed)
            if gone:
                stale.append(gone)
            continue
        if consumed is None:
            if dep.rebuilt:
                stale.append(f"upstream {dep.step_id} is rebuilt in this run")
            else:
                unknown = True
        elif consumed != dep.record.build_id:
            if (
                claimed.url
                and dep.step_id not in recipe.repaired
                and same_digest(
                    _consumed_digest(claimed, dep.step_id, dep.record), dep.record.output
                )
            ):
                unchanged.append(dep.step_id)  # early cutoff: the bytes it read are still there
            elif dep.rebuilt or dep.step_id in recipe.repaired:
                stale.append(f"upstream {dep.step_id} is rebuilt in this run")
            else:
                stale.append(f"upstream {dep.step_id} was rebuilt after this step")
    stale += _not_inputs(recipe, claimed) + _moved_adoptions(recipe, claimed)
    if stale:
        only_pending = len(pending) == len(stale)
        return Lineage(LINEAGE_STALE, tuple(stale), tuple(pending) if only_pending else ())
    if unchanged:
        return Lineage(LINEAGE_UNKNOWN if unknown else LINEAGE_OK, unchanged=tuple(unchanged))
    return _UNKNOWN if unknown else _OK  # the common cases, made once


def _not_inputs(recipe: Recipe, claimed: Claimed) -> list[str]:
    """Why an attempt or a job that names inputs the recipe does not have is stale: exact input
    builds are the same set of inputs (planted, or from another version of the step: never
    this recipe's). A record may name more (the builds its adopted data lies in, which
    ``decide`` checks itself), so only non-records are judged here."""
    if claimed.url or recipe.inputs is None:
        return []
    extra = sorted(set(claimed.inputs) - {dep.step_id for dep in recipe.inputs})
    return [f"upstream {step[:80]!r} is not an input of this step" for step in extra[:3]] + (
        [f"and {len(extra) - 3} more"] if len(extra) > 3 else []
    )


def _moved_adoptions(recipe: Recipe, claimed: Claimed) -> list[str]:
    """Why an attempt or a job that read an adoption whose source's builds changed since its
    record (``Upstream.moved``) is stale: it may have read the data before the change, which
    the input build (the adoption's record, the same) does not show. A record stands: what
    was built from a stale input, served as its readers are (``decide``)."""
    if claimed.url or recipe.inputs is None:
        return []
    return [
        f"upstream {dep.step_id} adopts data in a build rebuilt since it was adopted"
        for dep in recipe.inputs
        if dep.moved and dep.step_id in claimed.inputs
    ]


def _gone_input(dep: Upstream, consumed: str | None) -> str:
    """Why a claim that read ``consumed`` of ``dep``, which has no record where it is placed,
    is stale ("": a pruned intermediate, the claim stands). One rule for every placement: a
    status naming the build an unfinished rebuild deleted (``replaced``; a status that cannot
    be read may have named one) makes what read the step stale, whether it is the step's own
    status or, for a step a user's run places in her folder, its shared one; so does a shared
    build of such a step (``shared``), which her run no longer reads. Either way the claim
    read a build that is not the step's current one here."""
    if consumed is None:
        return ""
    for replaced in (dep.replaced, dep.shared.replaced):
        if replaced == UNKNOWN_BUILD:
            return f"upstream {dep.step_id} has a corrupt status (it may be rebuilt)"
        if replaced:
            return f"upstream {dep.step_id} was being rebuilt and did not finish"
    if dep.shared.build:
        return f"upstream {dep.step_id} is built in the user's folder now"
    return ""


def _consumed_digest(claimed: Claimed, dep_id: str, dep: ArtifactRecord) -> str | None:
    """The digest of what ``claimed`` read of ``dep_id``, as far as it is proven: ``dep`` (the
    current build) replaced exactly that build, and found its bytes still the ones that build
    claimed (``replaced``; the rebuild digests them before clearing them). A damaged output, or
    a build replaced twice since, gives None: no cutoff."""
    verified = dep.replaced.get(claimed.inputs.get(dep_id, ""))
    digest = claimed.input_digests.get(dep_id)
    if verified is None or (digest is not None and digest != verified):
        return None
    return verified
