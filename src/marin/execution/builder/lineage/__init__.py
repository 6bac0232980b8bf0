"""OpenLineage run events for every build, off the critical path.

``build_step`` calls ``build_started`` when a build begins (lease held, checks passed) and
``build_finished`` when it commits, fails or is interrupted: START, then one of COMPLETE, FAIL
or ABORT, with the build id as the run id. A step served from cache emits nothing: no run
happened, and a COMPLETE would claim one did (docs/lineage.md). The run loop calls
``pipeline_started``/``pipeline_finished``: the pipeline run's own START and end, the parent
job every step run names.

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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from marin.execution.builder.lineage.model import (
    BuildEvent,
    PipelineEvent,
    PipelineRun,
    StepDataset,
)
from marin.execution.builder.lineage.sender import LineageSender, flush, use_sender
from marin.execution.builder.lineage.sender import sender as _sender
from marin.execution.pipeline.provenance import now_iso

if TYPE_CHECKING:
    from marin.execution.pipeline.step_spec import StepSpec
    from marin.execution.plan.decide import Upstream
    from marin.execution.store.location import Location
    from marin.execution.store.records import ArtifactRecord

START, COMPLETE, FAIL, ABORT = "START", "COMPLETE", "FAIL", "ABORT"


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
    from marin.execution.builder.lineage.names import step_datasets

    builds = {u.step_id: u.record.build_id for u in upstream if u.record is not None}
    named, out = step_datasets(location, spec)
    inputs = [
        StepDataset(n.dataset_namespace, n.dataset_name, step_id, builds.get(step_id))
        for step_id, n in named.items()
    ]
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
    *,
    abort: str | None = None,
) -> None:
    """Queue the end of a build: COMPLETE, or FAIL for an error, or ABORT for an interrupt, an
    abandoned build or a lost lease (the result was discarded, not failed), or for ``abort``
    (why a build was put off: an Airflow task deferred; its resumed build sends its own events)."""
    if run is None:
        return
    with _open_lock:
        if _open_runs.pop(run.started.build_id, None) is None:
            return  # already ended (abort_unfinished)
    from marin.execution.errors import AbandonedError, LeaseLostError

    if abort is not None or isinstance(
        error, KeyboardInterrupt | SystemExit | AbandonedError | LeaseLostError
    ):
        state = ABORT
    else:
        state = COMPLETE if error is None else FAIL
    message = abort if error is None else f"{type(error).__name__}: {error}"[:2000]
    extra: dict[str, Any] = {} if record is None else {"duration_s": record.duration_s}
    job = None if record is None else (record.provenance or {}).get("job")
    if isinstance(job, dict):  # a remote step's job (docs/remote.md)
        extra["job"] = {"backend": str(job.get("backend")), "jobId": str(job.get("job_id"))}
    _sender().submit(replace(run.started, state=state, time=now_iso(), error=message, extra=extra))


_open_lock = threading.Lock()
_open_runs: dict[str, LineageRun] = {}
"""Builds that sent START and no end event yet, by build id."""


def abort_unfinished(reason: str = "interrupted") -> None:
    """The process exits mid-build (``marin run`` after Ctrl-C, which does not wait for running
    ``fn``s): send ABORT for every build still running, then for every pipeline run still
    open, and wait (bounded) for them to go."""
    _abort_builds(None, reason)
    with _open_lock:
        pipelines = list(_open_pipelines.values())
        _open_pipelines.clear()
    for event in pipelines:
        _sender().submit(replace(event, state=ABORT, time=now_iso(), error=reason))
    # Always: a run loop that ended its pipeline run as it unwound queued its ABORTs already
    # (nothing is open any more), and they must go before the process exits. Returns at once
    # when nothing is queued or lineage is off.
    flush()


_open_pipelines: dict[str, PipelineEvent] = {}
"""Pipeline runs that sent START and no end event yet, by run id (guarded by ``_open_lock``)."""


def pipeline_started(steps: int) -> PipelineEvent | None:
    """Queue the START of the current pipeline run (``pipeline_run``) as its run loop starts.

    None (and no event) when lineage is off, when the run has no step to build (every step
    served: the Prefect flow still runs its loop then), when no pipeline run was named (a library
    ``StepRunner`` outside ``pipeline_run``: its parent is the process, which has no end), or
    when the run has started already (a loop inside a loop of the same run): the outermost loop
    owns the pipeline run's events.
    """
    if steps == 0 or not lineage_enabled():
        return None  # nothing to build: no run to claim, as a cache hit claims none
    pipeline = _pipeline.get()
    if pipeline is _PROCESS_RUN:
        return None
    event = PipelineEvent(START, now_iso(), job_namespace(), pipeline, _host(), steps)
    with _open_lock:
        if pipeline.run_id in _open_pipelines:
            return None
        _open_pipelines[pipeline.run_id] = event
    _sender().submit(event)
    return event


def pipeline_finished(
    started: PipelineEvent | None, error: BaseException | None = None, failed: int = 0
) -> None:
    """Queue the end of a pipeline run: COMPLETE, FAIL (``failed`` steps, or the loop raised),
    or ABORT (interrupted). Its builds still open are sent ABORT first, so every step's end
    precedes the pipeline's."""
    if started is None:
        return
    with _open_lock:
        if _open_pipelines.pop(started.pipeline.run_id, None) is None:
            return  # already ended (abort_unfinished)
    if isinstance(error, KeyboardInterrupt | SystemExit):
        state, message = ABORT, "interrupted"
    elif error is not None:
        state, message = FAIL, f"{type(error).__name__}: {error}"[:2000]
    elif failed:
        state, message = FAIL, f"{failed} step(s) failed"
    else:
        state, message = COMPLETE, None
    if state == ABORT:
        _abort_builds(started.pipeline.run_id, message or "interrupted")
    _sender().submit(replace(started, state=state, time=now_iso(), error=message))


def _abort_builds(parent_run_id: str | None, reason: str) -> int:
    """Send ABORT for the open builds of one pipeline run (every one, for None)."""
    with _open_lock:
        ids = [
            build_id
            for build_id, run in _open_runs.items()
            if parent_run_id is None or run.started.parent.run_id == parent_run_id
        ]
        runs = [_open_runs.pop(build_id) for build_id in ids]
    for run in runs:
        _sender().submit(replace(run.started, state=ABORT, time=now_iso(), error=reason))
    return len(runs)


def _host() -> str:
    return socket.gethostname()


__all__ = ["LineageSender", "flush", "use_sender"]  # the sender's API, re-exported
