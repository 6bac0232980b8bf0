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

Under ``on_drift="error"`` a drifted step raises ``DriftError``, wherever it sits in the graph.

Whether a step is "needed" and whether an upstream "is rebuilt" depend on the decisions of the
steps around it, so ``plan_graph`` finds the least fixed point: it re-decides a step whenever a
neighbour's decision changes until nothing changes. The rule stays in ``decide``; the solver
only feeds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marin.execution.drift import explain_drift
from marin.execution.errors import DriftError, InvalidStepError, first_few
from marin.execution.records import FAILED, RUNNING, ArtifactRecord
from marin.execution.step_spec import StepSpec

BUILD, SKIP, PRUNE = "build", "skip", "prune"
ACTIONS = (BUILD, SKIP, PRUNE)

# What storage holds for a step (``status`` in ``marin plan --json``, schema 1).
BUILT, RUN, DRIFT, DEV, FAILED_BEFORE = "built", "run", "drift", "dev", "failed-before"
STATUSES = (BUILT, RUN, DRIFT, DEV, FAILED_BEFORE)

DRIFT_POLICIES = ("warn", "rebuild", "error")
BUILT_REASON = "built: record matches fingerprint"

# Lineage of a usable record against its dependencies' current builds.
LINEAGE_OK, LINEAGE_STALE, LINEAGE_UNKNOWN, LINEAGE_NONE = "ok", "stale", "unknown", "none"


def check_drift_policy(on_drift: str) -> str:
    if on_drift not in DRIFT_POLICIES:
        raise InvalidStepError(
            f"on_drift={on_drift!r} is not a drift policy",
            f"use one of {', '.join(DRIFT_POLICIES)}",
        )
    return on_drift


@dataclass(frozen=True)
class Policy:
    """The choices a run is made with; the same for every runner."""

    on_drift: str = "warn"
    force: frozenset[str] = frozenset()
    """Step ids to rebuild (resolve names with ``resolve_force``)."""
    cascade: bool = True
    """Rebuild steps whose upstream is rebuilt; ``False`` serves them with a warning."""

    def __post_init__(self) -> None:
        check_drift_policy(self.on_drift)
        if not isinstance(self.cascade, bool):
            raise InvalidStepError(f"cascade={self.cascade!r}", "use True or False")


@dataclass(frozen=True)
class Stored:
    """What storage holds for one step: its committed record and its last status, if any."""

    record: ArtifactRecord | None = None
    status: Mapping[str, Any] | None = None


NOTHING_STORED = Stored()


@dataclass(frozen=True)
class Upstream:
    """One dependency as its dependent sees it when deciding."""

    step_id: str
    record: ArtifactRecord | None
    """Its current record (None: not built, or not read because it is rebuilt anyway)."""
    rebuilt: bool = False
    """It is built in this run (planned, or done already), so it becomes a new build."""


@dataclass(frozen=True)
class Decision:
    spec: StepSpec
    action: str
    """``build``, ``skip`` or ``prune``."""
    status: str
    """What storage holds: ``built``, ``run``, ``drift``, ``dev`` or ``failed-before``."""
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

    @property
    def served_with_warning(self) -> bool:
        """Served although drifted (``warn``) or stale (``cascade=False``): worth a warning."""
        return self.action == SKIP and bool(self.drift or self.stale)


def _own_status(spec: StepSpec, stored: Stored) -> tuple[str, str, tuple[str, ...]]:
    """(status, reason, drift lines) from the step's own record and status alone."""
    record = stored.record
    if spec.mutable:
        return DEV, f"version {spec.version!r} is mutable: rebuilds every run", ()
    if record is None:
        state = (stored.status or {}).get("state")
        if state == FAILED:
            error = str((stored.status or {}).get("error", ""))
            return FAILED_BEFORE, f"previous failure: {error}", ()
        if state == RUNNING:
            return RUN, "unfinished earlier attempt (or running elsewhere now)", ()
        return RUN, "new: no record yet", ()
    if record.fingerprint == spec.fingerprint:
        return BUILT, BUILT_REASON, ()
    drift = tuple(explain_drift(record.fingerprint_payload, spec.fingerprint_payload))
    return DRIFT, "config changed without a version bump", drift


def _lineage(record: ArtifactRecord, upstream: Sequence[Upstream]) -> tuple[str, tuple[str, ...]]:
    stale: list[str] = []
    unknown = False
    for dep in upstream:
        if dep.rebuilt:
            stale.append(f"upstream {dep.step_id} is rebuilt in this run")
            continue
        if dep.record is None:
            continue  # a missing intermediate: this build stays valid (it is pruned)
        consumed = record.inputs.get(dep.step_id)
        if consumed is None:
            unknown = True
        elif consumed != dep.record.build_id:
            stale.append(f"upstream {dep.step_id} was rebuilt after this step")
    if stale:
        return LINEAGE_STALE, tuple(stale)
    return (LINEAGE_UNKNOWN if unknown else LINEAGE_OK), ()


def decide(
    spec: StepSpec,
    stored: Stored,
    upstream: Sequence[Upstream],
    policy: Policy,
    *,
    needed: bool,
) -> Decision:
    """Build, skip or prune ``spec``, and why. Pure: no I/O.

    ``upstream`` has one entry per dependency. ``needed``: the step is a target, or a step that
    is built in this run reads it. ``needed`` matters only when there is no record, and
    ``upstream`` only when there is one (``plan_graph`` re-decides a step on that basis).
    Raises ``DriftError`` for a drifted record under ``on_drift="error"`` (unless the step is
    forced or mutable, which rebuild anyway).
    """
    status, why, drift = _own_status(spec, stored)
    record = stored.record
    forced = spec.step_id in policy.force
    lineage, stale = _lineage(record, upstream) if record is not None else (LINEAGE_NONE, ())

    def decision(action: str, reason: str, **extra: Any) -> Decision:
        return Decision(
            spec,
            action,
            status,
            reason,
            record,
            stored.status,
            drift,
            forced=forced,
            lineage=lineage,
            **extra,
        )

    if forced:
        return decision(BUILD, "forced (--force)")
    if status == DEV:
        return decision(BUILD, why)
    if status == DRIFT:
        if policy.on_drift == "error":
            raise DriftError(
                "config changed without a version bump: " + "; ".join(drift),
                "bump the step's version, or choose the drift policy rebuild or warn "
                "(--on-drift, or on_drift=)",
                spec.step_id,
            )
        if policy.on_drift == "rebuild":
            return decision(BUILD, f"{why}: rebuilding (on_drift=rebuild)")
    if record is None:
        if needed:
            return decision(BUILD, why)
        return decision(PRUNE, f"pruned: not built ({why}), and nothing that runs needs it")
    if status == DRIFT:
        why = f"{why}: served from cache (on_drift=warn)"
    if lineage == LINEAGE_UNKNOWN:
        why += "; lineage unknown (record written before build ids)"
    if stale and policy.cascade:
        return decision(BUILD, "stale: " + "; ".join(stale), stale=stale)
    if stale:
        why = f"{why}; stale but served (no cascade): " + "; ".join(stale)
    return decision(SKIP, why, stale=stale)


# --- the graph ---------------------------------------------------------------------------------


def resolve_force(names: Iterable[str], steps: Sequence[StepSpec]) -> frozenset[str]:
    """``--force`` names (``name`` or ``name@version``) -> step ids; unknown names are errors."""
    wanted = {n for n in names}
    ids = {s.step_id for s in steps if s.step_id in wanted or s.name in wanted}
    known = {s.step_id for s in steps} | {s.name for s in steps}
    unknown = sorted(wanted - known)
    if unknown:
        # Bounded: the names may come from an engine param of any size.
        raise InvalidStepError(
            f"--force names no step in this pipeline: {first_few(unknown)}",
            "pass a step name or name@version from `marin plan`",
        )
    return frozenset(ids)


@dataclass
class Plan:
    """Every step's decision, in dependency order (dependencies before dependents)."""

    decisions: dict[str, Decision]
    """By output path."""
    policy: Policy

    def of(self, spec: StepSpec) -> Decision:
        return self.decisions[spec.output_path]

    def paths(self, action: str) -> list[str]:
        return [p for p, d in self.decisions.items() if d.action == action]

    @property
    def to_build(self) -> list[str]:
        return self.paths(BUILD)

    def upstream(self, spec: StepSpec, built: Mapping[str, ArtifactRecord]) -> list[Upstream]:
        """``spec``'s dependencies as it sees them mid-run: each one built in this run (``built``:
        output path -> its new record) is ``rebuilt``; the others hold what the plan read."""
        ups: dict[str, Upstream] = {}
        for dep in spec.deps:
            record = built.get(dep.output_path)
            if record is not None:
                ups[dep.step_id] = Upstream(dep.step_id, record, rebuilt=True)
            else:
                ups[dep.step_id] = Upstream(dep.step_id, self.decisions[dep.output_path].record)
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
    """
    by_path = {s.output_path: s for s in steps}
    deps = {p: list(dict.fromkeys(d.output_path for d in s.deps)) for p, s in by_path.items()}
    dependents: dict[str, list[str]] = {p: [] for p in by_path}
    for path, ds in deps.items():
        for d in ds:
            dependents[d].append(path)
    target_paths = {t.output_path for t in targets}
    building: set[str] = set()
    needers: dict[str, int] = {p: 0 for p in by_path}
    """How many dependents that build read each step."""
    drifted: dict[str, DriftError] = {}
    own = {p: stored.get(p, NOTHING_STORED) for p in by_path}
    # Upstream views are frozen, so one per (dependency, rebuilt) serves every dependent.
    as_upstream = {
        p: (Upstream(s.step_id, own[p].record), Upstream(s.step_id, own[p].record, True))
        for p, s in by_path.items()
    }
    last: dict[str, Decision] = {}
    """Each step's latest decision; dropped when a neighbour's change may alter it."""

    def current(path: str) -> Decision:
        upstream = [as_upstream[d][d in building] for d in deps[path]]
        needed = path in target_paths or needers[path] > 0
        decision = decide(by_path[path], own[path], upstream, policy, needed=needed)
        last[path] = decision
        return decision

    def changed(path: str) -> None:
        """An input of ``path``'s decision changed: decide it again (a step already building
        stays building, so only its cached decision goes: its reason may name the change)."""
        last.pop(path, None)
        if path not in queued and path not in building:
            queued.add(path)
            queue.append(path)

    # The least fixed point: a step only ever moves from skip/prune to build, and each move
    # re-queues the neighbours whose inputs it changes: dependencies without a record (now
    # needed) and dependents with one (an upstream is rebuilt); ``decide`` reads ``needed``
    # only without a record and ``upstream`` only with one. Dependents go first, so "needed"
    # reaches a dependency before it is decided: on a new prefix each step is decided once.
    queue: deque[str] = deque(reversed(by_path))
    queued = set(by_path)
    while queue:
        path = queue.popleft()
        queued.discard(path)
        try:
            decision = current(path)
        except DriftError as exc:
            drifted[path] = exc
            continue
        if decision.action != BUILD or path in building:
            continue
        building.add(path)
        for d in deps[path]:
            needers[d] += 1
            if own[d].record is None:
                changed(d)
        for dependent in dependents[path]:
            if own[dependent].record is not None:
                changed(dependent)
    if drifted:
        raise _all_drift([drifted[p] for p in by_path if p in drifted])
    return Plan({p: last.get(p) or current(p) for p in by_path}, policy)


def _all_drift(errors: list[DriftError]) -> DriftError:
    if len(errors) == 1:
        return errors[0]
    lines = [f"{e.step}: {e.what}" for e in errors]
    return DriftError(
        f"{len(errors)} steps changed without a version bump [" + "; ".join(lines) + "]",
        errors[0].fix,
    )
