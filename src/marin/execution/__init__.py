"""Marin's execution engine.

The front door: ``marin.execution.apply``, ``lower``, ``resolve``, ``OUT``, ``ArtifactStep``,
``StepContext``, ``current_context``, ``StepRunner``, ``StepSpec`` and ``RunOptions``, each
imported on first use (importing this package imports nothing else). ``run`` is not among them:
``marin.execution.run`` names the run layer's package; the function is
``marin.execution.run.api.run``.
"""

from __future__ import annotations

import importlib
from typing import Any

_FRONT_DOOR = {
    **dict.fromkeys(
        (
            "OUT",
            "ArtifactStep",
            "StepContext",
            "apply",
            "current_context",
            "lower",
            "materialized_config",
            "register_fingerprint",
            "resolve",
        ),
        "marin.execution.lazy",
    ),
    "StepRunner": "marin.execution.step_runner",
    "StepSpec": "marin.execution.step_spec",
    "RunOptions": "marin.execution.plan.options",
}
"""Each public name -> the module it comes from (Marin's public modules, and the options)."""

__all__ = sorted(_FRONT_DOOR)


def __getattr__(name: str) -> Any:
    """A front-door name, imported from its module on first use."""
    module = _FRONT_DOOR.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FRONT_DOOR))


from marin.execution import _moved  # noqa: E402  old paths, for one release

_moved.install()
