"""OpenLineage run events for every build, off the critical path.

``build_step`` calls ``build_started`` when a build begins (lease held, checks passed) and
``build_finished`` when it commits, fails or is interrupted: START, then one of COMPLETE, FAIL
or ABORT, with the build id as the run id. A step served from cache emits nothing: no run
happened, and a COMPLETE would claim one did (docs/lineage.md).

Off unless configured the way the OpenLineage client is (``OPENLINEAGE_URL``,
``OPENLINEAGE_CONFIG``, ``OPENLINEAGE__TRANSPORT__*``, an ``openlineage.yml`` in the working
directory or ``~/.openlineage/``); ``OPENLINEAGE_DISABLED=true`` turns it off. When off, a build
pays a cached check (under a microsecond) and openlineage is never imported: the commit path is
hot.

Events go through a bounded queue to one background thread that owns the client
(``lineage_sender.py``; ``lineage_events.py`` builds the events there): a backend that is
down or hangs never fails or stalls a build. A full queue drops events; the first failure of
any kind is one warning. At exit the queue is drained for at most ``MARIN_LINEAGE_FLUSH_S``
seconds.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from marin.execution.lineage_sender import LineageSender, flush, use_sender
from marin.execution.lineage_sender import sender as _sender
from marin.execution.provenance import now_iso

if TYPE_CHECKING:
    from marin.execution.decide import Upstream
    from marin.execution.records import ArtifactRecord
    from marin.execution.step_spec import StepSpec
    from marin.execution.storage import Location

START, COMPLETE, FAIL, ABORT = "START", "COMPLETE", "FAIL", "ABORT"


@dataclass(frozen=True, slots=True)
class PipelineRun:
    """The pipeline run a step run belongs to: the OpenLineage parent job and run."""

    name: str
    """The parent job's name: the pipeline target, the Airflow DAG id, the Prefect flow name."""
    run_id: str
    """A UUID (any form ``uuid.UUID`` reads)."""
    runner: str
    """``local``, ``prefect``, ``airflow`` or ``library``."""


_PROCESS_RUN = PipelineRun("marin", str(uuid.uuid4()), "library")
_pipeline: contextvars.ContextVar[PipelineRun] = contextvars.ContextVar(
    "marin_lineage_pipeline", default=_PROCESS_RUN
)


@contextlib.contextmanager
def pipeline_run(name: str, run_id: str | None = None, runner: str = "local") -> Iterator[None]:
    """Builds inside this block are children of one pipeline run (the parent facet).

    ``run_id`` is any UUID string; a name that is not one (an Airflow run id) is mapped to a
    stable UUID, so every task of one run names the same parent.
    """
    token = _pipeline.set(PipelineRun(name, _as_uuid(run_id or str(uuid.uuid4()), name), runner))
    try:
        yield
    finally:
        _pipeline.reset(token)


def _as_uuid(text: str, name: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"marin:{name}:{text}"))


@dataclass(frozen=True, slots=True)
class StepDataset:
    """One input or output of a build, as OpenLineage names it (``artifact_names``)."""

    namespace: str
    name: str
    step_id: str
    build_id: str | None = None


@dataclass(frozen=True)
class BuildEvent:
    """What the sender thread turns into one OpenLineage ``RunEvent`` (no client types here,
    so that the build thread never imports openlineage)."""

    state: str
    time: str
    job_namespace: str
    step_id: str
    build_id: str
    fingerprint: str
    version: str
    artifact_type: str
    inputs: tuple[StepDataset, ...]
    output: StepDataset
    parent: PipelineRun
    host: str
    error: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LineageRun:
    """A build that sent START and still owes its end event."""

    started: BuildEvent


_enabled_cache: tuple[int, bool] | None = None


def lineage_enabled() -> bool:
    """Whether the OpenLineage client would find a configuration here (see the module doc).

    Looked up once per process, and again whenever a variable is added to or removed from the
    environment (its size is the cache key: reading variables costs microseconds, and this is
    asked on every build). After changing a configuration in place, ``reset_config_cache()``.
    """
    global _enabled_cache
    key = len(os.environ)
    cached = _enabled_cache
    if cached is not None and cached[0] == key:
        return cached[1]
    enabled = _detect(os.environ)
    _enabled_cache = (key, enabled)
    return enabled


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:
        return ""


def _detect(env: Mapping[str, str]) -> bool:
    if (env.get("OPENLINEAGE_DISABLED") or "").strip().lower() in ("true", "1", "yes"):
        return False
    if env.get("OPENLINEAGE_URL") or env.get("OPENLINEAGE_CONFIG"):
        return True
    if any(name.startswith("OPENLINEAGE__TRANSPORT") for name in env):
        return True
    home = os.path.expanduser("~/.openlineage/openlineage.yml")
    return os.path.isfile(os.path.join(_cwd(), "openlineage.yml")) or os.path.isfile(home)


def reset_config_cache() -> None:
    """Forget the cached configuration check (tests that change the configuration file)."""
    global _enabled_cache
    _enabled_cache = None


def job_namespace() -> str:
    """The namespace of Marin's jobs: ``OPENLINEAGE_NAMESPACE`` (the client's standard), else
    ``marin``."""
    return os.environ.get("OPENLINEAGE_NAMESPACE") or "marin"


def build_started(
    spec: StepSpec, location: Location, upstream: Sequence[Upstream], build_id: str
) -> LineageRun | None:
    """Queue the START of a build; None (and no cost) when lineage is off."""
    if not lineage_enabled():
        return None
    from marin.execution.artifact_names import artifact_names

    builds = {u.step_id: u.record.build_id for u in upstream if u.record is not None}
    inputs = []
    for dep in {d.step_id: d for d in spec.deps}.values():
        names = artifact_names(location, dep.output_path)
        inputs.append(
            StepDataset(
                names.dataset_namespace, names.dataset_name, dep.step_id, builds.get(dep.step_id)
            )
        )
    out = artifact_names(location, spec.output_path)
    parent = _pipeline.get()
    event = BuildEvent(
        state=START,
        time=now_iso(),
        job_namespace=job_namespace(),
        step_id=spec.step_id,
        build_id=build_id,
        fingerprint=spec.fingerprint,
        version=spec.version,
        artifact_type=spec.artifact_type,
        inputs=tuple(inputs),
        output=StepDataset(out.dataset_namespace, out.dataset_name, spec.step_id, build_id),
        parent=parent,
        host=_host(),
    )
    _sender().submit(event)
    run = LineageRun(event)
    with _open_lock:
        _open_runs[build_id] = run
    return run


def build_finished(
    run: LineageRun | None,
    error: BaseException | None = None,
    record: ArtifactRecord | None = None,
) -> None:
    """Queue the end of a build: COMPLETE, or FAIL for an error, or ABORT for an interrupt, an
    abandoned build or a lost lease (the result was discarded, not failed)."""
    if run is None:
        return
    with _open_lock:
        if _open_runs.pop(run.started.build_id, None) is None:
            return  # already ended (abort_unfinished)
    from marin.execution.errors import AbandonedError, LeaseLostError

    if error is None:
        state = COMPLETE
    elif isinstance(error, KeyboardInterrupt | SystemExit | AbandonedError | LeaseLostError):
        state = ABORT
    else:
        state = FAIL
    message = None if error is None else f"{type(error).__name__}: {error}"[:2000]
    extra = {} if record is None else {"duration_s": record.duration_s}
    _sender().submit(replace(run.started, state=state, time=now_iso(), error=message, extra=extra))


_open_lock = threading.Lock()
_open_runs: dict[str, LineageRun] = {}
"""Builds that sent START and no end event yet, by build id."""


def abort_unfinished(reason: str = "interrupted") -> None:
    """The process exits mid-build (``marin run`` after Ctrl-C, which does not wait for running
    ``fn``s): send ABORT for every build still running, and wait (bounded) for it to go."""
    with _open_lock:
        runs = list(_open_runs.values())
        _open_runs.clear()
    if not runs:
        return
    for run in runs:
        _sender().submit(replace(run.started, state=ABORT, time=now_iso(), error=reason))
    flush()


def _host() -> str:
    return socket.gethostname()


__all__ = ["LineageSender", "flush", "use_sender"]  # the sender's API, re-exported
