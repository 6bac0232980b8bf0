"""Values of the standard library's and numpy's types, as the code digest reads them by value.

A module-level registry, an object's field, a class attribute or a function's default that a
step reads is compared by its value at lowering (docs/caching.md). Plain data was, but a
numpy number, a ``Path`` or a ``date`` among it made the whole value unreadable, and it
dropped out of the digest (red team r36-2). These types are read here by their exact type
(a subclass is not: its methods are user code), through the C-level or standard library code
that gives their value; a value none of them reads is unseen (``code.py``), never unchanged.
"""

from __future__ import annotations

import array
import collections
import datetime
import decimal
import fractions
import hashlib
import pathlib
import struct
import sys
import types
import uuid
from collections.abc import Callable
from typing import Any

from marin.execution.digest.instance import TYPE_MODULE, TYPE_QUALNAME, instance_fields

Render = Callable[[Any], "str | None"]
"""Reads a value held inside another (a slice's bounds, a container's items) by the digest's
own rule; None when it cannot."""

_BY_REPR: tuple[type, ...] = (
    decimal.Decimal,
    fractions.Fraction,
    datetime.date,
    datetime.timedelta,
    datetime.timezone,
    range,
    bytearray,
    uuid.UUID,
    pathlib.PurePosixPath,
    pathlib.PureWindowsPath,
    pathlib.PosixPath,
    pathlib.WindowsPath,
)
"""Read by their ``repr``, which the standard library writes from the value alone."""
_WITH_ZONE: tuple[type, ...] = (datetime.datetime, datetime.time)
"""Read by their ``repr`` when their zone is none or a fixed offset (a user's ``tzinfo`` has
a ``__repr__`` of its own)."""
LIBRARY_CONTAINERS: tuple[type, ...] = (
    collections.deque,
    collections.defaultdict,
    collections.OrderedDict,
    collections.Counter,
)
"""The standard library's containers, read by their exact type (C code, or dict's own)."""
_MAPPINGS: tuple[type, ...] = (
    array.array,
    collections.ChainMap,
    collections.UserDict,
    collections.UserList,
)
"""Containers a function may fill at import as it fills a list (red team r49-2): an array by
its type code and bytes, the others by the maps or the data they keep."""
_MAX_ARRAY_BYTES = 64 << 20
"""A larger array is not hashed while planning: unseen."""


def read_by_value(kind: Any) -> bool:
    """Whether ``kind`` is a class whose instances (exactly) ``library_text`` reads: a module-level
    one is data, not an object whose class is code."""
    if not isinstance(kind, type):
        return False
    if any(
        kind is k
        for k in (
            *_BY_REPR,
            *_WITH_ZONE,
            *LIBRARY_CONTAINERS,
            *_MAPPINGS,
            slice,
            types.SimpleNamespace,
        )
    ):
        return True
    numpy, module = sys.modules.get("numpy"), TYPE_MODULE.__get__(kind, type)
    return numpy is not None and type(module) is str and module == "numpy"


def library_text(value: Any, render: Render) -> str | None:
    """The canonical text of ``value`` when it is of one of the types above, numpy's, a
    library container or a subclass of ``str``, ``int`` or ``float`` keeping no state of its
    own; None otherwise (or when a part of it cannot be read)."""
    kind = type(value)
    if any(kind is k for k in _BY_REPR):
        return f"<{kind.__name__} {value!r}>"
    if any(kind is k for k in _WITH_ZONE):
        zone = value.tzinfo
        return (
            f"<{kind.__name__} {value!r}>"
            if zone is None or type(zone) is datetime.timezone
            else None
        )
    if kind is slice:
        bounds = [render(value.start), render(value.stop), render(value.step)]
        return None if None in bounds else f"<slice {','.join(bounds)}>"  # type: ignore[arg-type]
    if any(kind is k for k in LIBRARY_CONTAINERS):
        return _container_text(value, kind, render)
    if kind is types.SimpleNamespace:
        return _items_text("namespace", list(vars(value).items()), render)
    if any(kind is k for k in _MAPPINGS):
        return _mapping_text(value, kind, render)
    numpy = _numpy_text(value, kind)
    if numpy is not None:
        return numpy
    return _text_subclass(value, kind)


def _container_text(value: Any, kind: type, render: Render) -> str | None:
    if kind is collections.deque:
        items = render(list(value))
        maxlen = render(value.maxlen)
        return None if items is None or maxlen is None else f"<deque {items} {maxlen}>"
    text = _items_text(kind.__name__, list(dict.items(value)), render)
    if kind is collections.defaultdict and text is not None:
        factory = render(value.default_factory)  # it runs on a missing key: code read by name
        return None if factory is None else f"{text}<factory {factory}>"
    return text


def _mapping_text(value: Any, kind: type, render: Render) -> str | None:
    if kind is array.array:
        size = value.buffer_info()[1] * value.itemsize
        if size > _MAX_ARRAY_BYTES:
            return None
        return f"<array {value.typecode} {hashlib.sha256(value.tobytes()).hexdigest()}>"
    held = render(value.maps if kind is collections.ChainMap else value.data)
    return None if held is None else f"<{kind.__name__} {held}>"


def _items_text(name: str, items: list[tuple[Any, Any]], render: Render) -> str | None:
    texts = []
    for key, item in items:
        pair = (render(key), render(item))
        if None in pair:
            return None
        texts.append(f"{pair[0]}:{pair[1]}")
    return f"<{name} {','.join(texts)}>"


def _numpy_text(value: Any, kind: type) -> str | None:
    """A numpy scalar or array of a numpy type (not a subclass); an array of objects is not
    read (its bytes are addresses)."""
    numpy, module = sys.modules.get("numpy"), TYPE_MODULE.__get__(kind, type)
    if numpy is None or type(module) is not str or module != "numpy":
        return None
    if issubclass(kind, numpy.generic) and not value.dtype.hasobject:  # by its bytes: -0.0, a NaN's
        return f"<numpy {kind.__name__} {value.dtype.str} {value.tobytes().hex()}>"
    if kind is numpy.ndarray and not value.dtype.hasobject and value.nbytes <= _MAX_ARRAY_BYTES:
        digest = hashlib.sha256(numpy.ascontiguousarray(value).tobytes()).hexdigest()
        flags = value.flags  # its memory order and whether it can be written (red team r37-3)
        layout = ("F" if flags.f_contiguous and not flags.c_contiguous else "C") + (
            "w" if flags.writeable else "r"
        )
        return f"<ndarray {value.dtype.str} {value.shape} {layout} {digest}>"
    return None


_QUIET_NAN = struct.pack("<d", float("nan"))


def float_text(value: float) -> str:
    """``repr(value)``, but a NaN other than the usual quiet one by its bits: its sign and
    payload reach what ``fn`` writes (red team r37-4). Read from the value alone."""
    if value == value:
        return repr(value)
    bits = struct.pack("<d", value)
    return "nan" if bits == _QUIET_NAN else f"nan:{bits[::-1].hex()}"


def _text_subclass(value: Any, kind: type) -> str | None:
    """A subclass of ``str``, ``int`` or ``float`` keeping no state (``class Name(str)``): its
    class's name and the value it holds, read by the base type's own method."""
    for base, read in ((str, str.__str__), (int, int.__int__), (float, float.__float__)):
        if issubclass(kind, base) and kind is not base:
            fields, hidden = instance_fields(value)
            if fields or hidden:
                return None  # state of its own: not the value alone
            return f"<{TYPE_QUALNAME.__get__(kind, type)} {read(value)!r}>"
    return None
