"""The backend protocol of remote steps (``with_options(remote="local")``), and its registry.

A backend places a step's call somewhere else (a detached process, a Ray cluster, Slurm...) and
answers four questions about it; the core does everything else (the job record, the lease, the
wait, the commit). Register your own with ``register_backend("slurm", SlurmBackend())``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from marin.execution.errors import InvalidStepError
from marin.execution.vocabulary import JobState


@dataclass(frozen=True)
class JobSpec:
    """What a backend runs: ``python -m marin.execution.pipeline.isolated_child CALL RESULT``,
    with ``call`` the pickled call (``fn`` by reference, its config, the run context)."""

    step_id: str
    call: bytes
    """The payload ``isolated_child`` reads (see ``pipeline/isolation.py``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment additions for the job (``CUDA_VISIBLE_DEVICES``...)."""
    gpus: int = 0
    workdir: str | None = None
    """A local folder the core offers for the job's files (beside the record on a local
    prefix); a backend may ignore it."""


@dataclass(frozen=True)
class JobHandle:
    """A submitted job, as ``job.json`` stores it: plain data, so any later driver can rebuild
    it and ask the backend about the job."""

    backend: str
    job_id: str
    data: dict[str, str] = field(default_factory=dict)
    """Backend-specific details (a local job's folder and process, a Ray address)."""


@dataclass(frozen=True)
class JobStatus:
    """One look at a job: its state, and when it ended the step's returned value (pickle) or
    why it failed."""

    state: JobState
    result: bytes | None = None
    """``isolated_child``'s outcome pickle, once the job SUCCEEDED or FAILED inside ``fn``."""
    detail: str = ""


@runtime_checkable
class RemoteBackend(Protocol):
    """Where a remote step's job runs. Implementations must make ``submit`` idempotent per
    ``idempotency_key`` where the backend can (Ray refuses a second submission id), and never
    raise from ``status`` for a job they no longer know (answer ``JobState.LOST``)."""

    def submit(self, job: JobSpec, idempotency_key: str) -> JobHandle:
        """Start the job; return at once."""
        ...

    def status(self, handle: JobHandle) -> JobStatus:
        """The job's state now (cheap: the poller calls it with backoff)."""
        ...

    def logs(self, handle: JobHandle, tail: int = 40) -> str:
        """The last ``tail`` lines the job printed."""
        ...

    def cancel(self, handle: JobHandle) -> None:
        """Stop the job and whatever it started; a job already ended is left alone."""
        ...


_registry: dict[str, RemoteBackend] = {}
_registry_lock = threading.Lock()


def register_backend(name: str, backend: RemoteBackend) -> None:
    """Make ``backend`` available as ``with_options(remote=name)``."""
    if not isinstance(backend, RemoteBackend):
        raise TypeError(f"{backend!r} lacks submit/status/logs/cancel")
    with _registry_lock:
        _registry[name] = backend


def backend_names() -> list[str]:
    _builtin()
    with _registry_lock:
        return sorted(_registry)


def get_backend(name: str, step_id: str | None = None) -> RemoteBackend:
    """The backend registered as ``name``; an error naming the step, the field and the fix."""
    _builtin()
    with _registry_lock:
        found = _registry.get(name)
    if found is None:
        raise InvalidStepError(
            f"remote={name!r} names no registered backend (known: {', '.join(backend_names())})",
            "use remote='local' or 'ray', or register_backend(name, backend) before lowering",
            step_id,
        )
    return found


def _builtin() -> None:
    """The built-in backends, registered on first use (Ray's client is imported only by it)."""
    with _registry_lock:
        if "local" in _registry:
            return
    from marin.execution.pipeline.remote.local import LocalBackend
    from marin.execution.pipeline.remote.ray import RayBackend

    with _registry_lock:
        _registry.setdefault("local", LocalBackend())
        _registry.setdefault("ray", RayBackend())
