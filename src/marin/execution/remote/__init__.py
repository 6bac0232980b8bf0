"""Remote steps: ``with_options(remote="local")`` runs a step's ``fn`` as a durable job.

See docs/remote.md. The public surface: the backend protocol and its registry.
"""

from marin.execution.remote.protocol import (
    JobHandle,
    JobSpec,
    JobStatus,
    RemoteBackend,
)
from marin.execution.remote.registry import backend_names, get_backend, register_backend

__all__ = [
    "JobHandle",
    "JobSpec",
    "JobStatus",
    "RemoteBackend",
    "backend_names",
    "get_backend",
    "register_backend",
]
