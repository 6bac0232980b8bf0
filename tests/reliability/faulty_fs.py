"""A latency- and error-injecting wrapper around a real fsspec file system.

``faulty://<path>`` is the local file system at ``<path>`` with faults: each :class:`Rule`
matches operations by name and path pattern, adds latency, and raises ``OSError(EIO)`` either
for its first ``times`` matching calls (a transient fault) or always (``times=None``). Every
injected error is counted, so a test can prove the faults happened.
"""

from __future__ import annotations

import errno
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem


@dataclass
class Rule:
    ops: frozenset[str]
    pattern: str
    times: int | None = 1
    """Fail the first ``times`` matching calls; ``None`` fails every one (a persistent fault)."""
    latency: float = 0.0
    seen: int = 0


@dataclass
class Faults:
    rules: list[Rule] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ops: str, pattern: str, times: int | None = 1, latency: float = 0.0) -> Faults:
        self.rules.append(Rule(frozenset(ops.split()), pattern, times, latency))
        return self

    def check(self, op: str, path: str) -> None:
        delay, fail = 0.0, False
        with self.lock:
            for rule in self.rules:
                if op in rule.ops and re.search(rule.pattern, path):
                    delay = max(delay, rule.latency)
                    rule.seen += 1
                    if rule.times is None or rule.seen <= rule.times:
                        fail = True
            if fail:
                self.injected[op] += 1
        if delay:
            time.sleep(delay)
        if fail:
            raise OSError(errno.EIO, f"injected fault: {op} {path}")

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()
            self.injected.clear()


FAULTS = Faults()


class FaultyFileSystem(AbstractFileSystem):
    protocol = "faulty"
    root_marker = "/"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.target = LocalFileSystem()

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        path = path[len("faulty://") :] if path.startswith("faulty://") else path
        return "/" + path.lstrip("/") if path else "/"

    def _faulty(self, op: str, path: str) -> str:
        path = self._strip_protocol(path)
        FAULTS.check(op, path)
        return path

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kw: Any) -> bytes:
        return self.target.cat_file(self._faulty("cat_file", path), start, end, **kw)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> None:
        path = self._faulty("pipe_file", path)
        self.target.makedirs(self.target._parent(path), exist_ok=True)
        self.target.pipe_file(path, value, mode=mode, **kw)

    def exists(self, path: str, **kw: Any) -> bool:
        return self.target.exists(self._faulty("exists", path))

    def info(self, path: str, **kw: Any) -> dict[str, Any]:
        info = self.target.info(self._faulty("info", path), **kw)
        return {**info, "name": info["name"]}

    def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
        return self.target.ls(self._faulty("ls", path), detail=detail, **kw)

    def rm_file(self, path: str) -> None:
        self.target.rm_file(self._faulty("rm_file", path))

    def rm(self, path: Any, recursive: bool = False, maxdepth: Any = None) -> None:
        self.target.rm(self._faulty("rm", path), recursive=recursive, maxdepth=maxdepth)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.target.makedirs(self._faulty("makedirs", path), exist_ok=exist_ok)

    def mkdir(self, path: str, create_parents: bool = True, **kw: Any) -> None:
        self.target.makedirs(self._faulty("mkdir", path), exist_ok=True)

    def _open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        path = self._faulty("open", path)
        if "w" in mode or "a" in mode or "x" in mode:
            self.target.makedirs(self.target._parent(path), exist_ok=True)
        return self.target._open(path, mode, **kw)


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
