"""``jax.distributed.initialize()`` with no arguments, in a rank of a gang step.

JAX reads ``JAX_COORDINATOR_ADDRESS`` from the environment, but the number of processes and
this process's id only from a cluster it detects (Slurm, Open MPI, Kubernetes, a TPU VM).
A gang's ranks have all three in their environment (``JAX_COORDINATOR_ADDRESS``,
``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), so a rank registers one more cluster, ``marin``,
checked first, through JAX's documented plug-in point ("``ClusterEnv`` subclasses are
automatically detected when imported"). It is registered when ``fn`` imports ``jax`` (an import
hook), never before: a rank that does not use JAX never pays for importing it. A JAX without
that plug-in point leaves ``initialize`` as it is (pass the three values yourself).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger("marin")
_NEEDED = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def register_cluster() -> None:
    """Make the gang's environment a cluster JAX detects, first (``jax`` is imported)."""
    try:
        from jax._src.clusters import ClusterEnv
    except ImportError as exc:
        log.debug("no JAX cluster plug-in point: %s", exc)
        return

    class MarinGang(ClusterEnv):
        name = "marin"

        @classmethod
        def is_env_present(cls) -> bool:
            return all(os.environ.get(key) for key in _NEEDED)

        @classmethod
        def get_coordinator_address(
            cls, timeout_secs: int | None, override_coordinator_port: str | None
        ) -> str:
            return os.environ["JAX_COORDINATOR_ADDRESS"]

        @classmethod
        def get_process_count(cls) -> int:
            return int(os.environ["JAX_NUM_PROCESSES"])

        @classmethod
        def get_process_id(cls) -> int:
            return int(os.environ["JAX_PROCESS_ID"])

        @classmethod
        def get_local_process_id(cls) -> int | None:
            return None  # every device this rank sees is its own (CUDA_VISIBLE_DEVICES)

    types: list[Any] = ClusterEnv._cluster_types
    types.remove(MarinGang)
    types.insert(0, MarinGang)  # before Slurm and MPI: the gang is what this process is in


class _AfterJax(importlib.abc.MetaPathFinder):
    """Registers the cluster once ``jax`` has been imported, whoever imports it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "jax":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("jax")
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None:
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            register_cluster()

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """In a gang's rank: register the cluster when ``jax`` is imported (or now, if it is)."""
    if not all(os.environ.get(key) for key in _NEEDED):
        return
    if "jax" in sys.modules:
        register_cluster()
    else:
        sys.meta_path.insert(0, _AfterJax())
