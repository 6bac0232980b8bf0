"""Run-wide versions: a handle with ``version=None`` takes its version from the run's codex.

Marin's ``VersionCodex`` (``build_context.py``): one ``default`` and per-name ``overrides``, so
"build everything at ``v3`` but the tokenizer at ``v4``" is a run option, not an edit of the
pipeline. Here the version is resolved when the graph is lowered (``lower(..., versions=...)``,
``run(..., versions=...)``, ``marin run --version V --override NAME=V``), or from an ambient
``build_context`` around the lowering; Marin resolves it when the handle is made. Either way the
fingerprint, the path and the drift check see an ordinary version string. A deferred version
with no codex is an error, never a silent ``dev``; an override that no deferred step asked for is
an error with a did-you-mean (a typo, or a step whose version is fixed in code).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from marin.execution.errors import InvalidStepError
from marin.execution.names import validate_name, validate_version
from marin.execution.suggest import did_you_mean


class Deferred:
    """The type of ``DEFER``, an older spelling of ``version=None``."""

    def __repr__(self) -> str:
        return "DEFER"


DEFER = Deferred()
"""The same as ``apply(name, fn, version=None)``: the run's codex gives the version. ``None``
is the spelling (Marin's, for ``ArtifactStep`` and ``apply`` alike); this name stays for
pipelines written with it."""

HOW_TO_GIVE_ONE = (
    "give it one: version='v1' on the handle, lower(..., versions=VersionCodex(default='v1')), "
    "run(..., versions=...), or `marin run TARGET --version v1`"
)


@dataclass(frozen=True)
class VersionCodex:
    """The versions of a run's deferred steps: ``overrides[name]``, else ``default``.

    ``default=None``: only the named steps may defer; any other deferred step is an error.
    Every value is checked as a version when the codex is made, so a malformed ``--override``
    fails before anything is lowered.

    Raises:
        InvalidStepError: when made with a default or an override that is not a valid version,
            or an override whose name is not a valid step name.
    """

    default: str | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.default is not None:
            validate_version(self.default, "--version")
        clean: dict[str, str] = {}
        for name, version in dict(self.overrides).items():
            validate_name(name)
            clean[name] = validate_version(version, f"--override {name}")
        object.__setattr__(self, "overrides", dict(sorted(clean.items())))

    def version_for(self, name: str) -> str:
        """The version of deferred step ``name``.

        Raises:
            InvalidStepError: the codex has no version for ``name`` (no override, no default).
        """
        version = self.overrides.get(name, self.default)
        if version is None:
            raise InvalidStepError(
                f"{name} defers its version (version=None) and the run gives none",
                HOW_TO_GIVE_ONE,
                name,
            )
        return version

    def check_used(self, deferred: Iterable[str]) -> None:
        """Refuse overrides that name no deferred step of the graph (with a did-you-mean).

        Raises:
            InvalidStepError: an override names none of ``deferred``.
        """
        asked = set(deferred)
        unused = [name for name in self.overrides if name not in asked]
        if not unused:
            return
        hints = [did_you_mean(name, asked) for name in unused]
        hint = "; ".join(f"{n}: {h}" for n, h in zip(unused, hints, strict=True) if h)
        raise InvalidStepError(
            f"--override {', '.join(unused)} names no step that defers its version "
            f"(deferred steps: {', '.join(sorted(asked)) or 'none'})",
            (hint + "; " if hint else "")
            + "override only steps made with version=None (a fixed version wins over the codex)",
        )

    def as_data(self) -> dict[str, Any]:
        """Plain JSON for records, plans and exported DAGs: ``{"default", "overrides"}``."""
        return {"default": self.default, "overrides": dict(self.overrides)}

    @classmethod
    def from_data(cls, data: Any, where: str = "versions") -> VersionCodex:
        """The codex from ``as_data()``'s JSON (untrusted: a trigger may have sent it).

        Raises:
            InvalidStepError: ``data`` is not such a mapping, or holds an invalid version or name.
        """
        if data is None:
            return cls()
        if not isinstance(data, Mapping) or set(data) - {"default", "overrides"}:
            raise InvalidStepError(
                f"{where}={data!r} is not a version codex",
                'pass {"default": "v1", "overrides": {"name": "v2"}}',
            )
        overrides = data.get("overrides") or {}
        if not isinstance(overrides, Mapping):
            raise InvalidStepError(f"{where}.overrides={overrides!r}", "pass a name->version map")
        return cls(default=data.get("default"), overrides=overrides)

    def describe(self) -> str:
        """One line for ``marin plan``: ``versions: default v3; override tok/bpe=v4``."""
        parts = [f"default {self.default}" if self.default else "no default"]
        parts += [f"override {n}={v}" for n, v in self.overrides.items()]
        return "versions: " + "; ".join(parts)

    @property
    def empty(self) -> bool:
        return self.default is None and not self.overrides


def parse_override(text: str) -> tuple[str, str]:
    """``NAME=VERSION`` from ``--override``; an error saying the form otherwise."""
    name, sep, version = text.partition("=")
    if not sep or not name or not version:
        raise InvalidStepError(f"--override {text!r}", "write it as NAME=VERSION, e.g. tok/bpe=v4")
    return name, version


def codex_from_args(version: str | None, overrides: Iterable[str]) -> VersionCodex | None:
    """The codex of ``--version`` and ``--override`` (None when neither is given). A name
    overridden twice is refused, even with one value: no flag silently wins over another.

    Raises:
        InvalidStepError: an override is not ``NAME=VERSION``, names a step twice, or holds an
            invalid name or version.
    """
    chosen: dict[str, str] = {}
    for text in overrides:
        name, version_of = parse_override(text)
        if name in chosen:
            raise InvalidStepError(
                f"--override {name} is given twice ({name}={chosen[name]}, {name}={version_of})",
                f"give each name once, e.g. --override {name}={version_of}",
                name,
            )
        chosen[name] = version_of
    if version is None and not chosen:
        return None
    return VersionCodex(default=version, overrides=chosen)


def codex_json(codex: VersionCodex) -> str:
    """The codex as canonical JSON text: what an exported DAG or deployment embeds."""
    return json.dumps(codex.as_data(), sort_keys=True, separators=(",", ":"))


def codex_flags(codex: VersionCodex | None) -> str:
    """`` --version V --override N=V ...`` for an export command ("" without a codex)."""
    if codex is None:
        return ""
    argv = ["--version", codex.default] if codex.default else []
    for name, version in codex.overrides.items():
        argv += ["--override", f"{name}={version}"]
    return " " + shlex.join(argv) if argv else ""


def exported_codex(exported: str | None, chosen: object, where: str) -> VersionCodex | None:
    """The codex a run of an export uses. ``chosen`` (a trigger's value: untrusted) may only
    be the exported codex itself (None or "" keeps it): the export's steps are its steps."""
    if chosen not in (None, "", exported):
        raise InvalidStepError(
            f"{where}={str(chosen)[:200]!r} is not the codex this was exported with "
            f"({exported or 'none'})",
            "re-export with --version/--override to run other versions",
        )
    return None if exported is None else VersionCodex.from_data(json.loads(exported), where)


_ACTIVE: contextvars.ContextVar[VersionCodex | None] = contextvars.ContextVar(
    "marin_versions", default=None
)


@contextlib.contextmanager
def build_context(versions: VersionCodex) -> Iterator[VersionCodex]:
    """Within this block, ``lower()`` without ``versions=`` uses ``versions`` (as Marin's
    ``build_context``, but read when lowering, not when a handle is made)."""
    token = _ACTIVE.set(versions)
    try:
        yield versions
    finally:
        _ACTIVE.reset(token)


def active_codex(versions: VersionCodex | None) -> VersionCodex | None:
    """``versions`` if given, else the ambient ``build_context``'s codex."""
    return versions if versions is not None else _ACTIVE.get()


def use_codex(codex: VersionCodex | None) -> None:
    """Make ``codex`` this context's ambient codex (an engine task: the one it was exported
    with, set by every task, so none inherits another's)."""
    _ACTIVE.set(codex)


def resolved_id(handle: Any) -> str:
    """A handle's ``name@version``, a deferred one's from the ambient codex (as lowering
    resolves it); ``name@?`` when there is none."""
    codex = _ACTIVE.get()
    if handle.version is not None or codex is None:
        return str(handle.step_id)
    try:
        return f"{handle.name}@{codex.version_for(handle.name)}"
    except InvalidStepError:
        return str(handle.step_id)
