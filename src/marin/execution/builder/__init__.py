"""The build layer: the one commit path, the output tree walk, step logs, lineage."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_SUBMODULES = ("commit", "lineage", "output_tree", "step_logs")
_TO = __name__ + ".commit"


def __getattr__(name: str) -> Any:
    """This package's name was a module's (now ``_TO``): that module's attributes, for one
    release, with a ``DeprecationWarning``."""
    if name.startswith("__") or name in _SUBMODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} moved to {_TO}.{name}; import it from there",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(_TO), name)
