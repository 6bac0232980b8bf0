"""The one decision: is a step built, served from its record, or pruned, and why?

``decide`` is the only code that answers "build, skip or prune". It is pure (no storage, no
logging): it sees one step, what storage holds for it, what its dependencies hold or are about to
become, and the run's ``Policy``. ``marin plan``, the ``StepRunner``, the compiled Prefect flow,
the Airflow tasks and ``build_step``'s re-check after taking the lease all call it, so a plan
predicts a run exactly, whichever runner does the run.

The rule, per step:

- **build** when it is forced, has a mutable version, drifted under ``on_drift="rebuild"``, is
  stale (``cascade``: an upstream is rebuilt in this run, or its record was made from an upstream
  build that has since been replaced), or has no usable record and something needs it;
- **skip** (serve the record) when it has a usable record and is not stale (a drifted record is
  usable under ``warn``; a stale one under ``cascade=False``, with a warning);
- **prune** when it has no usable record and nothing that runs needs it: a missing intermediate
  below built steps is not rebuilt.

A record of another step at a step's path (``foreign``: copied there, say) is never served, and
never replaced: a step that would be built over one is decided ``build`` with a ``refusal``,
which ``build_step`` raises before it writes anything; the other steps go on as after any
failed step. Not needed, such a step is pruned. What else a build refuses before writing
anything depends on what lies around its output path (``builder/clearing.py``'s rules: inside
another step's output, data Marin never wrote, a registered build), which ``decide`` never
reads: ``marin plan`` asks those rules of the steps decided ``build``
(``plan_view.build_refusals``).

Under ``on_drift="error"`` a drifted step raises ``DriftError``, wherever it sits in the graph.

Two advisory inputs come from the records (issue 25, docs/caching.md): **code drift** (the
step's code digest differs from its record's; ``on_code_drift`` says warn, rebuild or error,
a ``CodeDriftError``), and **early cutoff**: an upstream rebuilt since a record, whose output
digest is the one the record consumed, does not make it stale (unless the user named that
upstream with ``--force``: forcing a step repairs it, and everything read from it). An
upstream rebuilt in this run that has not committed yet makes a step a build
``unless_unchanged``: the runner decides it again, with this function, once that upstream has
committed.

Whether a step is "needed" and whether an upstream "is rebuilt" depend on the decisions of the
steps around it, so ``plan_graph`` finds the least fixed point: it re-decides a step whenever a
neighbour's decision changes until nothing changes. The rule stays in ``decide``; the solver
only feeds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marin.execution.digest.config_drift import bumped_inputs, explain_drift
from marin.execution.errors import (
    ArtifactTypeMismatchError,
    CodeDriftError,
    DriftError,
    FailedBeforeError,
    FingerprintMismatchError,
    ForeignRecordError,
)
from marin.execution.heap import frozen_heap
from marin.execution.pipeline.remote_option import ranks_of
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.options import Policy as Policy  # declared with RunOptions; re-exported
from marin.execution.plan.options import resolve_force as resolve_force
from marin.execution.plan.resume_verdict import ResumeVerdict, judge
from marin.execution.store.identity import LINEAGE_NONE as LINEAGE_NONE
from marin.execution.store.identity import LINEAGE_OK as LINEAGE_OK
from marin.execution.store.identity import LINEAGE_STALE as LINEAGE_STALE
from marin.execution.store.identity import LINEAGE_UNKNOWN as LINEAGE_UNKNOWN
from marin.execution.store.identity import (
    NO_LINEAGE,
    Lineage,
    Recipe,
    Verdict,
    claim_of,
    judge_claim,
)
from marin.execution.store.identity import Upstream as Upstream  # defined with the identity rule
from marin.execution.store.placement import recorded_adoption
from marin.execution.store.records import (
    FAILED,
    NO_SHARED_BUILD,
    RUNNING,
    STEP_FIELD,
    ArtifactRecord,
    ForeignRecord,
    SharedBuild,
    gc_was_deleting,
    replaced_build,
)
from marin.execution.store.step_folder import Attempt, UnreadableAttempt
from marin.execution.vocabulary import Action, StoredStatus

ACTIONS = tuple(Action)
STATUSES = tuple(StoredStatus)
"""What storage holds for a step (``status`` in ``marin plan --json``), in report order."""

BUILT_REASON = "built: record matches fingerprint"


@dataclass(frozen=True)
class Stored:
    """What storage holds for one step: its committed record and its last status, if any."""

    record: ArtifactRecord | None = None
    status: Mapping[str, Any] | None = None
    foreign: ForeignRecord | None = None
    """A record of another step where this step's record belongs (``record`` is None then)."""
    attempt: Attempt | UnreadableAttempt | None = None
    """A resumable step's last attempt (``attempt.json``; ``UnreadableAttempt`` when it is there
    but malformed), read only when it has no record."""
    shared: SharedBuild = NO_SHARED_BUILD
    """Placed in a user's folder with no record there: what its shared placement holds
    (``shared_build``)."""
    adopts: Mapping[str, str] | None = None
    """For an adoption's record: the builds it adopts now, output path -> build id
    (``adopted_now``: empty when its source lies in no build under the prefix; None: not
    read)."""

    @property
    def replaced(self) -> str:
        """Without a record: the build an unfinished rebuild deleted (``replaced_build``)."""
        return "" if self.record is not None else replaced_build(self.status)

    def as_upstream(self, spec: StepSpec, rebuilt: bool = False) -> Upstream:
        """The step as a dependent's input: its record, or the build a rebuild deleted. Rebuilt
        with another config than its record's, its output digest (which covers the config)
        changes whatever its bytes: no early cutoff (``Upstream.new_config``)."""
        shared = self.shared if self.record is None else NO_SHARED_BUILD
        new_config = (
            rebuilt and self.record is not None and (self.record.fingerprint != spec.fingerprint)
        )
        return Upstream(spec.step_id, self.record, rebuilt, replaced=self.replaced,
                        shared=shared, adopts=self.adopts, new_config=new_config)  # fmt: skip


NOTHING_STORED = Stored()


@dataclass(frozen=True)
class Decision:
    """``decide()``'s verdict for one step: the action (build, skip or prune), what storage
    holds (status), and why, with the record it read and any drift or staleness it found.

    Invariant: ``action == SKIP`` only with a ``record`` (only a record is ever served)."""

    spec: StepSpec
    action: Action
    status: StoredStatus
    """What storage holds for the step."""
    reason: str
    """One human sentence: why this action."""
    record: ArtifactRecord | None = None
    stored_status: Mapping[str, Any] | None = None
    drift: tuple[str, ...] = field(default=())
    """For a drifted record: one line per changed field."""
    stale: tuple[str, ...] = field(default=())
    """Why the record is out of date with its upstream (``upstream X was rebuilt ...``)."""
    lineage: str = LINEAGE_NONE
    """For a record: ``ok``, ``stale``, or ``unknown`` (written before build ids existed)."""
    forced: bool = False
    refusal: tuple[str, str] | None = None
    """``(what, fix)`` when the step must be built but may not be (a foreign record is in the
    way): ``build_step`` raises it as a ``ForeignRecordError`` before writing anything."""
    code_drift: tuple[str, ...] = field(default=())
    """For a record whose step's code changed since: one line per changed function or class."""
    unless_unchanged: tuple[str, ...] = field(default=())
    """A build only because these upstream steps are rebuilt in this run: their new output may
    turn out unchanged, and then this step is served instead (decided again once they commit)."""
    unchanged: tuple[str, ...] = field(default=())
    """Upstream steps rebuilt since this record, whose output is the one it consumed."""
    resume: ResumeVerdict | None = None
    """A resumable step built over an earlier attempt: whether its partial output is resumed."""
    recipe: Recipe | None = None
    """The static part of the recipe a build of the step makes (``store/identity.py``),
    computed once by the plan; a build completes it with the input builds it reads."""
    shared: SharedBuild = NO_SHARED_BUILD
    """``Stored.shared``: what the shared placement of a user-placed step with no record of
    its own holds."""

    def as_upstream(self, rebuilt: bool = False) -> Upstream:
        """The step as a dependent's input, as the plan read it (``Stored.as_upstream``)."""
        stored = Stored(self.record, self.stored_status, shared=self.shared)
        return stored.as_upstream(self.spec, rebuilt)

    def refused(self) -> ForeignRecordError | None:
        """The error ``build_step`` raises for ``refusal``, before writing anything (None
        without one)."""
        if self.refusal is None:
            return None
        return ForeignRecordError(*self.refusal, self.spec.step_id)

    def raise_if_refused(self) -> None:
        """Raise ``refused()``, if any."""
        refused = self.refused()
        if refused is not None:
            raise refused

    @property
    def served_with_warning(self) -> bool:
        """Served although drifted (``warn``) or stale (``cascade=False``): worth a warning."""
        return self.action == Action.SKIP and bool(self.drift or self.stale or self.code_drift)


def _own_status(spec: StepSpec, stored: Stored) -> tuple[StoredStatus, str, tuple[str, ...]]:
    """(status, reason, drift lines) from the step's own record and status alone."""
    record = stored.record
    if stored.foreign is not None:
        return StoredStatus.FOREIGN, stored.foreign.why, ()
    if spec.mutable:
        return StoredStatus.DEV, f"version {spec.version!r} is mutable: rebuilds every run", ()
    if record is None:
        state = (stored.status or {}).get("state")
        other = (stored.status or {}).get(STEP_FIELD, spec.step_id)
        if state == FAILED and other != spec.step_id:  # another version's, at a shared pin
            return StoredStatus.RUN, f"a failed attempt of {other} is at its output", ()
        if state == FAILED:
            error = str((stored.status or {}).get("error", ""))
            return StoredStatus.FAILED_BEFORE, f"previous failure: {error}", ()
        if state == RUNNING:
            return StoredStatus.RUN, "unfinished earlier attempt (or running elsewhere now)", ()
        return StoredStatus.RUN, "new: no record yet", ()
    if record.fingerprint == spec.fingerprint:
        return StoredStatus.BUILT, BUILT_REASON, ()
    drift = tuple(explain_drift(record.fingerprint_payload, spec.fingerprint_payload))
    return StoredStatus.DRIFT, "config changed without a version bump", drift


def _unchanged_note(ids: Sequence[str]) -> str:
    return "; ".join(f"upstream {i} rebuilt, output unchanged" for i in ids)


UNLESS_UNCHANGED = "rebuilt unless the upstream output is unchanged"


def decide(
    spec: StepSpec,
    stored: Stored,
    upstream: Sequence[Upstream],
    policy: Policy,
    *,
    needed: bool,
    recipe: Recipe | None = None,
) -> Decision:
    """Build, skip or prune ``spec``, and why. Pure: no I/O. ``upstream``: one entry per
    dependency; ``needed``: a target, or read by a step built in this run (``plan_graph``
    re-decides when either changes). Whether the record (and an attempt) is the ``recipe``'s
    is ``store/identity.py``'s answer. A forced or mutable step rebuilds: none raise.

    Raises:
        DriftError: a drifted record under ``on_drift="error"``.
        CodeDriftError: a record whose code changed, under ``on_code_drift="error"``.
        ArtifactTypeMismatchError: the record was built as another ``artifact_type``.
        FingerprintMismatchError: a drifted record of a step pinned by ``expected_fingerprint``.
        FailedBeforeError: a needed step whose last attempt failed, under
            ``force_run_failed=False``.
    """
    (status, why, drift), record = _own_status(spec, stored), stored.record
    forced, static = spec.step_id in policy.force, recipe or Recipe.of(spec)
    verdict, found = _judged(static, record, upstream, policy)
    lineage, stale, pending, unchanged = found.state, found.stale, found.pending, found.unchanged
    stale += _source_rebuilt(record, stored.adopts)
    code_drift = _code_drift(verdict, status)

    def decision(action: Action, reason: str, **extra: Any) -> Decision:
        if action == Action.BUILD and stored.attempt is not None:
            extra["resume"] = _resume(spec, stored, static, upstream, policy)
        return Decision(
            spec, action, status, reason, record, stored.status, drift, forced=forced,
            lineage=lineage, code_drift=code_drift, recipe=static, shared=stored.shared, **extra,
        )  # fmt: skip

    if stored.foreign is not None:
        action, reason, refusal = _over_foreign(spec, stored.foreign, why, forced or needed)
        return decision(action, reason, refusal=refusal) if refusal else decision(action, reason)
    if forced:
        return decision(Action.BUILD, "forced (--force)")
    if status == StoredStatus.DEV:
        return decision(Action.BUILD, why)
    rebuild = _other_kind(spec, record) or _rebuild_or_raise(
        spec, record, status, why, drift, code_drift, policy
    )
    if rebuild is not None:
        return decision(Action.BUILD, rebuild)
    if record is None:
        return decision(*_without_record(spec, status, why, needed, policy))
    hint = _bump_hint(spec, record) if status == StoredStatus.DRIFT else ""
    why = _served_note(
        why, status, code_drift, _unknown_lineage(lineage, record), verdict, policy, hint
    )
    if stale and policy.cascade:
        reason = "stale: " + "; ".join(stale) + (f" ({UNLESS_UNCHANGED})" if pending else "")
        return decision(Action.BUILD, reason, stale=stale, unless_unchanged=pending)
    why += _served_anyway(stale, unchanged)
    return decision(Action.SKIP, why, stale=stale, unchanged=unchanged)


def _resume(
    spec: StepSpec, stored: Stored, static: Recipe, upstream: Sequence[Upstream], policy: Policy
) -> ResumeVerdict:
    """Whether a build of ``spec`` resumes the partial output of ``stored.attempt``."""
    assert stored.attempt is not None
    now = static.consuming(upstream, policy.force)
    return judge(now, stored.attempt, policy.on_code_drift, spec.fingerprint_payload,
                 ranks=ranks_of(spec.run), half_deleted=gc_was_deleting(stored.status))  # fmt: skip


def _other_kind(spec: StepSpec, record: ArtifactRecord | None) -> str:
    """Why ``record`` is replaced whatever the policy: an adoption's for a built step, or the
    reverse. Not drift: serving it gives readers other data than its lineage names."""
    if record is None or (record.source is None) == (spec.source is None):
        return ""
    was = "an adoption" if record.source is not None else "a build"
    return f"its record is {was}, and the step is not: replaced"


def _source_rebuilt(
    record: ArtifactRecord | None, adopts: Mapping[str, str] | None
) -> tuple[str, ...]:
    """Why an adoption's record is stale: a build its data lies in or holds is not the one it
    adopted (rebuilt in place, or gone), or its data lies in a build it did not record."""
    if record is None or adopts is None:
        return ()
    was = recorded_adoption(record)
    if was == dict(adopts):
        return ()
    changed = sorted(p for p in set(was) | set(adopts) if was.get(p) != adopts.get(p))
    return (f"the build at {', '.join(changed)}, which its adopted source lies in or holds, "
            "changed since this adoption (rebuilt, gone, or new)",)  # fmt: skip


def _served_anyway(stale: Sequence[str], unchanged: Sequence[str]) -> str:
    """What a served record's reason adds: staleness served without a cascade, and upstreams
    rebuilt into the output it consumed (early cutoff)."""
    why = ("; stale but served (no cascade): " + "; ".join(stale)) if stale else ""
    return why + (f"; {_unchanged_note(unchanged)}" if unchanged else "")


def _judged(
    static: Recipe, record: ArtifactRecord | None, upstream: Sequence[Upstream], policy: Policy
) -> tuple[Verdict | None, Lineage]:
    """The identity rule's verdict on the record, against the recipe a build would make now
    (reading ``upstream``), and its lineage; none without a record."""
    if record is None:
        return None, NO_LINEAGE
    recipe = static.consuming(upstream, policy.force)
    verdict = judge_claim(recipe, claim_of(record), policy.on_code_drift)
    return verdict, verdict.lineage


def _code_drift(verdict: Verdict | None, status: StoredStatus) -> tuple[str, ...]:
    """What changed in the step's code since the record it could serve (none without one)."""
    if verdict is None or status not in (StoredStatus.BUILT, StoredStatus.DRIFT):
        return ()
    return verdict.code_drift


def _served_note(
    why: str,
    status: StoredStatus,
    code_drift: tuple[str, ...],
    unknown_lineage: str,
    verdict: Verdict | None,
    policy: Policy,
    bump_hint: str = "",
) -> str:
    """``why`` a usable record is what it is, with what serving it would overlook
    (``bump_hint``: what to do about a drift that an input's version bump caused)."""
    if status == StoredStatus.DRIFT:
        why = f"{why}: served from cache (on_drift=warn){bump_hint}"
    if code_drift:
        why += "; code changed: served from cache (on_code_drift=warn)"
    elif verdict is not None and verdict.code_unknown and policy.on_code_drift != "warn":
        # A record's code is advisory: served, but never called unchanged.
        why += f"; code not compared ({verdict.code_unknown})"
    return why + (f"; lineage unknown ({unknown_lineage})" if unknown_lineage else "")


def _unknown_lineage(lineage: str, record: ArtifactRecord) -> str:
    """Why a record's input builds are unknown ("" when they are not): it has none (an older
    Marin), or names other inputs' builds (another version of an input: red team r34-3)."""
    if lineage != LINEAGE_UNKNOWN:
        return ""
    if not record.inputs:
        return "record written before build ids"
    named = ", ".join(sorted(record.inputs))
    return f"the record names the builds of {named}, not of every current input"


def _bump_hint(spec: StepSpec, record: ArtifactRecord) -> str:
    """``; ngram/dataset moved to v2: bump this step's version too, or --on-drift rebuild``:
    what to do about a reader that drifted because an input's version was bumped."""
    bumped = bumped_inputs(record.fingerprint_payload, spec.fingerprint_payload)
    if not bumped:
        return ""
    moved = ", ".join(f"{name} moved to {version}" for name, version in bumped)
    return f"; {moved}: bump this step's version too, or --on-drift rebuild"


def _without_record(
    spec: StepSpec, status: StoredStatus, why: str, needed: bool, policy: Policy
) -> tuple[Action, str]:
    """No usable record: built when needed, else pruned. Raises ``FailedBeforeError`` for a
    needed step whose last attempt failed under ``force_run_failed=False``."""
    if needed and status == StoredStatus.FAILED_BEFORE and not policy.force_run_failed:
        raise FailedBeforeError(
            f"its last attempt failed ({why}) and the run has force_run_failed=False",
            "fix the cause and run with force_run_failed=True (the default), or force the step",
            spec.step_id,
        )
    if needed:
        return Action.BUILD, why
    return Action.PRUNE, f"pruned: not built ({why}), and nothing that runs needs it"


def _over_foreign(
    spec: StepSpec, foreign: ForeignRecord, why: str, wanted: bool
) -> tuple[Action, str, tuple[str, str] | None]:
    """Another step's record where ``spec``'s belongs: a build refused (never over it), or
    pruned when nothing wants the step."""
    if wanted or spec.mutable:
        # Building would replace the other step's record, which is not this step's to
        # delete; and serving it would serve another step's artifact.
        file = foreign.path
        refusal = (
            f"{file} is not the record of {spec.step_id} ({why}); building the step "
            "would replace it",
            f"move {file} (or its whole folder) away, then run again: Marin never "
            "serves or deletes another step's record",
        )
        if spec.pin is not None:  # pinned onto another step's build (another pipeline's)
            refusal = (
                f"pin {spec.pin!r} is the output of {foreign.record.step_id} ({file}); "
                f"{spec.step_id} would serve or replace that build",
                f"give {spec.step_id} another pin, or read {foreign.record.step_id}'s build "
                "through ArtifactStep.adopt: Marin never serves or replaces another step's record",
            )
        return Action.BUILD, f"{why}: a run refuses to build over it", refusal
    return Action.PRUNE, f"pruned: not built ({why}), and nothing that runs needs it", None


def _rebuild_or_raise(
    spec: StepSpec,
    record: ArtifactRecord | None,
    status: StoredStatus,
    why: str,
    drift: tuple[str, ...],
    code_drift: tuple[str, ...],
    policy: Policy,
) -> str | None:
    """Why a record that changed under the step is rebuilt (the drift policies say
    ``rebuild``); None when it is not. Raises ``ArtifactTypeMismatchError``,
    ``FingerprintMismatchError``, ``DriftError`` or ``CodeDriftError`` where a policy or a pin
    says so."""
    if record is not None and record.artifact_type != spec.artifact_type:
        # Not drift: the fingerprint holds the config, and serving a record built as another
        # kind of artifact would hand consumers the wrong thing whatever the drift policy.
        raise ArtifactTypeMismatchError(
            f"the stored record was built as artifact_type {record.artifact_type!r}, but the "
            f"step now declares {spec.artifact_type!r}",
            "bump the step's version for the new kind of artifact (or --force it to rebuild "
            "in place)",
            spec.step_id,
        )
    if status == StoredStatus.DRIFT:
        if spec.pinned_fingerprint:
            raise FingerprintMismatchError(
                f"the stored build has fingerprint {record.fingerprint if record else '?'}, but "
                f"expected_fingerprint pins {spec.fingerprint}: " + "; ".join(drift),
                "bump the version to build the pinned recipe, or --force the step to rebuild "
                "it in place",
                spec.step_id,
            )
        if policy.on_drift == "error":
            raise DriftError(
                "config changed without a version bump: " + "; ".join(drift),
                "bump the step's version, or choose the drift policy rebuild or warn "
                "(--on-drift, or on_drift=)",
                spec.step_id,
            )
        if policy.on_drift == "rebuild":
            return f"{why}: rebuilding (on_drift=rebuild)"
    if code_drift:
        if policy.on_code_drift == "error":
            raise CodeDriftError(
                "code changed since the step was built: " + "; ".join(code_drift),
                "bump the step's version to build the new code at a new path, --force the "
                "step to rebuild it in place, or choose the code drift policy rebuild or warn "
                "(--on-code-drift, or on_code_drift=)",
                spec.step_id,
            )
        if policy.on_code_drift == "rebuild":
            return "code changed: rebuilding (on_code_drift=rebuild)"
    return None


# --- the graph ---------------------------------------------------------------------------------


@dataclass
class Plan:
    """Every step's decision, in dependency order (dependencies before dependents)."""

    decisions: dict[str, Decision]
    """By output path."""
    policy: Policy

    def of(self, spec: StepSpec) -> Decision:
        return self.decisions[spec.output_path]

    def paths(self, action: Action) -> list[str]:
        return [p for p, d in self.decisions.items() if d.action == action]

    @property
    def to_build(self) -> list[str]:
        return self.paths(Action.BUILD)

    def recipe(self, spec: StepSpec) -> Recipe:
        """The recipe the plan expects a build of ``spec`` to make: its input builds are the
        records the plan read, an input the plan builds being a new build."""
        upstream = [
            self.of(d).as_upstream(self.of(d).action == Action.BUILD)
            for d in dict.fromkeys(spec.deps)
        ]
        static = self.of(spec).recipe or Recipe.of(spec)
        return static.consuming(upstream, self.policy.force)

    def upstream(self, spec: StepSpec, built: Mapping[str, ArtifactRecord]) -> list[Upstream]:
        """``spec``'s dependencies as it sees them mid-run: each one built in this run (``built``:
        output path -> its new record) is ``rebuilt`` and ``committed``; the others hold what
        the plan read."""
        ups: dict[str, Upstream] = {}
        for dep in spec.deps:
            record = built.get(dep.output_path)
            if record is not None:
                ups[dep.step_id] = Upstream(dep.step_id, record, rebuilt=True, committed=True)
            else:
                ups[dep.step_id] = self.decisions[dep.output_path].as_upstream()
        return list(ups.values())


def plan_graph(
    steps: Sequence[StepSpec],
    targets: Sequence[StepSpec],
    stored: Mapping[str, Stored],
    policy: Policy,
) -> Plan:
    """Decide every step of ``steps`` (all of them, dependencies first; see ``collect_steps``).

    ``stored`` maps output path -> what storage holds (missing: nothing). Under
    ``on_drift="error"`` every drifted step is found, wherever it sits, and one ``DriftError``
    names them all before anything can run.

    Raises:
        DriftError: one naming every drifted step, under an ``error`` drift policy (a
            ``CodeDriftError`` when each of them drifted in code).
        MarinError: what ``decide`` raises otherwise, for the first step that raises it.
    """
    with frozen_heap():  # the graph is out of the collector's scans meanwhile
        solver = _FixedPoint(steps, {t.output_path for t in targets}, stored, policy)
        solver.solve()
        return solver.plan()


class _FixedPoint:
    """``plan_graph``'s solver: the least fixed point of ``decide`` over the graph.

    A step only ever moves from skip/prune to build, and each move re-queues the neighbours
    whose inputs it changes: dependencies without a record (now needed) and dependents with a
    record or a partial attempt (an upstream is rebuilt); ``decide`` reads ``needed`` only
    without a record and ``upstream`` only with one of those. Dependents go first, so
    "needed" reaches a dependency before it is decided: on a new prefix each step is decided
    once.
    """

    def __init__(
        self,
        steps: Sequence[StepSpec],
        target_paths: set[str],
        stored: Mapping[str, Stored],
        policy: Policy,
    ) -> None:
        self.by_path = {s.output_path: s for s in steps}
        self.deps = {
            p: list(dict.fromkeys(d.output_path for d in s.deps)) for p, s in self.by_path.items()
        }
        self.dependents: dict[str, list[str]] = {p: [] for p in self.by_path}
        for path, ds in self.deps.items():
            for d in ds:
                self.dependents[d].append(path)
        self.target_paths = target_paths
        self.policy = policy
        self.building: set[str] = set()
        self.needers: dict[str, int] = {p: 0 for p in self.by_path}
        """How many dependents that build read each step."""
        self.drifted: dict[str, DriftError] = {}
        self.own = {p: stored.get(p, NOTHING_STORED) for p in self.by_path}
        self.recipes = {p: Recipe.of(s) for p, s in self.by_path.items()}
        """Each step's static recipe, once (``store/identity.py``)."""
        # Upstream views are frozen, so one per (dependency, rebuilt) serves every dependent.
        self.as_upstream = {
            p: (self.own[p].as_upstream(s), self.own[p].as_upstream(s, True))
            for p, s in self.by_path.items()
        }
        self.last: dict[str, Decision] = {}
        """Each step's latest decision; dropped when a neighbour's change may alter it."""
        self.queue: deque[str] = deque(reversed(self.by_path))
        self.queued = set(self.by_path)

    def current(self, path: str) -> Decision:
        """Decide ``path`` on what its neighbours' decisions are now (raises ``DriftError``)."""
        upstream = [self.as_upstream[d][d in self.building] for d in self.deps[path]]
        needed = path in self.target_paths or self.needers[path] > 0
        spec, recipe = self.by_path[path], self.recipes[path]
        decision = decide(spec, self.own[path], upstream, self.policy, needed=needed, recipe=recipe)
        self.last[path] = decision
        return decision

    def changed(self, path: str) -> None:
        """An input of ``path``'s decision changed: decide it again (a step already building
        stays building, so only its cached decision goes: its reason may name the change)."""
        self.last.pop(path, None)
        if path not in self.queued and path not in self.building:
            self.queued.add(path)
            self.queue.append(path)

    def solve(self) -> None:
        """Decide queued steps until none is queued; a drifted step is kept for the end."""
        while self.queue:
            path = self.queue.popleft()
            self.queued.discard(path)
            try:
                decision = self.current(path)
            except DriftError as exc:
                self.drifted[path] = exc
                continue
            if decision.action == Action.BUILD and path not in self.building:
                self.builds(path)

    def builds(self, path: str) -> None:
        """``path`` is now built: its dependencies are needed, its dependents' upstream rebuilt."""
        self.building.add(path)
        for d in self.deps[path]:
            self.needers[d] += 1
            if self.own[d].record is None:
                self.changed(d)
        for dependent in self.dependents[path]:
            own = self.own[dependent]
            if own.record is not None or own.attempt is not None:  # its claim reads inputs
                self.changed(dependent)

    def plan(self) -> Plan:
        """Every step's decision; raises one ``DriftError`` naming every drifted step."""
        if self.drifted:
            raise _all_drift([self.drifted[p] for p in self.by_path if p in self.drifted])
        return Plan({p: self.last.get(p) or self.current(p) for p in self.by_path}, self.policy)


def _all_drift(errors: list[DriftError]) -> DriftError:
    if len(errors) == 1:
        return errors[0]
    lines = [f"{e.step}: {e.what}" for e in errors]
    if all(isinstance(e, CodeDriftError) for e in errors):
        return CodeDriftError(
            f"{len(errors)} steps' code changed since they were built [" + "; ".join(lines) + "]",
            errors[0].fix,
        )
    return DriftError(
        f"{len(errors)} steps changed without a version bump [" + "; ".join(lines) + "]",
        errors[0].fix,
    )
