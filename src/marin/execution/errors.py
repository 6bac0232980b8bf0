"""Errors a user can act on.

Every message follows one style, ``error: <what> (step <name>): <how to fix>``, so that a CLI can
print it as one line and a person knows which step to look at and what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_error(what: str, fix: str, step: str | None = None) -> str:
    where = f" (step {step})" if step else ""
    return f"error: {what}{where}: {fix}"


def describe_error(exc: BaseException) -> str:
    """``Type: message`` for a summary line, without nesting a second ``error: ...`` prefix."""
    text = exc.what if isinstance(exc, MarinError) else str(exc)
    return f"{type(exc).__name__}: {text}"


class MarinError(Exception):
    """Base class for errors caused by the pipeline or its inputs rather than by a bug.

    Picklable whatever a subclass's ``__init__`` takes: an error raised on a remote worker (a
    Dask worker building a step) reaches the driver as itself, with its fields.
    """

    def __init__(self, what: str, fix: str, step: str | None = None) -> None:
        self.what = what
        self.fix = fix
        self.step = step
        super().__init__(format_error(what, fix, step))

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore_error, (type(self), self.args, dict(self.__dict__)))


def _restore_error(
    cls: type[MarinError], args: tuple[object, ...], state: dict[str, object]
) -> MarinError:
    """Unpickle a ``MarinError`` without calling its ``__init__`` (subclasses differ in it)."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class InvalidStepError(MarinError, ValueError):
    """A name, version or dependency that cannot form a step."""


class ApplyInputsError(MarinError, TypeError):
    """``apply()`` inputs that do not fit ``fn``'s parameters (a ``TypeError``, as in Marin)."""


class ConfigError(MarinError, TypeError):
    """A config or result value that has no canonical JSON form."""


class CycleError(MarinError, ValueError):
    """The dependency graph has a cycle; ``cycle`` lists the step ids around it."""

    def __init__(self, cycle: list[str]) -> None:
        self.cycle = cycle
        super().__init__(
            "dependency cycle " + " -> ".join(cycle),
            "a step cannot depend on itself; remove one of these edges",
            step=cycle[0] if cycle else None,
        )


class DuplicateStepError(MarinError, ValueError):
    """Two different definitions share one ``name@version`` and so one output path."""


class FingerprintMismatchError(MarinError, ValueError):
    """A handle's fingerprint differs from the ``expected_fingerprint`` it pins (at ``lower()``)."""


class ArtifactTypeMismatchError(MarinError, ValueError):
    """A stored record of ``name@version`` was built as another ``artifact_type``."""


class FailedBeforeError(MarinError, RuntimeError):
    """A needed step's last attempt failed and the run says ``force_run_failed=False``."""


class DriftError(MarinError, RuntimeError):
    """A built step's stored fingerprint differs from the current one under ``on_drift='error'``."""


class CodeDriftError(DriftError):
    """A built step's code changed since its record under ``on_code_drift='error'``."""


class CodeChangedError(MarinError, RuntimeError):
    """The process that runs a step's ``fn`` (an isolated step's child, a Dask worker) imported
    other code than the run lowered, which the record would name: a source edit meanwhile."""


class StorageError(MarinError, OSError):
    """A prefix or path that cannot be opened or written."""


class SymlinkError(StorageError):
    """A path below the prefix is a symbolic link: Marin never follows one to anything it
    writes, reads as state, or deletes (``Location.check_no_links``)."""


class NotRegularFileError(StorageError):
    """A metadata file of a step folder that is not a regular file (a folder, a FIFO, a
    device): Marin never reads, replaces or deletes it as its own file."""


class NotAFolderError(StorageError):
    """A file (anything but a folder or a link) where a build must make a folder: its step
    folder ``<output>.marin``, or a folder above its output. Refused before anything is
    written; Marin never deletes a file it did not write."""


class ForeignRecordError(MarinError, RuntimeError):
    """A step's metadata folder holds another step's record: building the step would replace
    that record, so the build is refused (``decide`` says so; ``build_step`` raises this)."""


class AdoptedDataError(MarinError, RuntimeError):
    """A build would clear an output path that holds adopted data (``ArtifactStep.adopt``
    in place): not Marin's to delete, so the build is refused before anything is touched.
    Final (``is_final``): no retry changes it."""


class TargetError(MarinError, ValueError):
    """A CLI target that does not name a pipeline."""


class StepFailedError(MarinError, RuntimeError):
    """A step's ``fn`` raised; the original exception is ``__cause__``."""

    report: object = None
    """The ``RunReport`` of the failed run, so a summary can list what did get built."""


class PipelineFailedError(MarinError, RuntimeError):
    """Several steps failed under ``keep_going``; ``failures`` maps step id to exception."""

    report: object = None
    """The ``RunReport`` of the failed run, so a summary can list what did get built."""

    def __init__(self, failures: dict[str, BaseException], blocked: list[str]) -> None:
        self.failures = failures
        self.blocked = blocked
        lines = [f"{step_id}: {type(exc).__name__}: {exc}" for step_id, exc in failures.items()]
        what = f"{len(failures)} step(s) failed"
        if blocked:
            what += f", {len(blocked)} blocked by them"
        super().__init__(
            what + " [" + _join_bounded(lines, "; ") + "]",
            "fix the failing steps and run again; built steps are kept",
        )


class LeaseLostError(MarinError, RuntimeError):
    """Another runner took over a step's lease while this one was building it."""


class LeaseVanishedError(MarinError, RuntimeError):
    """A step's lease file was deleted while it built (by its own ``fn``, by hand, by ``marin
    unlock``, or by ``marin gc`` reclaiming a build whose lease looked dead: its heartbeat
    stalled past the TTL): nobody took over, but the build can no longer prove it is the only
    one."""


class InputChangedError(MarinError, RuntimeError):
    """A dependency was rebuilt by another runner while a step was being built from it."""


class ReentrantBuildError(MarinError, RuntimeError):
    """A ``run()`` from inside a step's ``fn`` asked for a step that very build holds."""


class AbandonedError(MarinError, RuntimeError):
    """A build abandoned by a second interrupt: its ``fn`` ended, and nothing was committed."""


class RegisteredBuildFrozenError(MarinError, RuntimeError):
    """A build would replace in place a build ``marin register`` released (a registered build
    is frozen: its id resolves with its manifest alone). Refused before anything is cleared
    or written, and final: no retry changes it."""


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: errors repeat untrusted input only so far."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


def step_failed(error: BaseException, step: str, log_url: str, more: str = "") -> StepFailedError:
    """The one-line failure of a run whose first failed step is ``step`` (every runner's).

    A step's own exception points at its log; a ``MarinError`` (Marin refused the step: a path
    it must not touch, a missing limit...) keeps its own fix, since the log may not exist.
    """
    if isinstance(error, MarinError) and not isinstance(error, StepFailedError):
        return StepFailedError(error.what + more, error.fix, step)
    return StepFailedError(
        describe_error(error) + more,
        f"see the step's log at {log_url}; fix it and run again (built steps are kept)",
        step,
    )


MAX_NAMES_LISTED = 10
"""An error lists at most this many names (steps, values): a 10,000-name message helps nobody."""


def _join_bounded(items: Sequence[str], sep: str, limit: int = MAX_NAMES_LISTED) -> str:
    more = len(items) - limit
    shown = sep.join(items[:limit])
    return f"{shown} (and {more} more)" if more > 0 else shown


def list_names(names: Sequence[object], limit: int = MAX_NAMES_LISTED) -> str:
    """``a, b, c`` for at most ``limit`` names, then ``(and N more)``: an error stays one line."""
    shown = [str(n) for n in names[:limit]]
    shown = [t if len(t) <= 60 else f"{t[:59]}…" for t in shown]  # each name bounded too
    more = len(names) - limit
    return ", ".join(shown) + (f" (and {more} more)" if more > 0 else "")


class OptionError(InvalidStepError):
    """A run option (drift policy, force, cascade, max_concurrent, keep-going) that is not valid:
    from a constructor argument, a CLI flag or an engine's run parameters alike.

    A subclass of ``InvalidStepError`` (a ``ValueError``), which these checks raised before."""


def one_line(exc: BaseException) -> str:
    """``exc`` as ``Type: message`` on one line of at most about 300 characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


class RemoteJobError(MarinError, RuntimeError):
    """A remote step's job failed, or its backend could not be reached; names the job."""

    job: dict[str, Any] | None = None
    """The job's record (``job.json``), for ``run --json``."""
    final: bool = False
    """The job ended in a way no retry changes: cancelled (``marin cancel``), its gang not
    placed within ``placement_timeout``, or lost once more than ``max_preemptions`` allows.
    ``retries`` count only errors raised by ``fn``: no runner retries it."""


def is_final(error: BaseException) -> bool:
    """Whether a step's attempt ended in a way no retry changes, so ``retries`` are not spent:
    a remote job cancelled, its gang never placed or lost past ``max_preemptions``
    (``RemoteJobError.final``), a build abandoned by a second interrupt, or one refused
    because it would replace a registered build in place (``RegisteredBuildFrozenError``) or
    clear adopted data (``AdoptedDataError``). The one rule every runner asks: the run loop,
    and the engines' own task retries (Prefect's ``retry_condition_fn``, Airflow's
    fail-without-retry)."""
    if isinstance(error, AbandonedError | RegisteredBuildFrozenError | AdoptedDataError):
        return True
    return isinstance(error, RemoteJobError) and error.final
