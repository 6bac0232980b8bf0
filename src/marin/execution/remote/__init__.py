"""Remote steps: ``with_options(remote="local")`` runs a step's ``fn`` as a durable job.

See docs/remote.md. The public surface: the backend protocol and its registry, each imported on
first use: a ``local`` job's launcher (``python -m marin.execution.remote.local_job``) imports
this package first, and it needs none of them (the registry alone costs it a quarter second
per job).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marin.execution.remote.protocol import JobHandle, JobSpec, JobStatus, RemoteBackend
    from marin.execution.remote.registry import backend_names, get_backend, register_backend

_PUBLIC = {
    **dict.fromkeys(("JobHandle", "JobSpec", "JobStatus", "RemoteBackend"), "protocol"),
    **dict.fromkeys(("backend_names", "get_backend", "register_backend"), "registry"),
}
"""Each public name -> the module of this package it comes from."""

__all__ = [
    "JobHandle",
    "JobSpec",
    "JobStatus",
    "RemoteBackend",
    "backend_names",
    "get_backend",
    "register_backend",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
