"""A canonical text of a value the code digest reads by value, read without running user code.

Plain data (exact builtin types and containers of them, a dict in its key order, a set sorted),
functions and classes by their qualified names, partials of plain arguments, enum members,
named tuples and dataclass instances of plain fields, and the standard library's and numpy's
values (``library_values``), a C function by its module and name (``library_names``). Only
exact types and C-level slots are read: no ``__eq__``, ``__repr__`` or property of the user's
runs. What cannot be read is None, or, with ``holes``, a hole named by its type.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from typing import Any

from marin.execution.digest.instance import (
    PARTIAL_FUNC,
    TYPE_QUALNAME,
    carries,
    instance_fields,
    is_class,
    one_of,
    static_attr,
)
from marin.execution.digest.library_names import c_object_text
from marin.execution.digest.library_values import float_text, library_text
from marin.execution.digest.source import is_project_class, module_namespace

_ABSENT = object()
_PARTIAL_ARGS = functools.partial.__dict__["args"]
_PARTIAL_KEYWORDS = functools.partial.__dict__["keywords"]
CONTAINERS = (dict, list, tuple, set, frozenset)
"""The builtin containers read item by item."""
PLAIN = (str, int, float, bool, type(None), bytes, complex)
"""The builtin scalars read by ``repr`` (a float by ``float_text``: a NaN's sign too)."""


def plain_text(
    value: Any, budget: list[int], depth: int, holes: list[str] | None = None
) -> str | None:
    """A canonical text of plain data (exact builtin types, containers of them, a dict's keys in
    their order, the standard library's and numpy's values: ``library_values``), functions and
    classes (by qualified name), modules and partials of plain arguments; None for anything
    else, or past 100,000 items or 50 levels. Reads only exact types: no user code runs.
    With ``holes``, a value it cannot read is a hole, not a reason to give up: an instance of
    the project, a partial or a bound method (its state is a part of its own: ``_in_container``)
    and any other, whose type is added to ``holes`` (not compared)."""
    kind = type(value)
    budget[0] -= 1
    if budget[0] < 0 or depth > 50:
        return None
    if one_of(kind, PLAIN):
        return float_text(value) if kind is float else repr(value)
    if issubclass(kind, types.ModuleType):
        name = (module_namespace(value) or {}).get("__name__")
        return f"<module {name if type(name) is str else '?'}>"
    if issubclass(kind, functools.partial):
        func = plain_text(PARTIAL_FUNC.__get__(value, kind), budget, depth + 1, holes)
        args = plain_text(_PARTIAL_ARGS.__get__(value, kind), budget, depth + 1, holes)
        keywords = plain_text(_PARTIAL_KEYWORDS.__get__(value, kind), budget, depth + 1, holes)
        ok = None not in (func, args, keywords)
        return f"<partial {func} {args} {keywords}>" if ok else _hole(value, holes)
    if type(value) is types.FunctionType:  # by name only: the module a runner imports a file
        return f"<code {value.__code__.co_qualname}>"  # as may differ (a part of its own)
    if is_class(value):
        return f"<code {TYPE_QUALNAME.__get__(value, type)}>"
    if issubclass(kind, enum.Enum):  # ``REGISTRY[Size.S] = 0.1``: by name (red team r35-1)
        name = object.__getattribute__(value, "_name_")
        return f"<enum {kind.__qualname__}.{name}>" if type(name) is str else None
    if issubclass(kind, tuple) and kind is not tuple:  # a named tuple's fields (red team r37-5)
        text = _namedtuple_text(value, budget, depth, holes)
        if text is not None:
            return text
    if dataclasses.is_dataclass(kind) and "__dataclass_fields__" in kind.__dict__:
        text = _dataclass_text(value, budget, depth, holes)
        return _hole(value, holes) if text is None else text
    if one_of(kind, CONTAINERS):
        items = [*value.items()] if kind is dict else [*value]
        texts = [plain_text(item, budget, depth + 1, holes) for item in items]
        if None in texts:
            return None
        # A dict in its key order (code iterates it: ``for layer in LAYERS``); a set sorted
        # (its order is the hash seed's, another in every process).
        ordered = sorted(texts) if kind is set or kind is frozenset else texts  # type: ignore[type-var]
        return f"{kind.__name__}[{','.join(ordered)}]"  # type: ignore[arg-type]
    text = library_text(value, lambda inner: plain_text(inner, budget, depth + 1, holes))
    text = c_object_text(value) if text is None else text
    return _hole(value, holes) if text is None else text


def _hole(value: Any, holes: list[str] | None) -> str | None:
    """``value``'s place in a text with ``holes`` (None without): a project instance, a partial
    or a bound method, whose state ``_in_container`` makes a part of its own, is held; any
    other value is not read, and its type is added to ``holes``."""
    if holes is None:
        return None
    kind = type(value)
    what = TYPE_QUALNAME.__get__(kind, type)
    if carries(value) or is_project_class(kind):
        return f"<held {what}>"
    holes.append(what)
    return f"<unread {what}>"


def _dataclass_text(
    value: Any, budget: list[int], depth: int, holes: list[str] | None
) -> str | None:
    """A dataclass instance of plain fields (a registry's key ``Spec("s", 1)``), read from its
    ``__dict__`` without running its code; None when a field is not plain or not there."""
    kind = type(value)
    try:
        held = object.__getattribute__(value, "__dict__")
    except AttributeError:  # a slotted dataclass
        return None
    fields = kind.__dict__["__dataclass_fields__"]
    if type(held) is not dict or not held.keys() <= fields.keys():
        return None  # state beyond its fields (``__post_init__``'s): not plain
    texts = []
    for name in fields:
        text = plain_text(held.get(name, _ABSENT), budget, depth + 1, holes)
        if text is None:
            return None
        texts.append(f"{name}={text}")
    return f"<{kind.__qualname__} {','.join(texts)}>"


def _namedtuple_text(
    value: Any, budget: list[int], depth: int, holes: list[str] | None
) -> str | None:
    """A named tuple holding its fields alone, by their names and values (read through
    ``tuple``'s own iterator); None for any other tuple subclass."""
    kind = type(value)
    fields = static_attr(kind, "_fields", None)
    if type(fields) is not tuple or not all(type(name) is str for name in fields):
        return None
    state, hidden = instance_fields(value)
    items = [*tuple.__iter__(value)]
    if state or hidden or len(items) != len(fields):
        return None
    texts = [plain_text(item, budget, depth + 1, holes) for item in items]
    if None in texts:
        return None
    named = ",".join(f"{name}={text}" for name, text in zip(fields, texts, strict=True))
    return f"<{TYPE_QUALNAME.__get__(kind, type)} {named}>"
