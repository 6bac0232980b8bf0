"""Where each step of a run reads and writes: the one decision, made before ``decide``.

A run with a step in user scope (``with_options(scope="user")``, or a run-wide
``scope="user"``) is that user's run, and every step it builds belongs to the user: it writes
``<prefix>/users/<user>/<name>/<version>``. When that folder holds nothing of the step yet, and
the shared ``<prefix>/<name>/<version>`` holds a build of the same fingerprint that the run would
serve (the one decision, ``decide``, under the run's policy), the step reads the shared build
instead (Marin's fallback); whatever the user has built wins for that user. A shared upstream
that is missing, forced, or that the run would rebuild (its code changed under
``on_code_drift="rebuild"``, or it is stale) is built in the user's folder too: a shared build
is only ever read here, so a user's run never writes, replaces or races a shared artifact, and
the plan shows where the run writes.

The result is a copy of the graph whose specs say it (``StepSpec.user_home``): the planner, the
run loop and ``build_step`` then see ordinary output paths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from marin.execution.errors import InvalidStepError, MarinError
from marin.execution.pipeline.graph import collect_steps
from marin.execution.pipeline.scope import SET_USER, check_scope, required_user, run_user
from marin.execution.pipeline.step_spec import StepSpec, is_absolute_location
from marin.execution.plan.decide import Upstream, decide
from marin.execution.plan.options import Policy
from marin.execution.plan.read import stored_build
from marin.execution.store.location import Location
from marin.execution.store.records import (
    USERS_FOLDER,
    ArtifactRecord,
    lease_path,
    read_record,
    record_path,
    status_path,
)
from marin.execution.vocabulary import Action, OutputScope


def resolve_scopes(
    targets: Sequence[StepSpec],
    location: Location,
    scope: str = OutputScope.SHARED,
    force: Iterable[str] = (),
    user: str | None = None,
    policy: Policy | None = None,
) -> list[StepSpec]:
    """``targets`` with every user-scope step placed (see the module); the same specs when no
    step is in user scope. Specs placed already (``user_home`` set) are kept as they are.
    A forced step (``force``: names or ids) is the user's own build, never the shared one.
    ``user``: whose folder (an engine's run user, checked); else ``$MARIN_USER`` or the OS user.
    ``policy``: the run's (drift, code drift, cascade), which says whether a shared build is
    served or rebuilt; the defaults when None."""
    scope = check_scope(scope)
    targets = place_pins(targets, location)
    if not needs_user(targets, scope):
        return list(targets)  # no step in user scope: nothing to place, no graph walk
    steps = collect_steps(targets)
    placing = _Placing(location, set(force), policy or Policy())
    placed: dict[str, StepSpec] = {}
    for spec in steps:  # dependencies first: every step of a user's run is placed
        deps = tuple(placed[d.output_path] for d in spec.deps)
        if spec.user_home is not None:  # placed already (and checked then)
            new = spec if deps == spec.deps else dataclasses.replace(spec, deps=deps)
        else:
            placing.home = placing.home or f"{USERS_FOLDER}/{required_user(spec.step_id, user)}"
            new = placing.place(spec, deps)
        placed[spec.output_path] = new
    return [placed[t.output_path] for t in targets]


def place_pins(targets: Sequence[StepSpec], location: Location) -> list[StepSpec]:
    """``targets`` with every absolute pin (``pin="gs://bucket/prefix/loc"``) made relative to
    the run's prefix, where Marin keeps the step's output, record and lease together; the same
    specs when no step has one. A pin outside the prefix is refused, naming the step.

    Raises:
        InvalidStepError: an absolute pin outside ``location`` (or onto the prefix itself).
        DuplicateStepError: a placed pin is another step's output, or inside it.
    """
    if not any(t.pinned_absolute for t in targets):
        return list(targets)
    from marin.execution.pipeline.graph import check_disjoint_outputs

    placed: dict[str, StepSpec] = {}
    for spec in collect_steps(targets):  # dependencies first
        deps = tuple(placed[d.output_path] for d in spec.deps)
        pin = _relative_pin(spec, location)
        same = deps == spec.deps and pin == spec.pin
        placed[spec.output_path] = spec if same else dataclasses.replace(spec, deps=deps, pin=pin)
    check_disjoint_outputs(list(placed.values()))  # two spellings of one path meet only now
    return [placed[t.output_path] for t in targets]


def _relative_pin(spec: StepSpec, location: Location) -> str | None:
    """``spec``'s pin relative to ``location`` (a relative pin as it is)."""
    pin = spec.pin
    if pin is None or not is_absolute_location(pin):
        return pin
    base = location.url.rstrip("/")
    if pin.startswith(base + "/") and len(pin) > len(base) + 1:
        return pin[len(base) + 1 :]
    raise InvalidStepError(
        f"{spec.step_id} is pinned at {pin}, "
        + ("the prefix itself" if pin == base else f"outside the run's prefix {location.url}")
        + ": Marin keeps a step's output, record and lease together under the prefix it runs in",
        "run it under a prefix that holds the pin (under MARIN_ALLOWED_PREFIXES), or pin a "
        "path relative to the prefix",
        spec.step_id,
    )


def needs_user(targets: Sequence[StepSpec], scope: str) -> bool:
    """Whether a run of ``targets`` in ``scope`` places any step under a user's folder."""
    return scope == OutputScope.USER or any(t.user_scoped for t in targets)


@dataclass(frozen=True)
class RunScope:
    """An engine run's scope and the user it names (Airflow, Prefect): its ``scope`` (checked
    against the export by the engine), its ``user`` param and the user who triggered it
    (untrusted until ``place`` checks them, and only when a step needs a user)."""

    scope: OutputScope = OutputScope.SHARED
    user: object = None
    """The run's ``user`` param, as the trigger sent it (checked by ``user_for``)."""
    triggered_by: str | None = None
    fix: str = SET_USER
    """How to give a user on this engine, for the error when there is none or it is bad."""

    def user_for(self, targets: Sequence[StepSpec]) -> str | None:
        """The run's user when a step of ``targets`` needs one (else None); an error naming
        ``fix`` when none is given or the one given is not one path segment."""
        if not needs_user(targets, self.scope):
            return None
        user = run_user(self.user, self.triggered_by, self.fix)
        if user is None:
            raise InvalidStepError(
                "this run places steps under a user's folder and has no user (no user param, "
                "no triggering user, and $MARIN_USER or the OS user is a service account)",
                self.fix,
                targets[-1].step_id if targets else None,
            )
        return user

    def place(
        self,
        targets: Sequence[StepSpec],
        location: Location,
        force: Iterable[str] = (),
        policy: Policy | None = None,
    ) -> tuple[list[StepSpec], str | None]:
        """``resolve_scopes`` for this run (the function ``marin run`` uses), and the user it
        placed steps for (None: no step needed one, and ``targets`` are returned as they are).
        ``policy``: the run's, as the plan task and every step task of the run apply it."""
        user = self.user_for(targets)
        if user is None:
            return place_pins(targets, location), None
        return resolve_scopes(targets, location, self.scope, force, user, policy), user


@dataclass
class _Placing:
    """One placement of a user's run: where the user's folder is, what is forced, the run's
    policy, and the shared records read so far (a dependency's, for its dependents)."""

    location: Location
    forced: set[str]
    policy: Policy
    home: str = ""
    shared: dict[str, ArtifactRecord] = field(default_factory=dict)
    """Output path -> the shared build a step placed so far reads."""

    def place(self, spec: StepSpec, deps: tuple[StepSpec, ...]) -> StepSpec:
        """``spec`` in user scope: the user's folder, unless only a shared build of it exists,
        the run would serve it as it is, and every dependency is read from the shared builds
        too (what that build consumed)."""
        mine = dataclasses.replace(spec, deps=deps, scope=OutputScope.USER, user_home=self.home)
        own = spec.name in self.forced or spec.step_id in self.forced
        if own or spec.mutable or any(d.user_home for d in deps):
            return mine  # forced, dev (always rebuilt), or built from the user's own inputs
        if _anything_at(self.location, mine.output_path):
            return mine  # the user's own build (or attempt, or lease) wins
        shared = read_record(self.location, spec.output_path, step=(spec.name, spec.version))
        if shared is None or shared.fingerprint != spec.fingerprint:
            return mine
        if not self._served(spec, shared):
            return mine  # the run rebuilds it: in the user's folder, never the shared one
        self.shared[spec.output_path] = shared
        return dataclasses.replace(mine, user_home="")  # read the shared build

    def _served(self, spec: StepSpec, shared: ArtifactRecord) -> bool:
        """Whether the run would serve ``shared`` as ``spec``'s build: the one decision, on
        the shared build, whose dependencies are the shared builds read (none is rebuilt)."""
        upstream = {d.step_id: Upstream(d.step_id, self._record(d)) for d in spec.deps}
        try:
            stored = stored_build(self.location, spec, shared)  # an adoption: what it adopts
            decision = decide(spec, stored, list(upstream.values()), self.policy, needed=True)
        except MarinError:
            return True  # placed on the shared build, the plan raises the same error for it
        return decision.action != Action.BUILD

    def _record(self, dep: StepSpec) -> ArtifactRecord | None:
        """The shared build a dependency placed on it reads (read here if placed earlier)."""
        found = self.shared.get(dep.output_path)
        return (
            found
            if found is not None
            else read_record(self.location, dep.output_path, step=(dep.name, dep.version))
        )


def refuse_shared_write(spec: StepSpec) -> None:
    """``build_step``'s guard: a user-scope step placed on the shared build never writes it."""
    if spec.scope == OutputScope.USER and spec.user_home == "":
        raise InvalidStepError(
            f"{spec.step_id} is in user scope and its shared build {spec.output_path} must be "
            "rebuilt (it changed or vanished since the plan): a user-scope run never writes a "
            "shared artifact",
            f"run again (it is then built under {USERS_FOLDER}/<user>/), or force it",
            spec.step_id,
        )


def _anything_at(location: Location, output_path: str) -> bool:
    return any(
        location.has_file(location.path(f(output_path)))
        for f in (record_path, status_path, lease_path)
    )


def scope_of(spec: StepSpec) -> tuple[str, str]:
    """``(reads, writes)`` for ``marin plan``: ``shared``, ``user:<name>``; a user-scope step
    served from the shared build reads ``shared`` and writes ``user:<name>`` if rebuilt."""
    if spec.user_home is None:
        return (OutputScope.SHARED, OutputScope.SHARED)
    if spec.user_home:
        where = f"{OutputScope.USER}:{spec.user_home.split('/', 1)[1]}"
        return (where, where)
    return (OutputScope.SHARED, OutputScope.USER)
