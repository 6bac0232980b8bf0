"""Running handles: ``run``, ``resolve`` and ``materialized_config``.

These lower handles (``marin.execution.lazy``) and hand the specs to the ``StepRunner``; they
sit above both, so the handle layer never imports the runner. ``marin.execution.lazy`` still
exports them (Marin's import path).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from marin.execution.builder.commit import run_context
from marin.execution.pipeline.artifact import Artifact, TypedArtifact
from marin.execution.pipeline.handles import ArtifactStep
from marin.execution.pipeline.lower import flatten_handles, lower_with_codex
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.pipeline.versions import VersionCodex
from marin.execution.plan.options import DEFAULT_MAX_CONCURRENT, DEFAULT_ON_DRIFT, RunOptions
from marin.execution.plan.scope import place_pins
from marin.execution.run.runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.vocabulary import OutputScope

__all__ = ["materialized_config", "resolve", "run"]


def run(
    *handles: ArtifactStep | StepSpec | Sequence[ArtifactStep | StepSpec],
    prefix: str | None = None,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    on_drift: str = DEFAULT_ON_DRIFT,
    force: Iterable[str] = (),
    keep_going: bool = False,
    dry_run: bool = False,
    region: str | None = None,
    force_run_failed: bool = True,
    versions: VersionCodex | None = None,
    scope: str = OutputScope.SHARED,
) -> list[Artifact]:
    """Lower and build ``handles``; return one artifact per handle, in order. Marin's loose
    keywords are made one ``RunOptions`` here, once; the prefix is opened once.

    ``force_run_failed=False``: a needed step whose last attempt failed is not retried; the
    run fails (``FailedBeforeError``) naming it, before anything is built. ``versions``: the
    ``VersionCodex`` of handles with ``version=None``. ``scope="user"``: every step under
    ``<prefix>/users/<user>/`` (``plan/scope.py``).

    Raises:
        OptionError: a bad ``max_concurrent``, ``on_drift`` or other run option, before
            anything is read or built.
        InvalidStepError: lowering refused a handle (see ``lower``), a ``force`` name names no
            step, ``scope`` or the user name is not valid, or a step's resources can never fit
            this machine.
        CycleError: the handles' dependencies form a cycle.
        DuplicateStepError: two definitions of one ``name@version``, or one output inside
            another.
        ConfigError: a config value has no canonical JSON form.
        FingerprintMismatchError: a handle's ``expected_fingerprint`` differs from its
            fingerprint, or from its stored build's.
        StorageError: the prefix cannot be opened or written (``SymlinkError``: a link below it).
        DriftError: a drifted step under ``on_drift="error"`` (``CodeDriftError``: its code,
            under ``on_code_drift="error"``); raised by the plan, before anything is built.
        ArtifactTypeMismatchError: a stored build of a step was built as another
            ``artifact_type``.
        FailedBeforeError: under ``force_run_failed=False``, a needed step's last attempt failed.
        StepFailedError: a step failed (its error is the ``__cause__``); the first one, unless
            ``keep_going``.
        PipelineFailedError: under ``keep_going``, the steps that failed, all at once.
    """
    options = RunOptions(
        on_drift=on_drift, force=tuple(force), max_concurrent=max_concurrent,
        keep_going=keep_going, force_run_failed=force_run_failed, scope=scope, versions=versions,
    )  # fmt: skip
    items, _ = flatten_handles(handles)
    specs = lower_with_codex(items, None, options.versions, check=False)
    location = open_prefix(prefix)
    report = StepRunner(options, prefix=prefix, region=region).run(
        specs, dry_run=dry_run, location=location
    )
    # Each artifact is the one this user reads: the run's targets, placed for its scope.
    return [report.artifact(spec) for spec in report.targets]


def resolve(handle: ArtifactStep | StepSpec, **kwargs: Any) -> Any:
    """Build one handle and return its artifact: ``run(handle)[0]``; for a handle whose
    ``artifact_type`` is a typed artifact class (``JsonArtifact`` subclass, ``Dataset``,
    ``Checkpoint``), the typed value Marin returns (``Kind.of(artifact)``, no further read).

    Raises:
        MarinError: what ``run`` raises, for the same reasons (``StepFailedError`` when the
            step or one it needs failed).
        ValueError: a ``JsonArtifact`` type whose fields the recorded value lacks.
    """
    artifact = run(handle, **kwargs)[0]
    kind = getattr(handle, "artifact_type", None)
    if isinstance(kind, type) and issubclass(kind, TypedArtifact) and artifact.record is not None:
        return kind.of(artifact)
    return artifact


def materialized_config(handle: ArtifactStep | StepSpec, prefix: str) -> Any:
    """The config a run under ``prefix`` would hand ``run`` (for golden tests); runs nothing.

    The context is the one a build gets (paths under ``prefix``, the handle's runtime args),
    with no region and no devices.

    Raises:
        MarinError: what ``lower`` raises for a handle; ``StorageError`` for a prefix that
            cannot be opened. An error of the handle's own ``build_config`` propagates as is.
    """
    spec = handle if isinstance(handle, StepSpec) else handle.lower()
    location = open_prefix(prefix)
    (spec,) = place_pins([spec], location)
    return spec.build_config(run_context(spec, location))
