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


class _NeedsPath(Exception):
    """Raised by the path-free pass when a value is rejected: redo it, naming the field."""


def to_canonical(value: Any, path: str = "config", step: str | None = None) -> Any:
    """Return a JSON-ready structure for ``value``; ``path`` names the field in errors."""
    # Lowering 100,000 steps canonicalises half a million values, so the first pass does not
    # build a dotted path for every field; only a rejected value pays for a second, naming pass.
    try:
        return _canonical(value, None, step)
    except _NeedsPath:
        return _canonical(value, path, step)


def _canonical(value: Any, path: str | None, step: str | None) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is list or kind is tuple:
        if path is None:
            return [_canonical(item, None, step) for item in value]
        return [_canonical(item, f"{path}[{i}]", step) for i, item in enumerate(value)]
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                if isinstance(key, enum.Enum):
                    key = key.name
                if not isinstance(key, str | int | float | bool):
                    if path is None:
                        raise _NeedsPath
                    raise ConfigError(
                        f"{path} has a key of type {type(key).__name__}",
                        "use string keys in configs",
                        step,
                    )
            text = str(key)
            if text in out:
                if path is None:
                    raise _NeedsPath
                first = next(k for k in value if k is not key and _key_text(k) == text)
                raise ConfigError(
                    f"{path} has keys {first!r} and {key!r}, which both become {text!r}",
                    "use keys that stay distinct as strings; JSON keys are strings",
                    step,
                )
            out[text] = _canonical(item, None if path is None else f"{path}.{key}", step)
        return out
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
        return _canonical(dict(value), path, step)
    if isinstance(value, list | tuple):
        return _canonical(list(value), path, step)
    if isinstance(value, set | frozenset):
        items = [_canonical(item, None if path is None else f"{path}{{}}", step) for item in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: _canonical(
                getattr(value, f.name), None if path is None else f"{path}.{f.name}", step
            )
            for f in dataclasses.fields(value)
        }
        return {"__dataclass__": type(value).__qualname__, **fields}
    if path is None:
        raise _NeedsPath
    raise ConfigError(
        f"{path} holds a {type(value).__module__}.{type(value).__qualname__}, "
        "which has no stable JSON form",
        "pass plain data (str, numbers, lists, dicts, dataclasses, enums, paths) "
        "or a step handle instead",
        step,
    )


def _key_text(key: Any) -> str:
    return key.name if isinstance(key, enum.Enum) and type(key) is not str else str(key)
