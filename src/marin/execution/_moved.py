"""The old module paths of ``marin.execution``, kept importable for one release.

Importing an old name (``marin.execution.storage``) returns the very module at the new one
(``marin.execution.store.location``) and raises a ``DeprecationWarning`` naming both; no file is
left at an old path. An old package's modules follow it (``marin.execution.lease.core``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

MOVED: dict[str, str] = {
    "marin.execution.artifact": "marin.execution.pipeline.artifact",
    "marin.execution.artifact_names": "marin.execution.builder.lineage.names",
    "marin.execution.build": "marin.execution.builder",
    "marin.execution.build.remote_fence": "marin.execution.remote.fence",
    "marin.execution.build.resume": "marin.execution.builder.attempt",
    "marin.execution.canonical": "marin.execution.pipeline.canonical",
    "marin.execution.code_digest": "marin.execution.digest.code",
    "marin.execution.code_drift": "marin.execution.digest.code_drift",
    "marin.execution.code_source": "marin.execution.digest.source",
    "marin.execution.context": "marin.execution.pipeline.context",
    "marin.execution.decide": "marin.execution.plan.decide",
    "marin.execution.drift": "marin.execution.digest.config_drift",
    "marin.execution.executors": "marin.execution.run.executors",
    "marin.execution.fingerprint": "marin.execution.pipeline.fingerprint",
    "marin.execution.graph": "marin.execution.pipeline.graph",
    "marin.execution.inspect": "marin.execution.plan.read",
    "marin.execution.isolated_child": "marin.execution.pipeline.isolated_child",
    "marin.execution.isolation": "marin.execution.pipeline.isolation",
    "marin.execution.lease": "marin.execution.store.lease",
    "marin.execution.lineage": "marin.execution.builder.lineage",
    "marin.execution.lineage_events": "marin.execution.builder.lineage.openlineage",
    "marin.execution.lineage_http": "marin.execution.builder.lineage.http",
    "marin.execution.lineage_model": "marin.execution.builder.lineage.model",
    "marin.execution.lineage_sender": "marin.execution.builder.lineage.sender",
    "marin.execution.options": "marin.execution.plan.options",
    "marin.execution.orchestrate": "marin.execution.run.loop",
    "marin.execution.output_digest": "marin.execution.builder.output_tree",
    "marin.execution.output_value": "marin.execution.digest.output",
    "marin.execution.pipeline.remote": "marin.execution.remote",
    "marin.execution.pipeline.remote.checks": "marin.execution.pipeline.remote_option",
    "marin.execution.pipeline.remote.job_record": "marin.execution.store.step_folder",
    "marin.execution.plan.resume": "marin.execution.plan.resume_verdict",
    "marin.execution.prefix_policy": "marin.execution.store.prefix_policy",
    "marin.execution.provenance": "marin.execution.pipeline.provenance",
    "marin.execution.records": "marin.execution.store.records",
    "marin.execution.report": "marin.execution.run.report",
    "marin.execution.resources": "marin.execution.pipeline.resources",
    "marin.execution.run_api": "marin.execution.run.api",
    "marin.execution.scheduler": "marin.execution.run.scheduler",
    "marin.execution.step_logs": "marin.execution.builder.step_logs",
    "marin.execution.storage": "marin.execution.store.location",
    "marin.execution.storage_probe": "marin.execution.store.probe",
    "marin.execution.targets": "marin.execution.pipeline.targets",
}
"""Old dotted name -> new dotted name."""


def new_name(old: str) -> str | None:
    """Where the module once named ``old`` lives now, or None when it did not move."""
    if old in MOVED:
        return MOVED[old]
    parent, _, leaf = old.rpartition(".")
    moved_parent = new_name(parent) if parent.startswith("marin.execution.") else None
    return f"{moved_parent}.{leaf}" if moved_parent else None


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the import machinery and this module.

    ``warnings`` itself skips the frames of ``importlib._bootstrap`` when it counts, so those
    are not counted here either."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and (
        "importlib" in frame.f_code.co_filename or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back
        name = frame.f_code.co_filename
        level += 0 if "importlib" in name and "_bootstrap" in name else 1
    return level


class _Alias:
    """Loads an old name as the module at its new one: the same object, never a copy. (A
    loader and a finder by protocol: ``importlib.abc`` costs every process ~10 ms to import.)"""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; import it from there (the old path goes in "
            "the next release)",
            DeprecationWarning,
            stacklevel=_caller_level(),
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the alias's spec on the module: give it back its own
        module.__spec__ = self.spec


class _MovedFinder:
    """Finds old names only; every other import goes on to the usual finders."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname) if fullname.startswith("marin.execution.") else None
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, cast("Loader", _Alias(new)))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finder, which would
    otherwise load an old package's module a second time from its new folder."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
