"""Lazy handles: ``ArtifactStep``, ``apply`` and ``adopt``.

A handle (``ArtifactStep``) is a recipe: creating one does no I/O and runs nothing, and checks
its options at once. ``lower`` (``lower.py``) turns a handle graph into specs, purely;
``run``/``resolve`` lower and then hand the specs to the ``StepRunner``.

A handle is built as ``run(build_config(ctx))``: ``build_config`` makes the config from a
``StepContext`` (placeholders while fingerprinting, live paths at run time) and ``run``
receives that config and nothing else. ``apply(name, fn, **inputs)`` is the same pair, with
``run`` calling ``fn(**config)``. Code inside ``run`` that needs the context itself (assigned
GPU devices, for example) calls ``marin.execution.pipeline.context.current_context()``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from marin.execution.errors import ApplyInputsError, InvalidStepError
from marin.execution.names import METADATA_SUFFIX, validate_name, validate_version
from marin.execution.pipeline.artifact import Artifact
from marin.execution.pipeline.canonical import own_behaviour, register_fingerprint
from marin.execution.pipeline.context import StepContext, current_context
from marin.execution.pipeline.resources import (
    NO_RESOURCES,
    Resources,
    parse_duration,
    parse_resources,
)
from marin.execution.pipeline.scope import check_scope
from marin.execution.pipeline.step_spec import StepSpec, is_absolute_location
from marin.execution.pipeline.versions import Deferred, VersionCodex
from marin.execution.suggest import close_names
from marin.execution.vocabulary import OutputScope

__all__ = [
    "OUT",
    "ArtifactStep",
    "StepContext",
    "adopt",
    "apply",
    "current_context",
    "register_fingerprint",
]


class _OutputPath:
    """The ``OUT`` placeholder: becomes the step's own output path."""

    _instance: _OutputPath | None = None

    def __new__(cls) -> _OutputPath:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "OUT"

    def __reduce__(self) -> tuple[type[_OutputPath], tuple[()]]:
        return (_OutputPath, ())


OUT = _OutputPath()


def _no_config(ctx: StepContext) -> dict[str, Any]:
    return {}


@dataclass(frozen=True, eq=False)
class ArtifactStep:
    """An immutable, cheap handle: the recipe for one artifact, built as
    ``run(build_config(ctx))``.

    Equality is identity: two handles are "the same step" for sharing purposes when they are the
    same object, and lowering checks separately that one ``name@version`` has one definition.

    Raises:
        InvalidStepError: when made (or copied by ``with_options``) with a field that cannot
            form a step: a name or version outside the grammar, a dependency that is not a
            handle, a bad ``retries``, pin, adopted source, ``runtime_args``, ``scope`` or
            placement option (resources, timeout, queue, ``isolate``, ``resumable``, ``remote``,
            ``ranks``, ``rank_placement``, ``placement_timeout``, ``max_preemptions``).
    """

    name: str
    version: str | None
    """``None`` defers it to the run's ``VersionCodex`` (``versions.py``), resolved at lowering."""
    run: Callable[[Any], Any]
    """Receives the config ``build_config(ctx)`` made at run time; returns JSON-able data."""
    build_config: Callable[[StepContext], Any] = _no_config
    deps: tuple[ArtifactStep | StepSpec, ...] = ()
    artifact_type: str | type = "artifact"
    """A label recorded with the build, or a class (Marin's ``artifact_type=SomeArtifact``),
    recorded as its qualified name; a typed artifact class (``JsonArtifact``, ``Dataset``,
    ``Checkpoint``, ``pipeline/artifact_types.py``) is also what ``resolve()`` returns. A record
    of another type is refused, not served."""
    retries: int = 0
    pool: str | None = None
    resources: Resources | Mapping[str, Any] = NO_RESOURCES
    """A ``Resources`` after construction (a plain dict is parsed and checked)."""
    timeout: float | str | None = None
    """Seconds after construction (``"2h"`` is parsed)."""
    queue: str | None = None
    isolate: bool = False
    resumable: bool = False
    """Keep the partial output (and ``checkpoint_path``) across failed or abandoned attempts of
    the same fingerprint, to resume from (docs/reliability.md, "Resumable steps")."""
    keep_checkpoints: bool = False
    """A resumable step's ``checkpoint_path`` is kept after the commit (default: removed)."""
    remote: str | None = None
    """A backend name (``"local"``, ``"ray"``): ``fn`` runs as a durable job (docs/remote.md)."""
    ranks: int | None = None
    """A remote step's gang: ``fn`` runs as this many ranks of one job (docs/remote.md)."""
    rank_placement: str | None = None
    """How a gang's ranks are placed on nodes: a ``RankPlacement`` (None: ``pack``)."""
    placement_timeout: float | str | None = None
    """How long a gang waits for its placement, in seconds after construction (None:
    ``DEFAULT_PLACEMENT_TIMEOUT_S``)."""
    max_preemptions: int | None = None
    """How many times a remote step's lost job (killed by a signal, its node gone) is submitted
    again, apart from ``retries`` (None: ``DEFAULT_MAX_PREEMPTIONS``)."""
    runtime_args: Mapping[str, Any] | None = None
    """Values ``build_config`` reads with ``ctx.runtime_arg(key)``: live at run time,
    placeholders in the fingerprint, so changing one never changes the step's identity."""
    override_path: str | None = None
    """A pin: a fixed output path instead of ``<name>/<version>``, relative to the prefix or an
    absolute location (under ``MARIN_ALLOWED_PREFIXES``; a run places it under its prefix)."""
    adopt_source: str | None = None
    """Set by ``ArtifactStep.adopt``: data built elsewhere that consumers read."""
    adopt_config: Mapping[str, Any] | None = None
    """Set by ``ArtifactStep.adopt``: the config recorded (and fingerprinted) for that data."""
    expected_fingerprint: str | None = None
    """When set, ``lower()`` raises ``FingerprintMismatchError`` if the fingerprint differs."""
    scope: str = OutputScope.SHARED
    """``"user"``: built under ``<prefix>/users/<user>/`` for whoever runs it (``plan/scope.py``);
    placement, not identity."""
    point: Mapping[str, Any] | None = None
    """Set by ``sweep()``: the grid point this handle is (``{"lr": 0.001}``), for ``marin plan``'s
    sweep counts and ``marin results``; never identity (the name or version says the point)."""

    def __post_init__(self) -> None:
        validate_name(self.name)
        if self.version is not None:
            validate_version(self.version, self.name)
        if type(self.artifact_type) is not str:
            type_label(self.artifact_type, self)  # a class, kept; anything else is refused
        if (
            self.runtime_args is not None
            or self.override_path is not None
            or self.adopt_source is not None
            or self.expected_fingerprint is not None
        ):
            _check_identity_options(self)
        deps = tuple(self.deps)
        for i, dep in enumerate(deps):
            if not isinstance(dep, ArtifactStep | StepSpec):
                raise InvalidStepError(
                    f"deps[{i}] is a {type(dep).__name__}, not a step handle",
                    "depend on the ArtifactStep returned by apply(), not on its value or path",
                    self.step_id,
                )
        object.__setattr__(self, "deps", deps)
        if not isinstance(self.retries, int) or self.retries < 0:
            raise InvalidStepError(
                f"retries={self.retries!r}", "use a whole number >= 0", self.step_id
            )
        _check_placement(self)
        object.__setattr__(self, "scope", check_scope(self.scope, self.step_id))

    @property
    def step_id(self) -> str:
        return f"{self.name}@{'?' if self.version is None else self.version}"

    def lower(
        self, memo: dict[Any, Any] | None = None, *, versions: VersionCodex | None = None
    ) -> StepSpec:
        """This handle's spec: ``lower(handle)``.

        Lowering sits beside the handles and reads them (``lower.py``): it is reached at call
        time through the package's front door (``marin.execution``), never imported here.

        Raises:
            MarinError: what ``lower`` raises (``InvalidStepError``, ``CycleError``,
                ``DuplicateStepError``, ``ConfigError``, ``FingerprintMismatchError``).
        """
        import marin.execution

        spec: StepSpec = marin.execution.lower(self, memo=memo, versions=versions)
        return spec

    def fingerprint(self) -> str:
        """The step's fingerprint (the same under every prefix); lowers the graph, runs nothing.

        Raises:
            MarinError: what ``lower`` raises.
        """
        return self.lower().fingerprint

    def fingerprint_payload(self) -> str:
        """The canonical JSON the fingerprint hashes: ``{name, version, config, deps}`` (and
        ``pin`` for a pinned step, ``source`` for an adopted one, ``fn`` for what a
        ``functools.partial`` step function binds).

        Raises:
            MarinError: what ``lower`` raises.
        """
        return self.lower().fingerprint_payload

    def path(self, prefix: str | None = None) -> str:
        """Where consumers read this artifact under ``prefix`` (default ``$MARIN_PREFIX``): its
        pin, an adopted step's source, or ``<prefix>/<name>/<version>``.

        Raises:
            StorageError: the prefix is not one Marin can use (``resolve_prefix``).
            MarinError: what ``lower`` raises.
        """
        from marin.execution.store.location import resolve_prefix

        return self.lower().data_url(resolve_prefix(prefix))

    def resolve(self, **kwargs: Any) -> Artifact:
        """Build this handle (or serve it) and return its artifact: ``resolve(handle)``.

        The runner sits above the handles: it is reached at call time through the package's
        front door (``marin.execution``), never imported here.

        Raises:
            MarinError: what ``run`` raises (``StepFailedError`` when a step failed, ...).
        """
        import marin.execution

        artifact: Artifact = marin.execution.resolve(self, **kwargs)
        return artifact

    @classmethod
    def adopt(
        cls,
        name: str,
        version: str,
        source: str,
        *,
        kind: str | type = "artifact",
        config: Mapping[str, Any] | None = None,
    ) -> ArtifactStep:
        """A handle for data built elsewhere, at ``source`` (absolute, or relative to the prefix).

        Consumers read ``source``; nothing is moved or recomputed. Building the handle checks
        that ``source`` exists and records it at ``<prefix>/<name>/<version>``: the record's
        ``config`` is ``config`` as given, its ``source`` the resolved source (both are identity:
        the fingerprint payload holds ``config`` and ``source``). ``kind`` is its
        ``artifact_type`` (a class is named by its qualified name).

        Raises:
            InvalidStepError: a bad name or version, or a ``source`` that is not a literal
                location (empty, ``::``, a glob character, a ``.`` or ``..`` segment).
        """
        return cls(
            name=name,
            version=version,
            run=_AdoptRun(source),
            build_config=_AdoptConfig(dict(config) if config is not None else None),
            artifact_type=kind,
            adopt_source=source,
            adopt_config=config,
        )

    def with_options(
        self,
        *,
        retries: int | None = None,
        pool: str | None = None,
        resources: Resources | Mapping[str, Any] | None = None,
        timeout: float | str | None = None,
        queue: str | None = None,
        isolate: bool | None = None,
        artifact_type: str | type | None = None,
        resumable: bool | None = None,
        keep_checkpoints: bool | None = None,
        scope: str | None = None,
        remote: str | None = None,
        ranks: int | None = None,
        rank_placement: str | None = None,
        max_preemptions: int | None = None,
        placement_timeout: float | str | None = None,
    ) -> ArtifactStep:
        """A copy with scheduling options, which the adapters map to their engines' own.

        ``resources`` (``{"cpu": 4, "memory": "16GiB", "gpu": 1, "tpu": 8}``), ``timeout``
        (seconds or ``"2h"``), ``queue`` (a worker queue) and ``isolate`` (run ``fn`` in a fresh
        subprocess) are checked here and never enter the fingerprint: placement is not identity.
        ``resumable`` keeps a failed attempt's partial output for the next attempt of the same
        fingerprint, and ``keep_checkpoints`` keeps its ``checkpoint_path`` after the commit.
        ``scope="user"``: built under ``<prefix>/users/<user>/`` (the step and its dependents).
        ``remote`` (a backend name) runs ``fn`` as a job that outlives this process
        (docs/remote.md); ``ranks=N`` makes that job a gang of N processes, placed on nodes
        as ``rank_placement`` says (``pack``, ``spread``, ``strict_pack``, ``strict_spread``:
        Ray's placement group strategies) within ``placement_timeout`` (default 5 minutes: a
        cluster too small for the gang fails the step), and ``max_preemptions`` bounds how
        often a job lost to a signal is submitted again.

        Raises:
            InvalidStepError: an option that is not valid, naming it (a timeout with retries
                but no ``isolate``, ``keep_checkpoints`` without ``resumable``, an unknown
                ``remote`` backend, an ``isolate``d ``fn`` a subprocess cannot import, ...).
        """
        given: dict[str, Any] = {
            "retries": retries,
            "pool": pool,
            "resources": resources,
            "timeout": timeout,
            "queue": queue,
            "isolate": isolate,
            "artifact_type": artifact_type,
            "resumable": resumable,
            "keep_checkpoints": keep_checkpoints,
            "scope": scope,
            "remote": remote,
            "ranks": ranks,
            "rank_placement": rank_placement,
            "max_preemptions": max_preemptions,
            "placement_timeout": placement_timeout,
        }
        changes = {name: value for name, value in given.items() if value is not None}
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        return f"ArtifactStep({self.step_id})"

    def __deepcopy__(self, memo: dict[int, Any]) -> ArtifactStep:
        # A handle is immutable and its identity is what makes it a dependency: a snapshot of a
        # config that holds one keeps the handle itself.
        return self


_QUEUE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


def type_label(kind: Any, handle: ArtifactStep) -> str:
    """An ``artifact_type`` given as a class (as Marin passes one) is named by its qualname."""
    if isinstance(kind, str):
        return kind
    if isinstance(kind, type):
        return f"{kind.__module__}.{kind.__qualname__}"
    raise InvalidStepError(
        f"artifact_type={kind!r} is neither a string nor a class",
        "pass a label such as 'checkpoint' (or the artifact's class)",
        handle.step_id,
    )


def _check_identity_options(handle: ArtifactStep) -> None:
    """Check runtime args, a pin, an adopted source and an expected fingerprint."""
    step_id = handle.step_id
    if handle.runtime_args is not None:
        if not isinstance(handle.runtime_args, Mapping) or not all(
            isinstance(key, str) for key in handle.runtime_args
        ):
            raise InvalidStepError(
                f"runtime_args={handle.runtime_args!r} is not a mapping with string keys",
                "pass runtime_args={'key': value, ...}",
                step_id,
            )
        object.__setattr__(handle, "runtime_args", dict(handle.runtime_args))
    if handle.override_path is not None and handle.adopt_source is not None:
        raise InvalidStepError(
            "the step is both adopted (adopt_source) and pinned (override_path/pin)",
            "use ArtifactStep.adopt for data built elsewhere, or a pin for a fixed output path, "
            "not both",
            step_id,
        )
    if handle.override_path is not None:
        object.__setattr__(handle, "override_path", _check_pin(handle.override_path, step_id))
    if handle.adopt_source is not None:
        _check_source(handle.adopt_source, step_id)
    if handle.expected_fingerprint is not None and not isinstance(handle.expected_fingerprint, str):
        raise InvalidStepError(
            f"expected_fingerprint={handle.expected_fingerprint!r} is not a string",
            "pass the hex string handle.fingerprint() returned",
            step_id,
        )


_PIN_FIX = (
    "pin a literal path relative to the prefix, such as 'checkpoints/base', or an absolute "
    "location under the prefix the step runs in (for data that lives elsewhere, use "
    "ArtifactStep.adopt)"
)


def _check_pin(pin: Any, step_id: str) -> str:
    """A pin is where Marin writes, so it obeys the rules of a step's own output path; the pin
    in one spelling (an absolute one resolved as a prefix is)."""
    if not isinstance(pin, str):
        raise InvalidStepError(f"pin {pin!r} is not a string", _PIN_FIX, step_id)
    if "::" in pin:
        raise InvalidStepError(
            f"pin {pin!r} chains file systems with '::' (fsspec would open another location)",
            _PIN_FIX,
            step_id,
        )
    if is_absolute_location(pin):
        return _check_absolute_pin(pin, step_id)
    try:
        validate_name(pin)  # the same grammar as a step's own output path: literal segments
    except InvalidStepError as exc:
        raise InvalidStepError(
            f"pin {pin!r} is not a literal path ({exc.what})", _PIN_FIX, step_id
        ) from None
    return pin


def _check_absolute_pin(pin: str, step_id: str) -> str:
    """An absolute pin (Marin's ``pin="gs://bucket/loc"``): literal, and under
    ``MARIN_ALLOWED_PREFIXES`` when that is set. A run places it under its prefix
    (``plan/scope.place_pins``) and refuses it when it lies outside."""
    from marin.execution.errors import StorageError
    from marin.execution.store.location import resolve_prefix
    from marin.execution.store.prefix_policy import ALLOWED_ENV, check_prefix

    path = pin.partition("://")[2] if "://" in pin else pin
    try:
        if any(segment in (".", "..") for segment in path.split("/")):
            raise InvalidStepError(f"pin {pin!r} has a '.' or '..' segment", _PIN_FIX, step_id)
        url = resolve_prefix(pin)
        validate_name((url.partition("://")[2] if "://" in url else url).strip("/"))
        return check_prefix(url, pin)
    except StorageError as exc:
        where = f"outside {ALLOWED_ENV}" if ALLOWED_ENV in exc.fix else "not a literal location"
        raise InvalidStepError(f"pin {pin!r} is {where} ({exc.what})", _PIN_FIX, step_id) from None
    except InvalidStepError as exc:
        if exc.step == step_id:
            raise
        raise InvalidStepError(
            f"pin {pin!r} is not a literal location ({exc.what})", _PIN_FIX, step_id
        ) from None


def _check_source(source: Any, step_id: str) -> None:
    """An adopted source is only read, but still literally: no glob, no fsspec chaining."""
    fix = "give the data's literal location, e.g. 'gs://bucket/data/v3' or '/data/v3'"
    if not isinstance(source, str) or not source:
        raise InvalidStepError(f"adopt source {source!r} is not a path", fix, step_id)
    if "::" in source:
        raise InvalidStepError(
            f"adopt source {source!r} chains file systems with '::'", fix, step_id
        )
    glob = next((c for c in source if c in "*?[]"), None)
    if glob is not None:
        raise InvalidStepError(
            f"adopt source {source!r} contains the glob character {glob!r}", fix, step_id
        )
    scheme, sep, path = source.partition("://")
    if not sep:
        scheme, path = "", source
        if ":" in source.split("/", 1)[0]:  # fsspec reads 'file:/d' as a URL, 'a:b' as one
            raise InvalidStepError(
                f"adopt source {source!r} reads as a URL without '//'", fix, step_id
            )
    if scheme and scheme not in _fsspec_protocols():
        raise InvalidStepError(
            f"adopt source {source!r} names the storage protocol {scheme!r}, which fsspec does "
            "not know (protocols are lower case)",
            fix,
            step_id,
        )
    if any(segment in (".", "..") for segment in path.split("/")):
        raise InvalidStepError(f"adopt source {source!r} has a '.' or '..' segment", fix, step_id)
    if any(segment.endswith(METADATA_SUFFIX) for segment in path.split("/")):
        # A step's metadata folder (its kept checkpoints too) is Marin's state, deleted and
        # replaced with the build it belongs to: never another step's data.
        raise InvalidStepError(
            f"adopt source {source!r} lies in a step's metadata folder (a {METADATA_SUFFIX} "
            "folder: Marin's own state, deleted with its build)",
            "copy what you need out of it (a checkpoint, say) and adopt the copy, or read it "
            "from that step as a dependency",
            step_id,
        )


def _fsspec_protocols() -> list[str]:
    """fsspec's known protocols (imported here: a job process imports its pipeline file, and
    with it this module, but needs no file system of Marin's)."""
    import fsspec

    return list(fsspec.available_protocols())


@dataclass(frozen=True)
class _AdoptConfig:
    """An adopted step's ``build_config``: the config given to ``adopt``, recorded as it is."""

    config: dict[str, Any] | None

    def __call__(self, ctx: StepContext) -> dict[str, Any] | None:
        return copy.deepcopy(self.config)


@dataclass(frozen=True)
class _AdoptRun:
    """An adopted step's ``run``: the data at ``source`` must be there; nothing else is done to
    it (the config is only recorded)."""

    source: str

    def __call__(self, config: Any) -> None:
        import fsspec

        source = self.source
        if not is_absolute_location(source):
            source = f"{current_context().prefix.rstrip('/')}/{source}"
        if "://" in source:
            fs, path = fsspec.core.url_to_fs(source)
            found = fs.exists(path)
        else:
            found = os.path.exists(source)
        if not found:
            raise FileNotFoundError(
                f"cannot adopt {source}: nothing is there (build the data first, or fix the source)"
            )


def _check_placement(handle: ArtifactStep) -> None:
    """Parse and check resources, timeout, queue and isolate; errors name the step and field."""
    if (
        handle.resources is NO_RESOURCES
        and handle.timeout is None
        and handle.queue is None
        and handle.isolate is False
        and handle.resumable is False
        and handle.keep_checkpoints is False
        and handle.remote is None
        and handle.ranks is None
        and handle.rank_placement is None
        and handle.max_preemptions is None
        and handle.placement_timeout is None
    ):
        return  # the common case, kept cheap for graphs of 100,000 steps
    step_id = handle.step_id
    object.__setattr__(handle, "resources", parse_resources(handle.resources, step_id))
    if handle.timeout is not None:
        object.__setattr__(handle, "timeout", parse_duration(handle.timeout, step_id))
        if handle.retries and handle.isolate is False:
            # A thread cannot be killed: the timed-out attempt would write into its retry's output.
            raise InvalidStepError(
                f"timeout={handle.timeout:g} with retries={handle.retries} runs each attempt in "
                "a thread that a timeout cannot stop",
                "use isolate=True so a timeout can kill the attempt (or drop retries)",
                step_id,
            )
    if handle.queue is not None and (
        not isinstance(handle.queue, str) or not _QUEUE.match(handle.queue)
    ):
        raise InvalidStepError(
            f"queue={handle.queue!r} is not a queue name",
            "use 1-200 letters, digits, '_', '.', ':' or '-'",
            step_id,
        )
    if not isinstance(handle.isolate, bool):
        raise InvalidStepError(
            f"isolate={handle.isolate!r}", "use isolate=True or isolate=False", step_id
        )
    _check_resumable(handle)
    if handle.isolate:
        from marin.execution.pipeline.isolation import check_importable

        check_importable(handle.run, step_id)
    from marin.execution.pipeline.remote_option import (
        check_gang,
        check_rank_placement,
        check_remote,
        placement_timeout_s,
    )

    check_gang(handle.remote, handle.ranks, handle.max_preemptions, step_id)
    if handle.rank_placement is not None:
        check_rank_placement(handle.remote, handle.ranks, handle.rank_placement, step_id)
    if handle.placement_timeout is not None:
        bound = placement_timeout_s(handle.ranks, handle.placement_timeout, step_id)
        object.__setattr__(handle, "placement_timeout", bound)
    if handle.remote is not None:
        check_remote(handle.remote, handle.run, cast("float | None", handle.timeout), step_id)


def _check_resumable(handle: ArtifactStep) -> None:
    """``resumable`` and ``keep_checkpoints``: booleans, and only for a step Marin builds."""
    for name in ("resumable", "keep_checkpoints"):
        if not isinstance(getattr(handle, name), bool):
            raise InvalidStepError(
                f"{name}={getattr(handle, name)!r}",
                f"use {name}=True or {name}=False",
                handle.step_id,
            )
    if handle.keep_checkpoints and not handle.resumable:
        raise InvalidStepError(
            "keep_checkpoints=True on a step that is not resumable (it has no checkpoints)",
            "add resumable=True, or drop keep_checkpoints",
            handle.step_id,
        )
    if handle.resumable and handle.adopt_source is not None:
        raise InvalidStepError(
            "resumable=True on an adopted step (Marin never builds its data)",
            "drop resumable",
            handle.step_id,
        )


# --- apply -----------------------------------------------------------------------------------


def _snapshot(value: Any) -> Any:
    """A deep copy of a literal (dataclass, set, named tuple, ...), so that changing the caller's
    object later changes neither the fingerprint nor what ``fn`` receives.

    A value that cannot be copied is kept as it is; if it has no canonical form either, lowering
    rejects it with a ``ConfigError`` naming the field.
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


_HANDLES = (ArtifactStep, StepSpec)
"""What an input may name as a dependency (a tuple: ``A | B`` would be made at every call)."""


def _freeze(value: Any, deps: dict[int, ArtifactStep | StepSpec]) -> Any:
    """Copy containers and snapshot literals (so later mutation cannot change what is built
    under this fingerprint) and collect handles."""
    if isinstance(value, _HANDLES):
        deps.setdefault(id(value), value)
        return value
    if value is OUT:
        return value
    # What a container holds, read from it, never through a subclass's own ``__iter__``.
    if isinstance(value, list) and own_behaviour(value) is None:
        return [_freeze(item, deps) for item in list.__iter__(value)]
    if isinstance(value, tuple) and not hasattr(value, "_fields") and own_behaviour(value) is None:
        return tuple(_freeze(item, deps) for item in tuple.__iter__(value))
    if isinstance(value, dict) and own_behaviour(value) is None:
        return {key: _freeze(item, deps) for key, item in dict.items(value)}
    return _snapshot(value)  # a ``defaultdict`` keeps its factory: the fingerprint refuses it


def _is_fixed(value: Any) -> bool:
    """Whether a frozen input is plain data only (JSON scalars in lists, tuples and dicts, with
    handles and ``OUT``): nothing whose canonical form can change after ``apply()``, since
    ``_freeze`` copied every container and nobody else holds the copies. A dataclass or any
    other object may compute its form from state elsewhere, so it keeps the guard."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return True
    if value is OUT or isinstance(value, _HANDLES):
        return True
    if kind is list or kind is tuple:
        return all(_is_fixed(item) for item in value)
    if kind is dict:
        return all(type(key) is str and _is_fixed(item) for key, item in value.items())
    return False


def _materialise(value: Any, ctx: StepContext) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value  # the common literals, without the isinstance chain below
    if value is OUT:
        return ctx.output_path
    if isinstance(value, _HANDLES):
        return ctx.dep_path(value)
    if isinstance(value, list) and own_behaviour(value) is None:
        return [_materialise(item, ctx) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields") and own_behaviour(value) is None:
        return tuple(_materialise(item, ctx) for item in value)
    if isinstance(value, dict) and own_behaviour(value) is None:
        return {key: _materialise(item, ctx) for key, item in value.items()}
    # fn gets its own copy: a fn that mutates its config cannot change a retry's, nor the config
    # that a later lowering in this process fingerprints.
    return _snapshot(value)


@dataclass(frozen=True)
class ApplyCall:
    """``apply()``'s ``build_config``/``run`` pair: ``config(ctx)`` replaces handles and ``OUT``
    in ``fn``'s inputs by paths, and calling it with that config calls ``fn(**config)``."""

    fn: Callable[..., Any]
    inputs: Mapping[str, Any]
    fixed: bool = False
    """The inputs are plain data (``_is_fixed``): the config cannot change after lowering, so
    the spec needs no ``_FingerprintGuard``."""
    wraps_field: ClassVar[str] = "fn"
    """The field holding the user's code, for the code digest (which never calls a property)."""

    @property
    def wrapped_fn(self) -> Callable[..., Any]:
        """The user's function, which names this step's code in duplicate-step errors."""
        return self.fn

    def config(self, ctx: StepContext) -> dict[str, Any]:
        return {key: _materialise(value, ctx) for key, value in self.inputs.items()}

    def __call__(self, config: Mapping[str, Any]) -> Any:
        return self.fn(**config)


class _NoVersion:
    """``apply()``'s default for ``version``: none given. ``None`` is a choice (the run's codex
    gives the version); leaving ``version=`` out is a mistake, named at once."""

    def __repr__(self) -> str:
        return "<required>"


_NO_VERSION: Any = _NoVersion()


def apply(
    name: str,
    fn: Callable[..., Any],
    *,
    version: str | Deferred | None = _NO_VERSION,
    pin: str | None = None,
    artifact_type: str | type = "artifact",
    **inputs: Any,
) -> ArtifactStep:
    """A handle that calls ``fn(**inputs)``; handles in ``inputs`` become dependencies.

    ``version=None``: the run's ``VersionCodex`` gives the version when the graph is lowered
    (``marin run --version V``; Marin's spelling, as in its builders). ``DEFER`` is the same.

    ``pin``: a fixed output path instead of ``<name>/<version>``: relative to the prefix, or
    an absolute location under the prefix the step runs in (and ``MARIN_ALLOWED_PREFIXES``).
    ``artifact_type``: a label (or a class, named by its qualname), as on ``ArtifactStep``.

    Raises:
        InvalidStepError: no ``version``, a name, version or pin outside the grammar, or an
            ``fn`` that is not callable.
        ApplyInputsError: ``inputs`` do not fit ``fn``'s parameters (each unexpected input,
            with a did-you-mean, and each missing one).
    """
    validate_name(name)
    if version is _NO_VERSION:
        # A keyword with a default only so that leaving it out names the step (Python's own
        # TypeError names neither the step nor the fix).
        raise InvalidStepError(
            "apply() needs version=",
            f"pass version='v1' (bump it when {name}'s code changes its output), or "
            "version=None to take it from the run (marin run --version V)",
            name,
        )
    if isinstance(version, Deferred):
        version = None
    step_id = f"{name}@{'?' if version is None else version}"
    if not callable(fn):
        raise InvalidStepError(f"fn={fn!r} is not callable", "pass the function to run", step_id)
    try:
        signature = inspect.signature(fn)
    except ValueError:
        signature = None  # builtins without a signature: let the call itself check
    if signature is not None:
        try:
            signature.bind(**inputs)
        except TypeError as exc:
            raise _inputs_mismatch(fn, signature, inputs, str(exc), step_id) from None
    deps: dict[int, ArtifactStep | StepSpec] = {}
    frozen = {key: _freeze(value, deps) for key, value in inputs.items()}
    call = ApplyCall(fn, frozen, all(_is_fixed(value) for value in frozen.values()))
    return ArtifactStep(
        name=name,
        version=version,
        run=call,
        build_config=call.config,
        deps=tuple(deps.values()),
        artifact_type=artifact_type,
        override_path=pin,
    )


adopt = ArtifactStep.adopt
"""Marin's free ``adopt``: ``ArtifactStep.adopt(name, version, source, kind=, config=)``."""


def _inputs_mismatch(
    fn: Callable[..., Any],
    signature: inspect.Signature,
    inputs: Mapping[str, Any],
    reason: str,
    step_id: str,
) -> ApplyInputsError:
    """Every input ``fn`` does not take (with did-you-mean) and every parameter left out, at once:
    a misnamed keyword is both, and naming only one of them hides the mistake."""
    params = signature.parameters.values()
    fn_name = getattr(fn, "__qualname__", repr(fn))
    by_keyword = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    named = {p.name for p in params}  # a positional-only one passed by keyword: Python says so
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    unexpected = [] if takes_any else [key for key in inputs if key not in named]
    missing = [
        p.name
        for p in params
        if p.name in by_keyword and p.default is p.empty and p.name not in inputs
    ]
    renames: list[str] = []
    problems: list[str] = []
    for key in unexpected:
        close = close_names(key, missing or [n for n in by_keyword if n not in inputs], n=1)
        if not close and len(unexpected) == len(missing) == 1:
            close = missing  # one wrong name and one missing: surely the same input
        problems.append(f"{fn_name} takes no input {key!r}")
        if close:
            problems[-1] += f" (did you mean {close[0]}?)"
            renames.append(f"{key}= to {close[0]}=")
    if missing:
        plural = "s" if len(missing) > 1 else ""
        problems.append(f"missing the required input{plural} " + ", ".join(map(repr, missing)))
    fix = f"pass exactly the parameters of {fn_name}({', '.join(signature.parameters)})"
    if renames:
        fix = f"rename {', '.join(renames)}; {fix}"
    what = "; ".join(problems) if problems else reason
    return ApplyInputsError(f"apply() inputs do not fit {fn_name}: {what}", fix, step_id)
