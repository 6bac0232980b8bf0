"""``StepSpec``: one lowered, frozen node of a pipeline.

A spec is what every runner consumes: the local ``StepRunner``, the Prefect flow and the Airflow
tasks. It knows its identity (``name@version``), where its output goes relative to a prefix, and
its fingerprint; it knows nothing about which prefix or runner it will meet.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marin.execution.names import is_mutable_version
from marin.execution.pipeline.context import StepContext
from marin.execution.pipeline.resources import NO_RESOURCES, Resources
from marin.execution.vocabulary import OutputScope

if TYPE_CHECKING:
    from marin.execution.digest.code import CodeDigest

_set = object.__setattr__  # a frozen spec's derived fields are set once, in __post_init__


@dataclass(frozen=True, eq=False, slots=True)
class StepSpec:
    """One lowered step: identity, fingerprint, the runner-facing ``run(ctx)`` and placement.

    ``run`` takes the run-time ``StepContext``: lowering wraps a handle's ``run(config)`` so
    that a spec's ``run(ctx)`` calls ``handle.run(handle.build_config(ctx))``.
    """

    name: str
    version: str
    deps: tuple[StepSpec, ...]
    fingerprint: str
    fingerprint_payload: str
    """Canonical JSON of ``{name, version, config, deps}``, kept to explain drift field by field."""
    provenance: Mapping[str, Any]
    run: Callable[[StepContext], Any]
    """Called with the run-time context; returns a JSON-serialisable result."""
    build_config: Callable[[StepContext], Any]
    artifact_type: str = "artifact"
    retries: int = 0
    pool: str | None = None
    resources: Resources = NO_RESOURCES
    """What the step needs to run (placement, not identity: never in the fingerprint)."""
    timeout: float | None = None
    """Seconds ``fn`` may run; lowering wraps ``run`` so that exceeding it fails the build."""
    queue: str | None = None
    """The engine's worker queue (Airflow ``queue``, a Prefect tag)."""
    isolate: bool = False
    """``fn`` runs in a fresh subprocess (lowering wraps ``run``); see ``isolation.py``."""
    resumable: bool = False
    """A failed attempt's partial output is kept for the next attempt of the same fingerprint
    (``marin.execution.builder.attempt``); never part of the fingerprint."""
    keep_checkpoints: bool = False
    """A resumable step's ``checkpoint_path`` outlives its commit."""
    remote: str | None = None
    """The backend that runs ``fn`` as a durable job (``"local"``, ``"ray"``); see
    ``execution/remote/``. Placement, not identity: never in the fingerprint."""
    runtime_args: Mapping[str, Any] | None = None
    """Values ``build_config`` reads with ``ctx.runtime_arg(key)`` at run time; never identity."""
    pin: str | None = None
    """A fixed output path instead of ``<name>/<version>``: relative to the prefix, or an
    absolute location that a run places under its prefix (``plan/scope.place_pins``)."""
    pinned_fingerprint: bool = False
    """The handle set ``expected_fingerprint`` (equal to ``fingerprint``, checked at lowering):
    a stored build of another fingerprint is then an error, not drift."""
    source: str | None = None
    """An adopted step's data location (absolute, or relative to the prefix): what consumers
    read. The step itself only checks it exists and records it at ``<name>/<version>``."""
    scope: OutputScope = OutputScope.SHARED
    """``with_options(scope="user")``: built under the running user's folder (``plan/scope.py``);
    never part of the fingerprint."""
    user_home: str | None = None
    """Set when the run resolves the scope: ``users/<user>`` (this step reads and writes there)
    or ``""`` (it reads the shared build); None before (a shared path)."""
    point: Mapping[str, Any] | None = None
    """The sweep point this step is (``sweep()``), for the sweep counts and ``marin results``;
    never identity."""
    code: CodeDigest | None = None
    """The code digest of the step's function (``code_digest.py``), set by lowering: reported
    as code drift against its record's, never part of the path or the fingerprint."""

    # Derived once, at construction: the scheduler and a build read them dozens of times per step.
    step_id: str = field(init=False, repr=False)
    """``name@version``: the step's identity in logs, records and errors."""
    output_path: str = field(init=False, repr=False)
    """Relative to the prefix; joined to it only at run time."""
    user_scoped: bool = field(init=False, repr=False)
    """This step or one upstream of it is in user scope: a run must place it (``plan/scope.py``);
    kept here so that a graph without one costs that check nothing."""
    pinned_absolute: bool = field(init=False, repr=False)
    """This step or one upstream of it has an absolute pin: a run must place it under its prefix
    (``plan/scope.place_pins``); kept here for the same reason."""

    def __post_init__(self) -> None:
        name, version, pin, home = self.name, self.version, self.pin, self.user_home
        _set(self, "step_id", f"{name}@{version}")
        path = pin or f"{name}/{version}"
        _set(self, "output_path", f"{home}/{path}" if home else path)
        scoped = self.scope == OutputScope.USER
        absolute = pin is not None and is_absolute_location(pin)
        for dep in self.deps:
            scoped = scoped or dep.user_scoped
            absolute = absolute or dep.pinned_absolute
        _set(self, "user_scoped", scoped)
        _set(self, "pinned_absolute", absolute)

    def data_url(self, prefix_url: str) -> str:
        """Where consumers read this step's data under ``prefix_url``: its output, or an
        adopted step's source."""
        location = self.source if self.source is not None else self.output_path
        if is_absolute_location(location):
            return location
        return f"{prefix_url.rstrip('/')}/{location}"

    @property
    def mutable(self) -> bool:
        return is_mutable_version(self.version)

    def __repr__(self) -> str:
        return f"StepSpec({self.step_id}, fingerprint={self.fingerprint[:12]})"

    def __deepcopy__(self, memo: dict[int, Any]) -> StepSpec:
        return self  # frozen; a config snapshot keeps the dependency itself


def is_absolute_location(path: str) -> bool:
    """A URL (``gs://...``) or an absolute local path, as opposed to one under the prefix."""
    return "://" in path or path.startswith("/")


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _one_encoder() -> Callable[[Any], str]:
    """``_ENCODER.encode``, with the C encoder it makes on every call made once (a third of the
    time of encoding a small payload). Without a cycle check, which a canonical payload (a
    fresh tree) does not need; the plain method wherever the C encoder is not what it was."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    try:
        c_encoder = make(None, _ENCODER.default, json.encoder.encode_basestring, None,
                         ":", ",", True, False, True)  # fmt: skip
        probe = {"b": [1, 2.5, None, True, "\u00e9\n"], "a": {"c": ""}}
        if "".join(c_encoder(probe, 0)) != _ENCODER.encode(probe):
            return _ENCODER.encode
    except Exception:  # another Python's internals
        return _ENCODER.encode
    return lambda payload: "".join(c_encoder(payload, 0))


_encode = _one_encoder()


def fingerprint_of(payload: Mapping[str, Any]) -> tuple[str, str]:
    """Return ``(fingerprint, canonical payload JSON)`` for an already-canonical payload."""
    text = _encode(payload)
    return hashlib.sha256(text.encode()).hexdigest(), text
