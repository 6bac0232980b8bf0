"""The values a step may ask about where it runs.

A context has two modes. While fingerprinting (``is_fingerprint``), every location and runtime
arg is a placeholder, so that the same pipeline under ``/tmp/a``, ``memory://b`` or ``gs://c``
gets the same fingerprints. At run time the same questions return concrete values.

``build_config(ctx)`` receives a context; a step's ``run`` receives only the config. Code that
needs the run-time context beyond the config (the assigned GPU devices, say) asks
``current_context()``, the one accessor, which works in ``run`` on every runner.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from marin.execution.errors import MarinError

PLACEHOLDER_MARK = "\ue000"
"""Opens every placeholder a fingerprinting context hands ``build_config`` (``{<mark>OUT}``): a
private-use character no config spells by accident, so that a config's own text ``"{OUT}"``
(or a ``Path`` of it) is never taken for the output path. The same in every process, so that a
placeholder ``build_config`` transforms (``json.dumps``, ``.upper()``) has a stable
fingerprint (red team r19-3). The canonical form spells each placeholder as ``{OUT}`` and tags
a string that spells one itself (``pipeline/canonical.py``); text spelling ``{<mark>OUT}``
itself is reserved."""
OUTPUT_PLACEHOLDER = "{" + PLACEHOLDER_MARK + "OUT}"
PREFIX_PLACEHOLDER = "{" + PLACEHOLDER_MARK + "PREFIX}"
REGION_PLACEHOLDER = "{" + PLACEHOLDER_MARK + "REGION}"


def runtime_arg_placeholder(key: str) -> str:
    return "{" + PLACEHOLDER_MARK + "ARG:" + key + "}"


def dep_placeholder(name: str) -> str:
    # The dependency's version is part of the fingerprint payload's `deps` section; keeping it out
    # of the placeholder means a version bump is explained once, as `deps.<name>: v1 -> v2`.
    return "{" + PLACEHOLDER_MARK + "DEP:" + name + "}"


_assigned_devices: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar(
    "marin_assigned_devices", default=()
)


@contextlib.contextmanager
def assigned_devices(devices: tuple[int, ...]) -> Iterator[None]:
    """Run a build with these GPU devices assigned: contexts made inside see ``ctx.devices``.

    The runner wraps ``build_step`` in it with its ``ResourcePool`` grant's devices, so the
    context that ``build_step`` makes carries them without ``build_step`` knowing about pools.
    """
    token = _assigned_devices.set(tuple(int(d) for d in devices))
    try:
        yield
    finally:
        _assigned_devices.reset(token)


def current_devices() -> tuple[int, ...]:
    return _assigned_devices.get()


class NoStepContextError(MarinError, LookupError):
    """``current_context()`` was called outside a running step."""


class FingerprintTimeError(MarinError, ValueError, RuntimeError):
    """A run-time-only question (``ctx.resolved``) was asked while fingerprinting.

    A ``ValueError``, as Marin raises (callers catch that); still a ``RuntimeError`` too, as it
    was here before."""


_NO_ARGS: Mapping[str, Any] = MappingProxyType({})


def _no_args() -> Mapping[str, Any]:
    return _NO_ARGS


@dataclass(frozen=True)
class StepContext:
    """What a step's ``build_config`` resolves its config against, at fingerprint or run time.

    Values written as literals in ``build_config`` are the step's identity; values pulled from
    the context (``output_path``, ``artifact_path(dep)``, ``prefix``, ``region``,
    ``runtime_arg(key)``) are where and how it runs, and are placeholders while fingerprinting.
    """

    output_path: str
    prefix: str
    region: str | None
    dep_paths: Mapping[str, str] = field(default_factory=dict)
    """Dependency ``name@version`` -> its path (an adopted dependency's: its source)."""
    devices: tuple[int, ...] = field(default_factory=current_devices)
    """The GPU devices assigned to this build (indices as this process numbers them); () if none.

    An isolated step's subprocess gets ``CUDA_VISIBLE_DEVICES`` set to exactly these devices.
    """
    is_fingerprint: bool = False
    """True while lowering computes the fingerprint: paths and runtime args are placeholders."""
    runtime_args: Mapping[str, Any] = field(default_factory=_no_args)
    """The step's declared runtime args (placeholders while fingerprinting)."""
    loader: Callable[[str], Any] | None = field(default=None, repr=False, compare=False)
    """Loads a dependency's artifact by ``name@version`` (set by the runner; None elsewhere)."""
    _loaded: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    checkpoint_path: str | None = None
    """A resumable step's checkpoint folder, beside its output (``<output>.marin/checkpoints``):
    kept across failed attempts of one fingerprint, removed after the commit unless the step
    keeps it; None for a step that is not resumable. Created by the step, not by Marin."""
    lease_check: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    """Set by the build: answers ``still_holds_lease()``."""
    rank: int = 0
    """This process's rank in a gang step's job (``with_options(ranks=N)``): 0 to N-1."""
    world_size: int = 1
    """The number of ranks of a gang step's job (1 for every other step)."""
    code_check: Callable[[Any], None] | None = field(default=None, repr=False, compare=False)
    """Set by the build of an isolated step: called with ``fn`` in its fresh process, before
    ``fn`` runs, it raises unless that process imported the code the run lowered (which the
    record names: ``remote/code_check.py``). Never sent in the child's own context."""

    def still_holds_lease(self) -> bool:
        """Whether this attempt still holds its step's lease: one small read of the lease file.

        Call it before publishing a checkpoint: False means another attempt took over (or the
        lease expired while this one stalled), so this attempt must stop writing. True outside
        a build (no lease to lose).
        """
        return True if self.lease_check is None else self.lease_check()

    def _dep_id(self, dep: Any) -> str:
        """``dep``'s ``name@version``; a handle whose version is deferred (``name@?``) is the
        dependency of that name, whose version the run's codex gave when lowering."""
        step_id: str = dep if isinstance(dep, str) else dep.step_id
        if step_id.endswith("@?"):
            found = [k for k in self.dep_paths if k.rpartition("@")[0] == step_id[:-2]]
            if len(found) == 1:
                return found[0]
        return step_id

    def artifact_path(self, dep: Any) -> str:
        """The path of a dependency given as a handle, a ``StepSpec`` or a ``name@version``."""
        step_id = self._dep_id(dep)
        return _known(self.dep_paths, step_id, "{} is not a dependency of this step (its "
                      "dependencies: {})")  # fmt: skip

    dep_path = artifact_path
    """The same as ``artifact_path`` (this project's earlier name, kept as an alias)."""

    def resolved(self, dep: Any) -> Any:
        """The dependency's built ``Artifact`` (its path, record and result), read once and cached.

        Only at run time: while fingerprinting nothing is built yet, so this raises; branch on
        ``ctx.is_fingerprint`` to put an identity-bearing summary in the config instead.
        """
        step_id = self._dep_id(dep)
        if self.is_fingerprint:
            raise FingerprintTimeError(
                f"ctx.resolved({step_id}) was called while fingerprinting, before anything is "
                "built",
                "branch on ctx.is_fingerprint in build_config and use ctx.artifact_path(dep) "
                "(or a literal) at fingerprint time",
            )
        self.artifact_path(step_id)  # a KeyError naming the real dependencies
        cached = self._loaded.get(step_id)
        if cached is None:
            if self.loader is None:
                raise NoStepContextError(
                    f"ctx.resolved({step_id}) has no storage to read here (this context was not "
                    "made by a runner, or it was sent to an isolated subprocess)",
                    "call ctx.resolved in build_config, which runs in the runner's process, and "
                    "pass what run needs in the config",
                )
            cached = self._loaded[step_id] = self.loader(step_id)
        return cached

    def runtime_arg(self, key: str) -> Any:
        """A declared runtime arg: its value at run time, a placeholder while fingerprinting."""
        return _known(self.runtime_args, key, "runtime arg {!r} is not declared by this step "
                      "(declared: {}); add it to the handle's runtime_args")  # fmt: skip


_V = TypeVar("_V")


def _known(found: Mapping[str, _V], key: str, message: str) -> _V:
    """``found[key]``; else a ``KeyError`` of ``message`` with the key and the keys there are."""
    try:
        return found[key]
    except KeyError:
        raise KeyError(message.format(key, ", ".join(sorted(found)) or "none")) from None


_FINGERPRINTING = vars(
    StepContext(OUTPUT_PLACEHOLDER, PREFIX_PLACEHOLDER, REGION_PLACEHOLDER, devices=(),
                is_fingerprint=True)
)  # fmt: skip
"""The fields every fingerprint context shares (``fingerprint_context`` copies them)."""


def fingerprint_context(deps: tuple[Any, ...], runtime_args: Any = ()) -> StepContext:
    """The context ``build_config`` gets while lowering: every path and runtime arg a
    placeholder. Made as a copy of ``_FINGERPRINTING`` with its own dependencies and a fresh
    cache: lowering makes one per step, and the frozen dataclass's ``__init__`` would cost as
    much as fingerprinting a small config."""
    ctx = object.__new__(StepContext)
    fields = vars(ctx)
    fields.update(_FINGERPRINTING)
    fields["dep_paths"] = {dep.step_id: dep_placeholder(dep.name) for dep in deps}
    if runtime_args:
        fields["runtime_args"] = {key: runtime_arg_placeholder(key) for key in runtime_args}
    fields["_loaded"] = {}
    return ctx


_current: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar(
    "marin_step_context", default=None
)


@contextlib.contextmanager
def bound_context(ctx: StepContext) -> Iterator[None]:
    """Make ``ctx`` what ``current_context()`` returns while a step's ``run`` runs."""
    token = _current.set(ctx)
    try:
        yield
    finally:
        _current.reset(token)


def current_context() -> StepContext:
    """The run-time context of the step whose ``run`` is executing (its devices, paths, args).

    The one way for ``run`` (which receives only its config) to reach the context, on every
    runner, in an isolated subprocess too.

    Raises:
        NoStepContextError: called outside a running step (``build_config`` gets ``ctx``).
    """
    ctx = _current.get()
    if ctx is None:
        raise NoStepContextError(
            "current_context() was called outside a running step",
            "call it from a step's run function; build_config receives the context as ctx",
        )
    return ctx
