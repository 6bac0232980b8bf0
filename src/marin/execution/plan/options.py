"""``RunOptions``: the choices a run is made with, defaulted once and validated once.

Every runner takes the same options: the local ``StepRunner``, ``marin run``, the compiled
Prefect flow and its entry flow, and the Airflow tasks. Their defaults are written here and
nowhere else, and so is every check: a bad value raises ``OptionError`` naming the option and
the fix, whether it came from a Python argument, a CLI flag or an engine's run parameters
(``RunOptions.from_params``, which treats its mapping as untrusted data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.execution.errors import InvalidStepError, OptionError, list_names
from marin.execution.pipeline.versions import VersionCodex
from marin.execution.suggest import did_you_mean
from marin.execution.vocabulary import OutputScope

if TYPE_CHECKING:
    from marin.execution.pipeline.step_spec import StepSpec
    from marin.execution.store.location import Location

DRIFT_POLICIES = ("warn", "rebuild", "error")
DEFAULT_ON_DRIFT = "warn"
DEFAULT_ON_CODE_DRIFT = "warn"
DEFAULT_MAX_CONCURRENT = 8
DEFAULT_MAX_REMOTE = 64
"""Remote steps' jobs one run keeps in flight (``--max-remote``); waiting ones hold no slot of
``max_concurrent``, which is for work on this machine."""
DEFAULT_CASCADE = True
DEFAULT_KEEP_GOING = False
DEFAULT_FORCE_RUN_FAILED = True


def check_drift_policy(on_drift: object, name: str = "on_drift") -> str:
    """``on_drift`` (or ``on_code_drift``, by ``name``) if it is a drift policy;
    ``OptionError`` otherwise (a non-string too). Both default to ``warn``."""
    if not isinstance(on_drift, str) or on_drift not in DRIFT_POLICIES:
        raise OptionError(
            f"{name}={_short(on_drift)} is not a drift policy",
            f"use one of {', '.join(DRIFT_POLICIES)} (default {DEFAULT_ON_DRIFT})",
        )
    return on_drift


def check_max_concurrent(max_concurrent: object) -> int:
    if (
        isinstance(max_concurrent, bool)
        or not isinstance(max_concurrent, int)
        or max_concurrent < 1
    ):
        raise OptionError(
            f"max_concurrent={_short(max_concurrent)}",
            f"use a whole number >= 1 (default {DEFAULT_MAX_CONCURRENT})",
        )
    return max_concurrent


def check_max_remote(max_remote: object) -> int:
    if isinstance(max_remote, bool) or not isinstance(max_remote, int) or max_remote < 1:
        raise OptionError(
            f"max_remote={_short(max_remote)}",
            f"use a whole number >= 1 (default {DEFAULT_MAX_REMOTE})",
        )
    return max_remote


def check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"{name}={_short(value)}", "use True or False")
    return value


def split_names(text: str) -> list[str]:
    """A comma list of step names or globs, each stripped; a sweep point's name stays whole
    (``point_name`` joins its keys with commas: ``sw/train/lr=0.1,wd=0.5``): an item that
    holds ``=`` and no ``/`` continues the one before it. Empty items are kept (the callers
    name them as errors)."""
    names: list[str] = []
    for part in text.split(","):
        item = part.strip()
        if names and names[-1] and "=" in item and "/" not in item:
            names[-1] = f"{names[-1]},{item}"
        else:
            names.append(item)
    return names


def check_force(force: object) -> tuple[str, ...]:
    """Step names to rebuild: a list of strings, or one comma-separated string (a CLI or a
    form field); blanks are dropped."""
    if isinstance(force, str):
        force = split_names(force)
    if not isinstance(force, list | tuple | frozenset | set) or not all(
        isinstance(f, str) for f in force
    ):
        raise OptionError(
            f"force={_short(force)}", "use a list of step names (name or name@version)"
        )
    return tuple(dict.fromkeys(f.strip() for f in sorted(force) if f.strip()))


def check_patterns(patterns: object, name: str | None = None) -> tuple[str, ...]:
    """``--select``/``--exclude`` globs on step names: a list of strings, each a glob or a comma
    list of them (as a CLI flag or a form field gives it), in the order given without repeats.
    ``name`` is the option or parameter (``select``), named in the error; an empty pattern is an
    error, never "all"."""
    given = [patterns] if isinstance(patterns, str) else patterns
    label = f"{name}={_short(patterns)}" if name else _short(patterns)
    if not isinstance(given, list | tuple) or not all(isinstance(p, str) for p in given):
        raise OptionError(label, "use a list of globs on step names, such as ['ngram/eval/*']")
    stripped = [part for p in given for part in split_names(p)]
    if not all(stripped):
        raise OptionError(
            f"{label} has an empty pattern",
            "give a glob such as 'ngram/eval/*', repeated or as a comma list a,b",
        )
    return tuple(dict.fromkeys(stripped))


@dataclass(frozen=True)
class RunOptions:
    """The options of one run, valid by construction (``__post_init__`` checks every field).

    ``force`` holds step names as given (``name`` or ``name@version``); ``policy(steps)`` resolves
    them against a pipeline's steps, where an unknown name is an error.

    Raises:
        OptionError: when made (or copied with ``dataclasses.replace``) with a field that is
            not valid: a drift policy not in ``DRIFT_POLICIES``, a ``force`` that is not a list
            of names, a flag that is not a bool, a ``max_concurrent`` or ``max_remote`` that is
            not a whole number >= 1, a ``scope`` that is not ``shared`` or ``user``, ``versions``
            that is not a ``VersionCodex``. The message names the option and the fix.
    """

    on_drift: str = DEFAULT_ON_DRIFT
    force: tuple[str, ...] = ()
    cascade: bool = DEFAULT_CASCADE
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    keep_going: bool = DEFAULT_KEEP_GOING
    force_run_failed: bool = DEFAULT_FORCE_RUN_FAILED
    """False: a needed step whose last attempt failed is not retried; the run fails naming it."""
    on_code_drift: str = DEFAULT_ON_CODE_DRIFT
    """A built step whose code changed since its record: warn (serve it), rebuild or error."""
    max_remote: int = DEFAULT_MAX_REMOTE
    """Remote steps' jobs in flight at once (they hold no ``max_concurrent`` slot)."""
    scope: str = OutputScope.SHARED
    """The run-wide output scope (an ``OutputScope``): ``user`` places every step under
    ``<prefix>/users/<user>/`` (``plan/scope.py``); ``shared`` leaves it to each step's
    ``with_options(scope=...)``. Resolved once per run, by whoever runs it."""
    versions: VersionCodex | None = None
    """The codex of steps with ``version=None`` (``--version``/``--override``): the runner
    lowers handles under it (a lowered graph already has its versions)."""

    def __post_init__(self) -> None:
        check_drift_policy(self.on_drift)
        check_drift_policy(self.on_code_drift, "on_code_drift")
        object.__setattr__(self, "force", check_force(self.force))
        check_flag("cascade", self.cascade)
        check_max_concurrent(self.max_concurrent)
        check_max_remote(self.max_remote)
        check_flag("keep_going", self.keep_going)
        check_flag("force_run_failed", self.force_run_failed)
        if self.scope not in OutputScope.__members__.values():
            raise OptionError(f"scope={_short(self.scope)}", f"use one of {', '.join(OutputScope)}")
        object.__setattr__(self, "scope", OutputScope(self.scope))
        if self.versions is not None and not isinstance(self.versions, VersionCodex):
            raise OptionError(f"versions={_short(self.versions)}", "pass a VersionCodex (or None)")

    @classmethod
    def from_params(
        cls,
        params: Mapping[str, Any] | None,
        *,
        defaults: RunOptions | Mapping[str, Any] | None = None,
    ) -> RunOptions:
        """The options an engine's run parameters ask for (an Airflow run's conf or params, a
        Prefect flow's parameters): untrusted data, checked like any argument, once.

        A missing, ``None`` or empty-string parameter takes its value from ``defaults`` (the
        exported or deployed choice: options, or a mapping of some of them, checked with the
        rest), else the default; any other value must be valid: ``on_drift=0`` is an error, not
        the default. Keys that are not run options are ignored, and so are ``scope`` and
        ``versions`` in ``params``: each engine takes those its own way (the exported ones
        only, in a ``defaults`` mapping).

        Raises:
            OptionError: ``params`` is not a mapping, or a value in it (or in ``defaults``) is
                not valid for its option.
        """
        if params is not None and not isinstance(params, Mapping):
            raise OptionError(
                f"run parameters {_short(params)}", "pass a mapping of option names to values"
            )
        # Unset is absent, None or "" (an empty form field); 0, [] or False are values.
        given = {
            k: v for k, v in (params or {}).items() if k in _FIELDS and v is not None and v != ""
        }
        if isinstance(defaults, RunOptions):
            return dataclasses.replace(defaults, **given)
        # The fields' own defaults, under the engine's: all checked when made, once.
        engine = {k: v for k, v in dict(defaults or {}).items() if k in (*_FIELDS, *_ENGINE_OWN)}
        return cls(**{**engine, **given})

    def policy(self, steps: Sequence[StepSpec]) -> Policy:
        """The core ``Policy`` these options make for ``steps`` (force names resolved).

        Raises:
            InvalidStepError: a ``force`` name names none of ``steps`` (with a did-you-mean).
        """
        return Policy(
            self.on_drift,
            resolve_force(self.force, steps),
            self.cascade,
            self.force_run_failed,
            self.on_code_drift,
        )


_FIELDS = (
    "on_drift",
    "force",
    "cascade",
    "max_concurrent",
    "keep_going",
    "force_run_failed",
    "on_code_drift",
    "max_remote",
)


_ENGINE_OWN = ("scope", "versions")
"""Options an engine sets from its export or deployment, never from a run's parameters."""


def _short(value: object) -> str:
    """``repr(value)``, bounded: untrusted parameters can be huge."""
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else list(value)
        return "[" + list_names([repr(v) for v in items]) + "]"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Policy:
    """The choices a run is made with; the same for every runner."""

    on_drift: str = DEFAULT_ON_DRIFT
    force: frozenset[str] = frozenset()
    """Step ids to rebuild (resolve names with ``resolve_force``)."""
    cascade: bool = DEFAULT_CASCADE
    """Rebuild steps whose upstream is rebuilt; ``False`` serves them with a warning."""
    force_run_failed: bool = DEFAULT_FORCE_RUN_FAILED
    """Retry a needed step whose last attempt failed; ``False`` fails the run naming it."""
    on_code_drift: str = DEFAULT_ON_CODE_DRIFT
    """A built step whose code changed since its record: ``warn`` (serve it), ``rebuild`` or
    ``error``. Separate from ``on_drift``: code drift is advisory (see docs/caching.md)."""

    def __post_init__(self) -> None:
        check_drift_policy(self.on_drift)
        check_drift_policy(self.on_code_drift, "on_code_drift")
        check_flag("cascade", self.cascade)
        check_flag("force_run_failed", self.force_run_failed)


def check_prefix_fits(steps: Iterable[StepSpec], location: Location) -> None:
    """Refuse, before anything runs, a step whose ``fn`` runs in another process
    (``remote=...``, ``isolate=True``) on a ``memory://`` prefix, which lives in this process
    only: its output would be written where this process never sees it, and committed empty.
    Every runner plans through ``plan.read.read_stored``, which calls this once.

    Raises:
        InvalidStepError: such a step, naming it, the option and the fix.
    """
    if not location.is_memory:
        return
    for spec in steps:
        option = f"remote={spec.remote!r}" if spec.remote is not None else ""
        option = option or ("isolate=True" if spec.isolate else "")
        if option:
            raise InvalidStepError(
                f"{option} runs fn in another process, which cannot see this process's "
                f"memory:// prefix {location.url}",
                f"use a local folder or a bucket as the prefix (--prefix /tmp/marin), or drop "
                f"{option.split('=')[0]}= from the step's with_options",
                spec.step_id,
            )


def resolve_force(names: Iterable[str], steps: Sequence[StepSpec]) -> frozenset[str]:
    """``--force`` names (``name`` or ``name@version``) -> step ids.

    Raises:
        InvalidStepError: a name names none of ``steps`` (with a did-you-mean).
    """
    wanted = {n for n in names}
    ids = {s.step_id for s in steps if s.step_id in wanted or s.name in wanted}
    known = {s.step_id for s in steps} | {s.name for s in steps}
    unknown = sorted(wanted - known)
    if unknown:
        hints = [did_you_mean(name, known) for name in unknown]
        raise InvalidStepError(
            f"--force names no step in this pipeline: {list_names(unknown)}",
            "; ".join(h for h in hints[:10] if h)
            or "pass a step name or name@version from `marin plan`",
        )
    return frozenset(ids)
