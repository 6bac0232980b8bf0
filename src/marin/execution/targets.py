"""Loading a pipeline named on the command line (or in a DAG file, or a Prefect deployment).

A target is ``path/to/file.py:attr`` or ``package.module:attr``; ``attr`` is a handle, a list of
handles, or a zero-argument function returning either.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any

from marin.execution.errors import TargetError
from marin.execution.lazy import ArtifactStep
from marin.execution.step_spec import StepSpec

_FIX = "use path/to/file.py:attr or package.module:attr, e.g. examples/ngram.py:pipeline"


def _import_file(path: str) -> Any:
    if not os.path.isfile(path):
        raise TargetError(f"no file {path}", _FIX)
    abspath = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(abspath))[0]
    module_name = f"marin_target_{stem}"
    loaded = sys.modules.get(module_name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "")) == abspath:
        return loaded
    spec = importlib.util.spec_from_file_location(module_name, abspath)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path}", _FIX)
    module = importlib.util.module_from_spec(spec)
    # Registered before executing, so dataclasses and pickling inside the file can find it.
    sys.modules[module_name] = module
    parent = os.path.dirname(abspath)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[module_name]
        raise
    return module


def _check_callable_without_arguments(value: Any, target: str) -> None:
    """A target function is called with no arguments to get its handles; say so if it needs some."""
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    required = [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise TargetError(
            f"{target} is a function that needs arguments ({', '.join(required)}); a target "
            "function is called with no arguments to get the pipeline's handles",
            "point the target at the handles (e.g. examples/ngram.py:pipeline), or at a "
            "zero-argument function that builds and returns them",
        )


def load_target(target: str) -> list[ArtifactStep | StepSpec]:
    if ":" not in target:
        raise TargetError(f"target {target!r} has no ':attr'", _FIX)
    location, attr = target.rsplit(":", 1)
    if not location or not attr:
        raise TargetError(f"target {target!r} is incomplete", _FIX)
    if location.endswith(".py") or os.sep in location:
        module = _import_file(location)
    else:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as exc:
            raise TargetError(f"cannot import module {location!r} ({exc})", _FIX) from None
    value: Any = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise TargetError(f"{location} has no attribute {attr!r}", _FIX)
        value = getattr(value, part)
    if callable(value) and not isinstance(value, ArtifactStep | StepSpec):
        _check_callable_without_arguments(value, target)
        value = value()
    items = list(value) if isinstance(value, list | tuple) else [value]
    if not items or not all(isinstance(item, ArtifactStep | StepSpec) for item in items):
        raise TargetError(
            f"{target} is a {type(value).__name__}, not a step handle or a list of handles",
            "point the target at an ArtifactStep, a list of them, or a function returning them",
        )
    return items
