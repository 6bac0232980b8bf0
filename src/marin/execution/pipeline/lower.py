"""Lowering: handle graphs into checked ``StepSpec`` graphs, purely.

``lower`` walks the handles (``handles.py``) once, iteratively, and makes one frozen spec per
``name@version``: its canonical config (context values as placeholders), fingerprint, deps,
provenance and the ``run`` the build calls (guarded so a config mutated after lowering is
refused, and wrapped to run isolated, under a timeout or as a remote job when asked).
``lower_graph`` is the entry points' form: one checked ``Graph`` per run.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast, overload

from marin.execution.digest.code import code_digest, new_lowering
from marin.execution.errors import (
    ConfigError,
    CycleError,
    DuplicateStepError,
    FingerprintMismatchError,
    InvalidStepError,
)
from marin.execution.names import is_mutable_version
from marin.execution.pipeline.canonical import not_utf8, to_canonical
from marin.execution.pipeline.context import StepContext, bound_context, fingerprint_context
from marin.execution.pipeline.graph import Graph, check_same_kind, check_same_run
from marin.execution.pipeline.handles import ApplyCall, ArtifactStep, type_label
from marin.execution.pipeline.provenance import collect_provenance
from marin.execution.pipeline.resources import Resources
from marin.execution.pipeline.step_spec import StepSpec, fingerprint_of
from marin.execution.pipeline.versions import VersionCodex, active_codex
from marin.execution.vocabulary import OutputScope

__all__ = ["lower", "lower_graph", "lower_with_codex"]


class _WrapsRun:
    """A spec's call around ``run``: ``wrapped_fn`` names the user's function inside it."""

    __slots__ = ()
    wraps_field = "run"
    run: Callable[..., Any]

    @property
    def wrapped_fn(self) -> Any:
        return getattr(self.run, "wrapped_fn", self.run)


class _FingerprintGuard(_WrapsRun):
    """``run`` that first checks the config still is the one that was fingerprinted.

    ``apply()`` snapshots its literals, but a hand-made ``ArtifactStep`` may compute its config
    from state that changes between ``lower()`` and the build; building then would store
    another config's output under this fingerprint. One extra config evaluation per build.

    A plain slotted class, not a frozen dataclass: lowering makes one per step, and a frozen
    dataclass's ``__init__`` costs twice as much. Nothing assigns to it after construction.
    """

    __slots__ = ("arg_keys", "build_config", "config", "deps", "run", "step_id")

    def __init__(
        self,
        run: Callable[[StepContext], Any],
        build_config: Callable[[StepContext], Any],
        deps: tuple[StepSpec, ...],
        config: Any,
        step_id: str,
        arg_keys: tuple[str, ...] = (),
    ) -> None:
        self.run = run
        self.build_config = build_config
        self.deps = deps
        self.config = config
        self.step_id = step_id
        self.arg_keys = arg_keys

    def __repr__(self) -> str:
        return f"_FingerprintGuard({self.step_id}, run={self.run!r})"

    def __call__(self, ctx: StepContext) -> Any:
        now = to_canonical(
            self.build_config(fingerprint_context(self.deps, self.arg_keys)),
            "config",
            self.step_id,
        )
        if now != self.config:
            from marin.execution.errors import ConfigError

            raise ConfigError(
                "the config changed after the step was lowered; building it would store "
                "another config's output under the old fingerprint",
                "do not mutate a config after apply()/lower(); lower the pipeline again",
                self.step_id,
            )
        return self.run(ctx)


class _ConfigCall(_WrapsRun):
    """A spec's ``run(ctx)`` for a handle: ``handle.run(handle.build_config(ctx))``, with
    ``ctx`` bound for ``current_context()`` meanwhile. Slotted: lowering makes one per step."""

    __slots__ = ("build_config", "run")

    def __init__(
        self, run: Callable[[Any], Any], build_config: Callable[[StepContext], Any]
    ) -> None:
        self.run = run
        self.build_config = build_config

    def __repr__(self) -> str:
        return f"_ConfigCall(run={self.run!r})"

    def parts(self, ctx: StepContext) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        """``(function, args, kwargs)`` of the user's call, for a subprocess to make it."""
        config = self.build_config(ctx)
        if isinstance(self.run, ApplyCall):
            return self.run.fn, (), dict(config)
        return self.run, (config,), {}

    def __call__(self, ctx: StepContext) -> Any:
        with bound_context(ctx):
            return self.run(self.build_config(ctx))

    def with_config(self, ctx: StepContext, config: Any) -> Any:
        """``self(ctx)`` with ``config`` made already by this spec's ``build_config(ctx)``: the
        build makes it once for the record and for ``fn``. The record keeps its canonical copy,
        so a ``fn`` that mutates its config cannot change what the record says."""
        with bound_context(ctx):
            return self.run(config)


def _spec_for(
    handle: ArtifactStep,
    deps: tuple[StepSpec, ...],
    provenance: Mapping[str, Any],
    memo: dict[Any, Any],
    created: list[StepSpec],
) -> StepSpec:
    """The spec of ``handle``; a new one is also appended to ``created``."""
    name = handle.name
    version = handle.version
    if version is None:  # deferred: the run's codex says (see versions.py)
        version, provenance = _codex_version(name, provenance, memo)
    step_id = f"{name}@{version}"
    arg_keys = tuple(handle.runtime_args) if handle.runtime_args else ()
    config = to_canonical(
        handle.build_config(fingerprint_context(deps, arg_keys)), "config", step_id
    )
    payload: dict[str, Any] = {
        "name": name,
        "version": version,
        "config": config,
        "deps": _dep_versions(step_id, version, deps, handle),
    }
    if handle.override_path is not None:
        payload["pin"] = handle.override_path  # a moved output is another artifact
    elif handle.adopt_source is not None:
        payload["source"] = handle.adopt_source  # other data is another artifact
    fn: Any = handle.run.fn if type(handle.run) is ApplyCall else handle.run
    bound = _bound_arguments(fn, step_id, "fn")
    if bound:
        payload["fn"] = bound  # what a partial binds is config, not code
    made = _bound_arguments(handle.build_config, step_id, "build_config")
    if made:  # a hand-made ``build_config=partial(bc, extra=1)``: as ``fn``'s
        payload["build_config"] = made
    fingerprint, payload_json = _fingerprinted(payload, step_id)
    _check_pinned(handle, fingerprint, payload_json, step_id)
    known: StepSpec | None = memo.get(("step", step_id))
    if known is not None:
        return _same_definition(known, handle, fingerprint, payload_json, step_id)
    run = _guarded_run(handle, deps, config, step_id, arg_keys)
    spec = _new_spec(handle, version, deps, (fingerprint, payload_json), provenance, run)
    memo[("step", step_id)] = spec
    created.append(spec)
    return spec


def _fingerprinted(payload: dict[str, Any], step_id: str) -> tuple[str, str]:
    """``fingerprint_of(payload)``, or a ``ConfigError`` naming text no file or hash can hold
    (a lone surrogate, ``"\\ud800"``: red team r23-4), not the encoder's own error."""
    try:
        return fingerprint_of(payload)
    except UnicodeEncodeError:
        raise ConfigError(
            f"{not_utf8(payload) or 'the config'} holds text that is not valid Unicode "
            "(a lone surrogate)",
            "pass text that encodes as UTF-8, and what was read with "
            "errors='surrogateescape' as bytes",
            step_id,
        ) from None


_PARTIAL_SLOTS = functools.partial.__dict__
"""A partial's ``func``, ``args`` and ``keywords`` as C-level slots (a subclass's properties,
user code, are never called)."""


def _bound_arguments(fn: Any, step_id: str, what: str) -> dict[str, Any]:
    """What a ``functools.partial`` step function (or ``build_config``, ``what``) binds
    (``partial(train, lr=0.1)``), canonical:
    ``{"args": [...], "keywords": {...}}``, empty parts left out (nothing for a plain function,
    so its fingerprint is unchanged). It decides the output as much as the config does, so it is
    fingerprinted like config; a value without a JSON form is refused like one in config.

    Raises:
        ConfigError: a bound value has no canonical JSON form (named ``fn.keywords.<name>``).
    """
    if not issubclass(type(fn), functools.partial):
        return {}  # the common case: nothing bound
    args: list[Any] = []
    keywords: dict[str, Any] = {}
    while issubclass(type(fn), functools.partial):  # the outer partial's values come last
        args = [*_PARTIAL_SLOTS["args"].__get__(fn), *args]
        keywords = {**_PARTIAL_SLOTS["keywords"].__get__(fn), **keywords}
        fn = _PARTIAL_SLOTS["func"].__get__(fn)
    # The object of a bound method or callable instance is not config: it may hold a lock or
    # a counter. Its fields are in the code digest, by the closure rule (digest/instance.py).
    bound = {k: v for k, v in (("args", args), ("keywords", keywords)) if v}
    try:
        return cast(dict[str, Any], to_canonical(bound, what, step_id))
    except ConfigError as exc:
        raise ConfigError(
            f"{exc.what} (bound by functools.partial)",
            "pass that value to apply() as an input instead (a step handle there becomes a "
            "dependency), or bind only plain data in the partial (str, numbers, lists, dicts, "
            "dataclasses, enums, paths)",
            step_id,
        ) from None


def _dep_versions(
    step_id: str, version: str, deps: tuple[StepSpec, ...], handle: ArtifactStep
) -> dict[str, str]:
    """Each dependency's version by name (by step id when two share a name), for the payload.
    A fixed version over a mutable dependency is an ``InvalidStepError``."""
    dep_versions: dict[str, str] = {}
    mutable = is_mutable_version(version)
    for dep in deps:
        dep_name = dep.name
        dep_versions[dep_name if dep_name not in dep_versions else dep.step_id] = dep.version
        if not mutable and dep.mutable:
            raise InvalidStepError(
                f"{step_id} has a fixed version but depends on {dep.step_id}, whose version is "
                f"mutable: {dep.step_id} rebuilds on every run, so {step_id} would too",
                f"give {handle.name} a mutable version as well (e.g. 'dev' or '{version}-dev'), "
                f"or give {dep.name} a fixed one",
                step_id,
            )
    return dep_versions


def _check_pinned(handle: ArtifactStep, fingerprint: str, payload_json: str, step_id: str) -> None:
    """Raise ``FingerprintMismatchError`` when ``expected_fingerprint`` pins another one."""
    expected = handle.expected_fingerprint
    if expected is not None and expected != fingerprint:
        raise FingerprintMismatchError(
            f"the fingerprint is {fingerprint}, but expected_fingerprint pins {expected} "
            f"(payload: {payload_json[:300]})",
            "if the change is meant, bump the version and set expected_fingerprint to the new "
            "handle.fingerprint(); otherwise undo the config change",
            step_id,
        )


def _same_definition(
    known: StepSpec, handle: ArtifactStep, fingerprint: str, payload_json: str, step_id: str
) -> StepSpec:
    """``known``, the spec lowered already under ``step_id``, when ``handle`` defines the same
    step; else a ``DuplicateStepError`` that says what differs."""
    if known.fingerprint == fingerprint:
        check_same_run(step_id, known.run, handle.run)
        scope, kind = OutputScope(handle.scope), type_label(handle.artifact_type, handle)
        check_same_kind(known, scope, kind, handle.name)
        return known  # an identical definition: one spec, built once
    from marin.execution.digest.config_drift import explain_drift

    diff = "; ".join(explain_drift(known.fingerprint_payload, payload_json, limit=5))
    raise DuplicateStepError(
        f"two different definitions of {step_id} in one graph ({diff})",
        "give one of them another name or bump its version",
        step_id,
    )


def _new_spec(
    handle: ArtifactStep,
    version: str,
    deps: tuple[StepSpec, ...],
    fingerprinted: tuple[str, str],
    provenance: Mapping[str, Any],
    run: Callable[[StepContext], Any],
) -> StepSpec:
    """``handle``'s spec at ``version``, with its fingerprint and payload (``fingerprinted``)."""
    fingerprint, payload_json = fingerprinted
    kind, scope = handle.artifact_type, handle.scope
    return StepSpec(
        name=handle.name,
        version=version,
        deps=deps,
        fingerprint=fingerprint,
        fingerprint_payload=payload_json,
        provenance=provenance,
        run=run,
        build_config=handle.build_config,
        artifact_type=kind if type(kind) is str else type_label(kind, handle),
        retries=handle.retries,
        pool=handle.pool,
        resources=cast(Resources, handle.resources),
        timeout=cast("float | None", handle.timeout),
        queue=handle.queue,
        isolate=handle.isolate,
        resumable=handle.resumable,
        keep_checkpoints=handle.keep_checkpoints,
        remote=handle.remote,
        runtime_args=handle.runtime_args,
        pin=handle.override_path,
        source=handle.adopt_source,
        scope=scope if type(scope) is OutputScope else OutputScope(scope),
        pinned_fingerprint=handle.expected_fingerprint is not None,
        point=handle.point,
        # Cached per function object (one parse per process): apply()'s call object holds the
        # user's function, the cache's key (``type() is``: never a user object's __class__).
        # Its build_config and its config's objects run the step's code too.
        code=code_digest(*_step_code(handle)),
    )


def _step_code(handle: ArtifactStep) -> tuple[Any, tuple[Any, ...], tuple[Any, ...]]:
    """What ``code_digest`` digests for ``handle``: its function, what else runs with it (the
    objects in ``apply()``'s inputs), and a hand-made ``build_config`` (digested as ``fn``
    is: a bound method's object counts)."""
    if type(handle.run) is ApplyCall:
        return handle.run.fn, tuple(handle.run.inputs.values()), ()
    return handle.run, (), (handle.build_config,)


def code_inputs(run: Any) -> tuple[Any, ...]:
    """The objects of ``apply()``'s inputs that a spec's ``run`` calls ``fn`` with, which its
    code digest counts (``_step_code``): for a process that checks the code it imported."""
    while type(run) is _FingerprintGuard or type(run) is _ConfigCall:
        run = run.run
    return tuple(run.inputs.values()) if type(run) is ApplyCall else ()


_CODEX, _DEFERRED = ("versions", "codex"), ("versions", "deferred")
"""Memo keys: the lowering's codex, and the names of the deferred steps it resolved."""
_LOWERING = ("code", "lowering")
"""Memo key: this memo's lowering has begun (the code digests of an earlier one forgotten)."""


def _codex_version(
    name: str, provenance: Mapping[str, Any], memo: dict[Any, Any]
) -> tuple[str, Mapping[str, Any]]:
    """A deferred step's version from the lowering's codex, and its provenance saying so."""
    codex: VersionCodex | None = memo.get(_CODEX)
    if codex is None:
        codex = VersionCodex()  # no codex: version_for raises, naming the step and the fix
    version = codex.version_for(name)
    memo.setdefault(_DEFERRED, set()).add(name)
    source = "override" if name in codex.overrides else "default"
    return version, {**provenance, "versions": codex.as_data(), "version_from": source}


def _guarded_run(
    handle: ArtifactStep,
    deps: tuple[StepSpec, ...],
    config: Any,
    step_id: str,
    arg_keys: tuple[str, ...],
) -> Callable[[StepContext], Any]:
    """The spec's ``run``: under a ``_FingerprintGuard`` unless it is ``apply()``'s own call on
    plain-data inputs, whose config provably is the fingerprinted one (the guard would evaluate
    it once more per build for nothing)."""
    run = _placed_run(handle, step_id)
    call = handle.run
    if (
        isinstance(call, ApplyCall)
        and call.fixed
        and getattr(handle.build_config, "__self__", None) is call
    ):
        return run
    return _FingerprintGuard(run, handle.build_config, deps, config, step_id, arg_keys)


def _placed_run(handle: ArtifactStep, step_id: str) -> Callable[[StepContext], Any]:
    """``run(build_config(ctx))``, wrapped to run isolated or under a timeout when asked;
    ``step_id`` names the step with its version resolved (a deferred one's, never ``name@?``)."""
    call = _ConfigCall(handle.run, handle.build_config)
    if handle.remote is not None:
        from marin.execution.pipeline.remote_option import (
            DEFAULT_RANK_PLACEMENT,
            RemoteRun,
            placement_timeout_s,
            preemptions_allowed,
        )
        from marin.execution.vocabulary import RankPlacement

        gpus = cast(Resources, handle.resources).gpu
        placement = RankPlacement(handle.rank_placement or DEFAULT_RANK_PLACEMENT)
        return RemoteRun(call, step_id, handle.remote, gpus, handle.ranks or 1,
                         preemptions_allowed(handle.max_preemptions), placement,
                         placement_timeout_s(handle.ranks, handle.placement_timeout,
                                             step_id))  # fmt: skip
    if not handle.isolate and handle.timeout is None:
        return call
    from marin.execution.pipeline.isolation import wrap_run

    return wrap_run(
        call,
        step_id,
        isolate=handle.isolate,
        timeout=cast("float | None", handle.timeout),
        gpus=cast(Resources, handle.resources).gpu,
    )


def _lower_and_check(
    handles: list[ArtifactStep | StepSpec], memo: dict[Any, Any] | None, check: bool = False
) -> Graph:
    """Iterative post-order walk, so a chain 100,000 steps deep lowers without recursion.

    With ``check``, the lowered graph is also checked as ``collect_steps`` checks it at run time
    (one output inside another, two definitions of one step), so that ``lower()`` refuses it.
    """
    # Lowering allocates several objects per step and frees almost none, which makes the cyclic
    # garbage collector run over and over for nothing (about 15% of the time at 100,000 steps).
    # The check runs inside too: after 100,000 new specs, its walk would trigger full collections.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if memo is None:
            memo = {}
        fresh = all(key in (_CODEX, _LOWERING) for key in memo)  # still fresh
        created: list[StepSpec] = []
        specs, saw_spec = _lower_walk(handles, memo, created)
        if not check:
            return Graph(tuple(specs), ())
        return _check_lowered(specs, created, exact=fresh and not saw_spec)
    finally:
        if collecting:
            gc.enable()


def _check_lowered(specs: list[StepSpec], created: list[StepSpec], exact: bool) -> Graph:
    """Refuse a bad graph at ``lower()`` time, with the errors ``collect_steps`` raises.

    When the walk started from an empty memo and met no ``StepSpec`` (``exact``), ``created`` is
    exactly the graph, in ``collect_steps`` order: every handle was lowered here, one spec per
    ``name@version`` (``_spec_for`` already refused two definitions of one), and specs made from
    an acyclic walk are acyclic. Only the nested-output check is left, a second walk saved.
    Otherwise (a shared memo, or specs lowered elsewhere whose deps were never walked here),
    ``collect_steps`` walks the whole graph.
    """
    from marin.execution.pipeline.graph import check_disjoint_outputs

    if exact:
        check_disjoint_outputs(created)
        return Graph(tuple(specs), tuple(created))
    return Graph.of(specs)


def _lower_walk(
    handles: list[ArtifactStep | StepSpec], memo: dict[Any, Any], created: list[StepSpec]
) -> tuple[list[StepSpec], bool]:
    """Lower ``handles`` through ``memo``; also say whether any ``StepSpec`` was met."""
    provenance = collect_provenance()
    saw_spec = False
    for handle in handles:
        if isinstance(handle, StepSpec):
            saw_spec = True
            memo.setdefault(("step", handle.step_id), handle)
    on_path: list[ArtifactStep] = []
    on_path_ids: set[int] = set()
    for root in handles:
        if isinstance(root, StepSpec) or root in memo:
            continue
        if not isinstance(root, ArtifactStep):
            raise InvalidStepError(
                f"lower() got a {type(root).__name__}",
                "pass ArtifactStep handles (from apply()) or StepSpecs",
            )
        stack: list[tuple[ArtifactStep, bool]] = [(root, False)]
        while stack:
            handle, expanded = stack.pop()
            if expanded:
                on_path.pop()
                on_path_ids.discard(id(handle))
                deps = tuple([d if isinstance(d, StepSpec) else memo[d] for d in handle.deps])
                memo[handle] = _spec_for(handle, deps, provenance, memo, created)
                continue
            if handle in memo:
                continue
            if id(handle) in on_path_ids:
                start = next(i for i, h in enumerate(on_path) if h is handle)
                raise CycleError([h.step_id for h in on_path[start:]] + [handle.step_id])
            on_path.append(handle)
            on_path_ids.add(id(handle))
            stack.append((handle, True))
            for dep in reversed(handle.deps):
                if not isinstance(dep, ArtifactStep):
                    saw_spec = True  # a spec lowered elsewhere: its deps are never walked here
                elif dep not in memo:
                    if id(dep) in on_path_ids:
                        start = next(i for i, h in enumerate(on_path) if h is dep)
                        raise CycleError([h.step_id for h in on_path[start:]] + [dep.step_id])
                    stack.append((dep, False))
    return [h if isinstance(h, StepSpec) else memo[h] for h in handles], saw_spec


def flatten_handles(handles: Iterable[Any]) -> tuple[list[Any], bool]:
    """``lower``'s arguments as a list, and whether they name several steps (a list or several
    handles) rather than one."""
    items = list(handles)
    if len(items) == 1 and isinstance(items[0], list | tuple):
        return list(items[0]), True
    return items, len(items) != 1


def lower_graph(
    *handles: ArtifactStep | StepSpec | Sequence[ArtifactStep | StepSpec],
    versions: VersionCodex | None = None,
) -> Graph:
    """Lower handles to one checked ``Graph``: the targets' specs and every step they need.

    What the entry points (``marin run``, the engines) take, once per run.

    Raises:
        MarinError: what ``lower`` raises, for the same reasons.
    """
    items, _ = flatten_handles(handles)
    return _graph_with_codex(items, None, versions, check=True)


@overload
def lower(
    handle: ArtifactStep | StepSpec,
    /,
    *,
    memo: dict[Any, Any] | None = None,
    versions: VersionCodex | None = None,
) -> StepSpec: ...


@overload
def lower(
    handles: Sequence[ArtifactStep | StepSpec],
    /,
    *,
    memo: dict[Any, Any] | None = None,
    versions: VersionCodex | None = None,
) -> list[StepSpec]: ...


@overload
def lower(
    first: ArtifactStep | StepSpec,
    second: ArtifactStep | StepSpec,
    /,
    *more: ArtifactStep | StepSpec,
    memo: dict[Any, Any] | None = None,
    versions: VersionCodex | None = None,
) -> list[StepSpec]: ...


def lower(
    *handles: ArtifactStep | StepSpec | Sequence[ArtifactStep | StepSpec],
    memo: dict[Any, Any] | None = None,
    versions: VersionCodex | None = None,
) -> StepSpec | list[StepSpec]:
    """Lower handles to specs: one handle gives one ``StepSpec``; a list of handles, or several
    handles, give a list.

    ``versions``: the run's ``VersionCodex`` for handles with ``version=None`` (default: the
    ambient ``build_context``'s). An override naming no deferred step is an error.

    Raises:
        InvalidStepError: something that is not a handle, a deferred version the codex gives no
            version for, an override of ``versions`` that names no deferred step, or a fixed
            version that depends on a mutable (``dev``) one.
        CycleError: the handles' dependencies form a cycle.
        DuplicateStepError: two different definitions of one ``name@version``, or one step's
            output inside (or, up to letter case, equal to) another's.
        ConfigError: a config value with no canonical JSON form, naming the field.
        FingerprintMismatchError: a handle's fingerprint differs from its
            ``expected_fingerprint``.
    """
    items, many = flatten_handles(handles)
    # check: refuse a bad graph here (e.g. one output inside another), not at run time
    specs = lower_with_codex(items, memo, versions, check=True)
    return specs if many else specs[0]


def lower_with_codex(
    items: list[Any], memo: dict[Any, Any] | None, versions: VersionCodex | None, check: bool
) -> list[StepSpec]:
    """The targets' specs, lowered with the run's codex (see ``_graph_with_codex``)."""
    return list(_graph_with_codex(items, memo, versions, check).targets)


def _graph_with_codex(
    items: list[Any], memo: dict[Any, Any] | None, versions: VersionCodex | None, check: bool
) -> Graph:
    """``_lower_and_check`` with the run's codex (``versions``, else the ambient one); an
    override of ``versions`` that no deferred step asked for is refused afterwards."""
    memo = {} if memo is None else memo
    if _LOWERING not in memo:  # a new lowering, not the next part of one (a step stream)
        memo[_LOWERING] = True
        new_lowering()
    codex = active_codex(versions)
    if codex is not None:
        memo[_CODEX] = codex
    graph = _lower_and_check(items, memo, check)
    if versions is not None:  # an ambient codex's caller checks (it may lower part by part)
        versions.check_used(memo.get(_DEFERRED, ()))
    return graph
