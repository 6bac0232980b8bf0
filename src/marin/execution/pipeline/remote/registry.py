"""Remote backends by name: ``local`` and ``ray`` built in, users add their own."""

from __future__ import annotations

import threading

from marin.execution.errors import InvalidStepError
from marin.execution.pipeline.remote.local import LocalBackend
from marin.execution.pipeline.remote.protocol import RemoteBackend
from marin.execution.pipeline.remote.ray import RayBackend

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
    """The built-in backends, registered on first use (Ray's client is imported only when a
    Ray job is submitted or asked about)."""
    with _registry_lock:
        _registry.setdefault("local", LocalBackend())
        _registry.setdefault("ray", RayBackend())
