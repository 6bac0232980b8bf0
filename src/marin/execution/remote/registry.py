"""Remote backends by name: ``local`` and ``ray`` built in, users add their own. The names a step
may give are the model's (``pipeline/remote_option.py``); the objects behind them live here."""

from __future__ import annotations

import threading

from marin.execution.pipeline.remote_option import allow_backend, backend_names, check_backend
from marin.execution.remote.local import LocalBackend
from marin.execution.remote.protocol import RemoteBackend
from marin.execution.remote.ray import RayBackend

__all__ = ["backend_names", "get_backend", "register_backend"]

_registry: dict[str, RemoteBackend] = {}
_registry_lock = threading.Lock()


def register_backend(name: str, backend: RemoteBackend) -> None:
    """Make ``backend`` available as ``with_options(remote=name)``.

    Raises:
        TypeError: ``backend`` lacks a method of the protocol.
    """
    if not isinstance(backend, RemoteBackend):
        raise TypeError(f"{backend!r} lacks submit/status/logs/cancel")
    with _registry_lock:
        _registry[name] = backend
    allow_backend(name)


def get_backend(name: str, step_id: str | None = None) -> RemoteBackend:
    """The backend registered as ``name`` (the built-in ones made on first use: Ray's client
    is imported only when a Ray job is submitted or asked about).

    Raises:
        InvalidStepError: no backend has that name (naming the step, the field and the fix).
    """
    with _registry_lock:
        _registry.setdefault("local", LocalBackend())
        _registry.setdefault("ray", RayBackend())
        found = _registry.get(name)
    if found is None:
        check_backend(name, step_id)  # raises: the one error of an unknown name
        raise AssertionError(f"{name!r} is allowed but not registered")
    return found
