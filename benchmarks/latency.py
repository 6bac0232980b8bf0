"""A latency-injecting fsspec file system: ``memory://`` with a fixed delay on every call.

It simulates an object store (``gs://``, ``s3://``: tens of milliseconds per request) without a
network. ``slowmem://x`` is the same data as ``memory://x``, so a pipeline can be built fast on
``memory://`` and then checked through ``slowmem://``. Each public call costs ``LATENCY_S`` once,
even when fsspec implements it through other public calls (``exists`` calls ``info``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

PROTOCOL = "slowmem"


class LatencyFileSystem(MemoryFileSystem):
    protocol = PROTOCOL
    LATENCY_S: ClassVar[float] = 0.020
    calls: ClassVar[int] = 0
    _depth = threading.local()
    _count_lock = threading.Lock()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str):
            path = path.removeprefix(f"{PROTOCOL}://")
        return MemoryFileSystem._strip_protocol(path)

    def _delayed(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            with self._count_lock:
                type(self).calls += 1
            time.sleep(self.LATENCY_S)
        self._depth.n = depth + 1
        try:
            return method(*args, **kwargs)
        finally:
            self._depth.n = depth

    def cat_file(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return self._delayed(super().cat_file, path, *args, **kwargs)

    def pipe_file(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return self._delayed(super().pipe_file, path, *args, **kwargs)

    def info(self, path: Any, **kwargs: Any) -> Any:
        return self._delayed(super().info, path, **kwargs)

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> Any:
        return self._delayed(super().ls, path, detail=detail, **kwargs)

    def exists(self, path: Any, **kwargs: Any) -> bool:
        return bool(self._delayed(super().exists, path, **kwargs))

    def _open(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return self._delayed(super()._open, path, *args, **kwargs)

    def rm_file(self, path: Any) -> Any:
        return self._delayed(super().rm_file, path)

    def rm(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return self._delayed(super().rm, path, *args, **kwargs)

    def makedirs(self, path: Any, exist_ok: bool = False) -> Any:
        return self._delayed(super().makedirs, path, exist_ok=exist_ok)


def register() -> None:
    fsspec.register_implementation(PROTOCOL, LatencyFileSystem, clobber=True)
