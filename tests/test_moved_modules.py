"""Every old module path of ``marin.execution`` still imports, for one release (issue 44).

An old name is the very module at its new path, and importing it raises a
``DeprecationWarning``; Marin's three import paths (``lazy``, ``step_runner``, ``step_spec``)
stay real modules and import without one. The aliases come from ``_moved.MOVED``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from marin.execution import _moved

EXECUTION = Path(__file__).resolve().parents[1] / "src" / "marin" / "execution"


def old_names() -> list[tuple[str, str]]:
    """Every old dotted name and its new one, a moved package's modules included."""
    pairs = list(_moved.MOVED.items())
    for old, new in list(pairs):
        folder = EXECUTION.joinpath(*new.split(".")[2:])
        if folder.is_dir():
            pairs += [(f"{old}.{p.stem}", f"{new}.{p.stem}") for p in folder.glob("[!_]*.py")]
    return sorted(pairs)


@pytest.mark.parametrize(("old", "new"), old_names())
def test_an_old_path_is_the_new_module_and_warns(old: str, new: str) -> None:
    sys.modules.pop(old, None)  # an alias entry only: the module itself stays loaded
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}") as caught:
        module = importlib.import_module(old)
    # the warning names the importing line, not the import machinery
    assert __file__ in {w.filename for w in caught if old in str(w.message)}
    assert module is importlib.import_module(new)
    assert module.__spec__ is not None and module.__spec__.name == new  # its own spec back


def test_the_old_build_module_and_package_forward_to_the_builder() -> None:
    """``marin.execution.build`` was a module, then the build layer's package: it is the
    builder package now, and still hands out the old module's names."""
    import marin.execution.builder as builder
    from marin.execution.builder import commit

    sys.modules.pop("marin.execution.build", None)
    with pytest.warns(DeprecationWarning, match="marin.execution.build moved to"):
        build_package = importlib.import_module("marin.execution.build")
    assert build_package is builder
    with pytest.warns(DeprecationWarning, match="build_step moved to"):
        assert build_package.build_step is commit.build_step
    sys.modules.pop("marin.execution.build.lineage", None)
    with pytest.warns(DeprecationWarning, match="build.lineage moved to"):
        lineage = importlib.import_module("marin.execution.build.lineage")
    assert lineage.__name__ == "marin.execution.builder.lineage"


def test_every_flat_module_of_the_old_layout_is_covered() -> None:
    """The table holds each module that left ``execution/`` (nothing moved is forgotten)."""
    moved = {old.rpartition(".")[2] for old in _moved.MOVED}
    assert {"storage", "records", "lease", "lineage", "orchestrate", "inspect"} <= moved
    for old in moved:
        assert not (EXECUTION / f"{old}.py").exists(), f"{old}.py is at its old path"


def test_marin_import_paths_are_real_and_quiet() -> None:
    """In a fresh interpreter: no DeprecationWarning from marin on Marin's paths."""
    code = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from marin.execution.lazy import (
        OUT, ArtifactStep, apply, lower, materialized_config, resolve, run,
    )
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec
    import marin.execution as front
    assert front.resolve is resolve and front.StepRunner is StepRunner
for w in caught:
    if issubclass(w.category, DeprecationWarning) and "marin" in str(w.message):
        print(w.category.__name__, w.message)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


def test_marin_paths_export_the_moved_objects() -> None:
    from marin.execution import lazy, step_runner, step_spec

    new = importlib.import_module
    handles, api = new("marin.execution.pipeline.handles"), new("marin.execution.run.api")
    runner, spec_module = (
        new("marin.execution.run.runner"),
        new("marin.execution.pipeline.step_spec"),
    )
    assert lazy.ArtifactStep is handles.ArtifactStep and lazy.run is api.run
    assert step_runner.StepRunner is runner.StepRunner
    assert step_spec.StepSpec is spec_module.StepSpec
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(lazy)  # a real module: re-imported, not an alias, and quiet
