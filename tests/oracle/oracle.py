"""The oracle: what a clean build of a pipeline state makes, built from scratch.

For a :class:`PipelineModel` it writes the pipeline file without what is placement, not
identity (``remote``, ``resumable``, ``scope``; docs/remote.md and docs/marin.md say none of
them changes what is built), imports it, and calls each step's ``fn`` in order on empty
folders, each with its inputs' folders: a clean build that trusts nothing of the engine (no
record, no cache, no skip). It keeps each step's output tree and returned value (as canonical
JSON, the record's form). Memoised per content key (the graph, each ``k``, key and ``REV``) for
the whole process. ``tests/oracle/test_histories.py`` checks once that it equals what ``marin run``
builds on an empty prefix.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from tests.oracle.pipeline import (
    FEED,
    NAME_PREFIX,
    Adoption,
    PipelineModel,
    config,
    feed_config,
    render,
    source_digest,
    user_data_files,
    write_files,
)

_ENV_SCRUBBED = ("ORACLE_CONTROL", "ORACLE_COUNTER", "ORACLE_RUN", "MARIN_USER")


@dataclass(frozen=True)
class Expected:
    """A step's clean build: its output tree (relative path -> sha256; folders) and value."""

    files: tuple[tuple[str, str], ...]
    folders: tuple[str, ...]
    result: str
    """The returned value as canonical JSON."""
    adopted: str = ""
    """An adopted step: how its record's ``source`` ends (its bytes are its data's, where
    they lie: its readers are compared instead)."""

    def describe(self) -> str:
        return f"files={dict(self.files)} result={self.result}"


def read_tree(root: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Every file below ``root`` with its content's sha256, and every folder (relative)."""
    files: list[tuple[str, str]] = []
    folders: list[str] = []
    if not os.path.isdir(root):
        return (), ()
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for d in dirs:
            folders.append(os.path.relpath(os.path.join(folder, d), root))
        for name in sorted(names):
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                files.append((os.path.relpath(path, root), hashlib.sha256(f.read()).hexdigest()))
    return tuple(sorted(files)), tuple(sorted(folders))


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def scratch() -> str | None:
    """Where sandboxes go: RAM (``/dev/shm``) when there is one, as a history makes and deletes
    thousands of small folders (on this machine's disk a folder's removal takes milliseconds);
    ``$MARIN_ORACLE_TMP`` wins."""
    chosen = os.environ.get("MARIN_ORACLE_TMP")
    if chosen:
        return chosen
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Oracle:
    """Clean builds, memoised; one per process (``ORACLE``)."""

    def __init__(self) -> None:
        self._root = tempfile.mkdtemp(prefix="marin-oracle-", dir=scratch())
        atexit.register(shutil.rmtree, self._root, True)
        self._memo: dict[Any, dict[int, Expected]] = {}
        self._lock = threading.Lock()
        self.builds = 0

    def expected(self, model: PipelineModel) -> dict[int, Expected]:
        """Each step's clean build (by step index) for ``model``'s current state."""
        key = model.content_key()
        with self._lock:
            if key not in self._memo:
                self._memo[key] = self._build(model)
                self.builds += 1
            return self._memo[key]

    def _build(self, model: PipelineModel) -> dict[int, Expected]:
        """Import the file, then call each step's ``fn`` in order, as a clean build does:
        its own empty output folder, its inputs' output folders, the value it returns."""
        import importlib.util

        from marin.execution.pipeline.context import StepContext, bound_context

        text = render(model, placement=False)
        stem = f"oracle_{source_digest(text)}_{self.builds}"
        path = os.path.join(self._root, f"{stem}.py")
        with open(path, "w") as f:
            f.write(text)
        spec = importlib.util.spec_from_file_location(stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        root = os.path.join(self._root, stem)
        out: dict[int, Expected] = {}
        data = {s.idx: os.path.join(root, s.short) for s in model.steps}
        saved = {k: os.environ.pop(k) for k in _ENV_SCRUBBED if k in os.environ}
        try:
            for s in model.steps:  # inputs come first
                where = os.path.join(root, s.short)
                if model.adopted(s.idx):
                    assert model.adoption is not None
                    data[s.idx], out[s.idx] = _adopted(module, root, model.adoption)
                    continue
                ctx = StepContext(output_path=where, prefix=root, region=None)
                with bound_context(ctx):
                    value = getattr(module, f"f_{s.short}")(
                        out=where, cfg=config(s, note=0), ins=[data[d] for d in s.deps]
                    )
                files, folders = read_tree(where)
                out[s.idx] = Expected(files, folders, canonical(value))
        finally:
            os.environ.update(saved)
        shutil.rmtree(root, ignore_errors=True)
        os.remove(path)
        return out


def _adopted(module: Any, root: str, a: Adoption) -> tuple[str, Expected]:
    """Where a clean build's adopted data lies, and the adoption's :class:`Expected`: the
    user's data as the history wrote it last, or the feeder's clean build (the part adopted)."""
    from marin.execution.pipeline.context import StepContext, bound_context

    if a.user_data:
        where = os.path.join(root, f"s{a.step}")
        write_files(where, user_data_files(a.step, a.data_rev))
        tail = f"outside/s{a.step}" if a.shape == "outside" else f"{NAME_PREFIX}/s{a.step}/v1"
        return where, Expected((), (), "null", adopted=tail)
    feed = os.path.join(root, "feed")
    with bound_context(StepContext(output_path=feed, prefix=root, region=None)):
        module.f_feed(out=feed, cfg=feed_config(a.feed_k), ins=[])
    return feed + a.sub, Expected((), (), "null", adopted=f"{FEED}/v1{a.sub}")


ORACLE = Oracle()
