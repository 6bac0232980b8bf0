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
(``lineage_events.py`` builds the events there): a lineage backend that is down or hangs never
fails or stalls a build. A full queue drops events; the first failure of any kind is one
warning. At exit the queue is drained for at most ``MARIN_LINEAGE_FLUSH_S`` seconds.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import os
import queue
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from marin.execution.provenance import now_iso

if TYPE_CHECKING:
    from marin.execution.decide import Upstream
    from marin.execution.records import ArtifactRecord
    from marin.execution.step_spec import StepSpec
    from marin.execution.storage import Location

log = logging.getLogger("marin")

START, COMPLETE, FAIL, ABORT = "START", "COMPLETE", "FAIL", "ABORT"
QUEUE_SIZE = 10_000
"""Events waiting to be sent; beyond it events are dropped (with the one warning)."""
DEFAULT_FLUSH_S = 5.0


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


class LineageSender:
    """One background thread sending queued events through an OpenLineage client.

    ``submit`` never blocks: a full queue drops the event. The first failure (no client, a
    transport error, a full queue) is logged once as a warning; later ones only at debug level,
    so a dead backend costs a log line, not a build.
    """

    def __init__(self, maxsize: int = QUEUE_SIZE, client: Any = None) -> None:
        self._queue: queue.Queue[BuildEvent] = queue.Queue(maxsize)
        self._client = client
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._warned = False
        self.sent = 0
        self.dropped = 0

    def submit(self, event: BuildEvent) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._work, name=SENDER_THREAD, daemon=True
                    )
                    self._thread.start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            self._warn(f"the queue of {self._queue.maxsize} events is full; events are dropped")

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the queue to drain; whether it did."""
        done = self._queue.all_tasks_done
        with done:
            return done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout)

    def _warn(self, what: str) -> None:
        if self._warned:
            log.debug("lineage: %s", what)
            return
        self._warned = True
        log.warning(
            "lineage: could not send OpenLineage events (%s); builds go on, and further "
            "failures are not reported",
            what,
        )

    def _work(self) -> None:
        from marin.execution.lineage_events import make_client, to_run_event

        _quiet_sender_thread()

        client = self._client
        if client is None:
            try:
                client = make_client()
            except Exception as exc:  # a broken config must not end the thread: drain
                self._warn(f"no client: {type(exc).__name__}: {exc}")
        while True:
            event = self._queue.get()
            try:
                if client is not None:
                    client.emit(to_run_event(event))
                    self.sent += 1
            except Exception as exc:
                self.dropped += 1
                self._warn(f"{type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()


SENDER_THREAD = "marin-lineage"
_QUIETED = ("urllib3.connectionpool", "urllib3.util.retry", "openlineage")


class _NotFromSender(logging.Filter):
    """Drops the retry and transport log lines of the sender thread: its own one warning
    says a backend is failing, and a dead backend must not print a line per event."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != SENDER_THREAD or record.levelno < logging.WARNING


def _quiet_sender_thread() -> None:
    for name in _QUIETED:
        target = logging.getLogger(name)
        if not any(isinstance(f, _NotFromSender) for f in target.filters):
            target.addFilter(_NotFromSender())


_sender_lock = threading.Lock()
_the_sender: LineageSender | None = None


def _sender() -> LineageSender:
    global _the_sender
    if _the_sender is None:
        with _sender_lock:
            if _the_sender is None:
                _the_sender = LineageSender()
                atexit.register(_flush_at_exit)
    return _the_sender


def use_sender(sender: LineageSender | None) -> LineageSender | None:
    """Replace the process's sender (tests); returns the previous one."""
    global _the_sender
    with _sender_lock:
        previous, _the_sender = _the_sender, sender
    return previous


def flush(timeout: float | None = None) -> bool:
    """Wait (at most ``timeout``, default ``MARIN_LINEAGE_FLUSH_S``) for queued events to go."""
    sender = _the_sender
    if sender is None:
        return True
    return sender.flush(flush_timeout() if timeout is None else timeout)


def flush_timeout() -> float:
    text = os.environ.get("MARIN_LINEAGE_FLUSH_S")
    try:
        return max(0.0, float(text)) if text else DEFAULT_FLUSH_S
    except ValueError:
        return DEFAULT_FLUSH_S


def _flush_at_exit() -> None:
    if not flush():
        log.warning(
            "lineage: %s OpenLineage event(s) not sent within %.0fs at exit (raise "
            "MARIN_LINEAGE_FLUSH_S to wait longer)",
            _the_sender._queue.unfinished_tasks if _the_sender else 0,
            flush_timeout(),
        )
