"""Walking a lowered graph: every transitive step once, dependencies first."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from marin.execution.digest.config_drift import explain_drift
from marin.execution.errors import CycleError, DuplicateStepError, InvalidStepError
from marin.execution.pipeline.step_spec import StepSpec, is_absolute_location
from marin.execution.store.records import USERS_FOLDER
from marin.execution.vocabulary import OutputScope


def collect_steps(targets: Iterable[StepSpec]) -> list[StepSpec]:
    """All steps reachable from ``targets``, deduplicated by output path, deps before dependents.

    Iterative, so a 100,000-deep chain does not hit the recursion limit. Two specs with one output
    path but different fingerprints are two definitions of one artifact, which is an error.

    Raises:
        CycleError: the dependencies form a cycle (``cycle`` lists the step ids around it).
        DuplicateStepError: two specs of one output path differ in fingerprint or in the
            function they run, or one step's output is (up to letter case) or contains
            another's (``check_disjoint_outputs``).
        InvalidStepError: a shared step's path lies in the users' folder
            (``check_disjoint_outputs``).
    """
    by_path: dict[str, StepSpec] = {}
    order: list[StepSpec] = []
    done: set[int] = set()
    on_path: dict[int, StepSpec] = {}
    for root in targets:
        stack: list[tuple[StepSpec, bool]] = [(root, False)]
        while stack:
            spec, expanded = stack.pop()
            if expanded:
                del on_path[id(spec)]
                done.add(id(spec))
                order.append(spec)
                continue
            if id(spec) in done:
                continue
            if id(spec) in on_path:
                path = list(on_path.values())
                start = next(i for i, s in enumerate(path) if s is spec)
                raise CycleError([s.step_id for s in path[start:]] + [spec.step_id])
            known = by_path.get(spec.output_path)
            if known is not None and known is not spec:
                check_same_step(known, spec)
                continue  # the same step lowered twice: build it once
            by_path[spec.output_path] = spec
            on_path[id(spec)] = spec
            stack.append((spec, True))
            stack.extend((dep, False) for dep in reversed(spec.deps))
    check_disjoint_outputs(order)
    return order


@dataclass(frozen=True, eq=False)
class Graph:
    """A lowered pipeline as one value: its targets and every step they need, deps first.

    Made once per run (``Graph.of``, which walks and checks the graph as ``collect_steps``
    does); selection, planning, the runners, the exporters and the summaries all take it, so
    nothing below the entry point walks the graph again.
    """

    targets: tuple[StepSpec, ...]
    """The steps asked for (each the one spec ``steps`` keeps for its output path)."""
    steps: tuple[StepSpec, ...]
    """Every transitive step, one per output path, dependencies before dependents."""

    @classmethod
    def of(cls, targets: StepSpec | Iterable[StepSpec]) -> Graph:
        """Collect and check the graph of ``targets``.

        Raises:
            CycleError: as ``collect_steps``.
            DuplicateStepError: as ``collect_steps``.
        """
        roots = (targets,) if isinstance(targets, StepSpec) else tuple(targets)
        steps = collect_steps(roots)
        by_path = {spec.output_path: spec for spec in steps}
        return cls(tuple(by_path[t.output_path] for t in roots), tuple(steps))

    def narrowed(self, targets: Sequence[StepSpec]) -> Graph:
        """The part of this graph that ``targets`` (steps of it) need, without walking or
        checking again: a part of a checked graph is checked."""
        needed = {t.output_path for t in targets}
        for spec in reversed(self.steps):  # dependents before their dependencies
            if spec.output_path in needed:
                needed.update(dep.output_path for dep in spec.deps)
        return Graph(tuple(targets), tuple(s for s in self.steps if s.output_path in needed))

    @property
    def target_paths(self) -> list[str]:
        """The targets' output paths, in order."""
        return [t.output_path for t in self.targets]


def as_graph(steps: Graph | StepSpec | Iterable[StepSpec]) -> Graph:
    """``steps`` as a ``Graph``: a graph as it is, targets collected once (the public APIs'
    boundary: ``StepRunner.run`` takes one spec or a list, as Marin's does).

    Raises:
        CycleError: as ``collect_steps`` (never for a ``Graph``, checked when made).
        DuplicateStepError: as ``collect_steps`` (never for a ``Graph``).
    """
    return steps if isinstance(steps, Graph) else Graph.of(steps)


def fn_identity(run: Callable[..., Any]) -> str:
    """Which function a step runs: ``module:qualname:first line``, stable within a process.

    Not part of the fingerprint (renaming or moving a function must not rebuild its artifacts),
    but two steps with one ``name@version`` and one config that run different functions are two
    definitions of one artifact, not one step to build once.
    """
    fn: Any = getattr(run, "wrapped_fn", run)  # apply()'s call object names the user's fn
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)  # bound methods: the function
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    code = getattr(fn, "__code__", None)
    line = f":{code.co_firstlineno}" if code is not None else ""
    return f"{module}:{qualname}{line}"


def check_same_step(known: StepSpec, spec: StepSpec) -> None:
    """Check that two specs of one output path are one step: one config, one function (a
    graph, or a stream's arrivals, hold each step once).

    Raises:
        DuplicateStepError: their fingerprints differ, or they run different functions.
    """
    if known.fingerprint != spec.fingerprint:
        diff = "; ".join(explain_drift(known.fingerprint_payload, spec.fingerprint_payload, 5))
        raise DuplicateStepError(
            f"two different definitions of {spec.step_id} in one graph ({diff})",
            "give one of them another name or bump its version",
            spec.step_id,
        )
    check_same_fn(known, spec)
    check_same_kind(known, spec.scope, spec.artifact_type, spec.name)


def check_same_kind(known: StepSpec, scope: OutputScope, artifact_type: str, name: str) -> None:
    """Check that a second definition of ``known``'s step (one config, one function) has its
    placement and artifact type: else whichever arrived first would decide for both where
    it builds (a user's folder or the shared one) and how its readers read it.

    Raises:
        DuplicateStepError: they differ in ``scope`` or ``artifact_type``, named.
    """
    differ = {
        "scope": (OutputScope(known.scope).value, OutputScope(scope).value),
        "artifact_type": (known.artifact_type, artifact_type),
    }
    for option, (first, second) in differ.items():
        if first != second:
            raise DuplicateStepError(
                f"two definitions of {known.step_id} in one graph differ in {option} "
                f"({first!r} and {second!r}): it would be built once, as the first says",
                f"give every handle of {name} the same {option} (with_options({option}=...)), "
                "or give one of them another name or version",
                known.step_id,
            )


def check_same_fn(known: StepSpec, spec: StepSpec) -> None:
    """Check that two specs of one step and one config run one function.

    Raises:
        DuplicateStepError: they run different functions (``fn_identity`` differs).
    """
    check_same_run(spec.step_id, known.run, spec.run)


def check_same_run(step_id: str, known: Callable[..., Any], run: Callable[..., Any]) -> None:
    """Check that two definitions of ``step_id`` with one config run one function.

    Raises:
        DuplicateStepError: ``known`` and ``run`` are different functions (``fn_identity``).
    """
    if known is run:
        return
    first, second = fn_identity(known), fn_identity(run)
    if first != second:
        raise DuplicateStepError(
            f"two different functions define {step_id} with the same config ({first} and {second})",
            "give one of them another name or bump its version",
            step_id,
        )


def check_disjoint_outputs(steps: list[StepSpec]) -> None:
    """Refuse a graph where two steps' output folders are one folder, or one contains another.

    ``team/exp@v0`` writes ``team/exp/v0`` and ``team@exp`` writes ``team/exp``: building the
    second would clear a folder holding the first's output and metadata. Paths are compared
    case-folded, because macOS and Windows disks (and SMB shares of any disk) are
    case-insensitive: there ``Data@v1`` and ``data@v1`` are one folder, and ``Team@exp`` holds
    ``team/exp@v0``. Checked by looking up every ancestor path of every output (linear in the
    total path depth), shortest first. ``lower()`` runs this on every graph, so the paths are
    made once and the ancestors are slices at each ``/`` rather than split-and-join.

    A shared step's path (name and version, or its pin) may not start with ``users/`` nor be
    ``users``: that folder holds every user's scoped builds (``users@alice`` would be alice's
    whole folder).

    Raises:
        DuplicateStepError: two steps write one folder (two pins, or names that differ only in
            letter case), or one step's output folder contains another's.
        InvalidStepError: a step not in user scope whose path starts with ``users/``; an
            adoption of another step's output (``_check_adoptions``).
    """
    # spec.output_path, inlined; case-folded (see above)
    paths = [(spec.pin or f"{spec.name}/{spec.version}").casefold() for spec in steps]
    by_path: dict[str, StepSpec] = {}
    for path, spec in zip(paths, steps, strict=True):
        if (path + "/").startswith(_USERS) and spec.scope != OutputScope.USER:  # or ``users``
            _in_users_folder(spec)
        other = by_path.setdefault(path, spec)
        if other is spec:
            continue
        if other.output_path == spec.output_path:  # only a pin can give two steps one path
            raise DuplicateStepError(
                f"{other.step_id} and {spec.step_id} both write {spec.output_path}",
                "give one of them another pin",
                spec.step_id,
            )
        raise DuplicateStepError(
            f"{other.step_id} ({other.output_path}) and {spec.step_id} ({spec.output_path}) "
            "differ only in letter case: on a case-insensitive file system (macOS, Windows) "
            "they are one folder, and building one would replace the other",
            f"rename one of them, e.g. give {spec.step_id} another name",
            spec.step_id,
        )
    for path, spec in zip(paths, steps, strict=True):
        end = path.find("/")
        while end >= 0:
            outer = by_path.get(path[:end])
            if outer is not None:
                raise DuplicateStepError(
                    f"the output of {outer.step_id} ({outer.output_path}) contains the output of "
                    f"{spec.step_id} ({spec.output_path}); building one would delete the other",
                    f"rename one of them, e.g. give {outer.step_id} another name",
                    outer.step_id,
                )
            end = path.find("/", end + 1)
    _check_adoptions(steps, by_path)


def _check_adoptions(steps: list[StepSpec], by_path: dict[str, StepSpec]) -> None:
    """Refuse an adoption whose (relative) source is, lies in or holds the output of another
    step of the graph: the adoption would be neither ordered after it nor rebuilt with it in a
    run (its next plan finds it stale). Reading that step's build is a dependency."""
    for spec in steps:
        source = spec.source
        if source is None or is_absolute_location(source):
            continue  # an absolute one is placed at run time (the next plan sees a rebuild)
        path = "/".join(p for p in source.split("/") if p).casefold()
        inside = [by_path[path[:end]] for end in _slashes(path) if path[:end] in by_path]
        held = [s for p, s in by_path.items() if p.startswith(path + "/")]
        other = next((s for s in [*inside, *held] if s is not spec), None)
        if other is not None:
            raise InvalidStepError(
                f"{spec.step_id} adopts {source}, which is, lies in or holds the output of "
                f"{other.step_id}, a step of this graph: a run would neither order the adoption "
                "after it nor adopt its rebuild",
                f"read {other.step_id} as a dependency (pass its handle to the steps that read "
                "it) instead of adopting its output path",
                spec.step_id,
            )


def _slashes(path: str) -> list[int]:
    """The ends of ``path``'s ancestors and of ``path`` itself (``a/b/c``: 1, 3, 5)."""
    return [i for i, c in enumerate(path) if c == "/"] + [len(path)]


_USERS = USERS_FOLDER + "/"


def _in_users_folder(spec: StepSpec) -> None:
    raise InvalidStepError(
        f"{spec.step_id} writes {spec.pin or f'{spec.name}/{spec.version}'}, at or inside "
        f"the users' folder {_USERS} that user-scope steps write (a shared step's path may "
        f"not start with {_USERS})",
        f"rename the step (or its pin) so that its path does not start with {_USERS!r}",
        spec.step_id,
    )


def canonical_deps(steps: list[StepSpec]) -> dict[str, list[StepSpec]]:
    """Each step's dependencies, mapped onto the one spec kept per output path."""
    by_path = {spec.output_path: spec for spec in steps}
    return {spec.output_path: [by_path[dep.output_path] for dep in spec.deps] for spec in steps}
