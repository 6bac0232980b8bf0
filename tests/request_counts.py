"""Count, through one entry point, how often the prefix is opened and checked, the graph is
collected, the options are validated and the target is parsed (issue 44: each once)."""

from __future__ import annotations

import functools
import importlib
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import marin.execution.pipeline.graph as graph_module
import marin.execution.store.location as location_module
import marin.execution.store.prefix_policy as policy_module
from marin.execution.pipeline.targets import Target
from marin.execution.plan.options import RunOptions

_IMPORTERS = (
    "marin.catalog",
    "marin.cli",
    "marin.execution.run.api",
    "marin.execution.run.runner",
    "marin.execution.store.probe",
)
"""The modules that import a counted function by name, imported before it is wrapped."""


def count_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Wrap ``open_prefix``, ``check_prefix``, the graph walks (``check_disjoint_outputs``,
    which every collection of a graph ends with, whether by ``collect_steps`` or by lowering),
    ``RunOptions.__post_init__`` and ``Target.parse``, wherever they were imported."""
    counts: Counter[str] = Counter()
    for lazily_imported in _IMPORTERS:  # a module a command imports later is counted too
        importlib.import_module(lazily_imported)

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for module, name, key in (
        (location_module, "open_prefix", "open"),
        (policy_module, "check_prefix", "check"),
        (graph_module, "check_disjoint_outputs", "collect"),
    ):
        original = getattr(module, name)
        wrapper = counted(key, original)
        for loaded in list(sys.modules.values()):  # every module that imported it by name
            if vars(loaded).get(name) is original:
                monkeypatch.setattr(loaded, name, wrapper)
    monkeypatch.setattr(RunOptions, "__post_init__", counted("options", RunOptions.__post_init__))
    parse = Target.parse.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Target, "parse", classmethod(counted("parse", parse)))
    return counts
