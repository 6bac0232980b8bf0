"""Canonical JSON: one byte string per config, so that equal configs hash equally.

Only values with an unambiguous, address-free meaning are accepted. A lambda, an open file or any
object whose ``repr`` holds a memory address would make the fingerprint depend on the process, so
it is rejected with the dotted path of the field that holds it.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import pathlib
from typing import Any

from marin.execution.errors import ConfigError

_SCALARS = (str, int, bool, type(None))


def to_canonical(value: Any, path: str = "config", step: str | None = None) -> Any:
    """Return a JSON-ready structure for ``value``; ``path`` names the field in errors."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__qualname__}.{value.name}"}
    if isinstance(value, pathlib.PurePath):
        return value.as_posix()
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if isinstance(key, enum.Enum):
                key = key.name
            if not isinstance(key, str | int | float | bool):
                raise ConfigError(
                    f"{path} has a key of type {type(key).__name__}",
                    "use string keys in configs",
                    step,
                )
            out[str(key)] = to_canonical(item, f"{path}.{key}", step)
        return out
    if isinstance(value, list | tuple):
        return [to_canonical(item, f"{path}[{i}]", step) for i, item in enumerate(value)]
    if isinstance(value, set | frozenset):
        items = [to_canonical(item, f"{path}{{}}", step) for item in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: to_canonical(getattr(value, f.name), f"{path}.{f.name}", step)
            for f in dataclasses.fields(value)
        }
        return {"__dataclass__": type(value).__qualname__, **fields}
    raise ConfigError(
        f"{path} holds a {type(value).__module__}.{type(value).__qualname__}, "
        "which has no stable JSON form",
        "pass plain data (str, numbers, lists, dicts, dataclasses, enums, paths) "
        "or a step handle instead",
        step,
    )


def canonical_json(value: Any, path: str = "config", step: str | None = None) -> str:
    return json.dumps(
        to_canonical(value, path, step),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
