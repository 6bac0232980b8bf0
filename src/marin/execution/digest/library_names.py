"""Which library object or module a project module's name holds, and where it was imported from.

A project's name can hold a library function, class or module (``act = F.gelu`` in a branch,
``import numpy as xp`` in a backend module, a star import, a re-export through several modules):
what decides which may be no statement the code digest reads, so ``code.py`` compares the held
object by its module and name. A name a module imports from a library by its own statement
(``from math import floor``) keeps that line instead: the line says which. Only names a module's
top-level statements bind count: an import inside a function resolves only where its module is
loaded (the driver, not an isolated process).
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any

from marin.execution.digest.instance import TYPE_DICT, TYPE_QUALNAME, class_module, is_class, one_of
from marin.execution.digest.source import (
    SourceIndex,
    imported_from,
    is_project_class,
    is_project_module,
    is_project_name,
    module_index,
    module_namespace,
)


def import_chain(
    owner: SourceIndex, imported: tuple[str, str]
) -> Iterator[tuple[SourceIndex, Mapping[str, Any], str]]:
    """The project modules a ``from m import name`` reaches, hop by hop (``layers`` importing
    it from ``ops`` in turn), each with its namespace and the name it binds there."""
    seen = {id(owner)}
    for _ in range(20):  # a cycle of imports ends somewhere
        module = sys.modules.get(imported[0])
        other, scope = module_index(module), module_namespace(module)
        if other is None or scope is None or id(other) in seen:
            return
        seen.add(id(other))
        yield other, scope, imported[1]
        following = imported_from(other, imported[1], scope)
        if following is None:
            return
        imported = following


def bound_at_module_level(index: SourceIndex, name: str, namespace: Mapping[str, Any]) -> bool:
    """Whether a module's own top-level statements bind ``name``: an import inside a function
    resolves only where its module is loaded (the driver, not an isolated process), so what it
    names must not be in a digest the two compare."""
    top_level = (index.sources, index.constants, index.imports, index.relative_imports)
    return any(name in bound for bound in top_level) or (
        imported_from(index, name, namespace) is not None
    )


def set_by_project(index: SourceIndex, name: str, namespace: Mapping[str, Any]) -> bool:
    """Whether a module's top-level statements bind ``name`` other than by importing it from
    a library (``from math import floor``: that line says which): a project module's import,
    a star import, an assignment. Not an import inside a function either: it resolves only
    where its module is loaded (the driver, not an isolated process)."""
    imported = index.imports.get(name)
    if imported is not None and not is_project_name(imported[0]):
        return False
    return bound_at_module_level(index, name, namespace)


def library_modules(
    chain: tuple[str, ...],
    obj: Any,
    rest: tuple[str, ...],
    index: SourceIndex,
    namespace: Mapping[str, Any],
    head: bool,
) -> list[str]:
    """Which library module a project module's name holds along a reference (``import numpy
    as xp`` in ``backend``, read as ``backend.xp.sqrt`` or ``from backend import xp``: red team
    r46-3), by its name: what decides it may be no statement the digest reads. Not a name the
    reading module imports from a library by its own statement (its line says which)."""
    position = len(chain) - len(rest)
    held = _library_module(obj) if head else ""
    if held and chain[0] not in index.modules and set_by_project(index, chain[0], namespace):
        return [f"{chain[0]}=={held}"]
    for attr in rest:
        members = module_namespace(obj) if module_index(obj) is not None else None
        if members is None:
            return []
        obj = members.get(attr)
        position += 1
        if _library_module(obj):
            return [f"{'.'.join(chain[:position])}=={_library_module(obj)}"]
    return []


def _library_module(obj: Any) -> str:
    """``<module numpy>`` for a module that is not the project's; "" for anything else."""
    if not issubclass(type(obj), types.ModuleType) or module_index(obj) is not None:
        return ""
    name = (module_namespace(obj) or {}).get("__name__")
    return f"<module {name}>" if type(name) is str else ""


def library_identity(
    obj: Any, owner: SourceIndex, owner_name: str, namespace: Mapping[str, Any]
) -> str | None:
    """Which library function or class a project module's name holds (``act = F.gelu`` in a
    branch, a star import, a re-export: red team r43), by its module and name: what decides it
    may be no statement the digest reads. None for the project's code (a part of its own) and
    for a name its own module imports from a library (``from math import floor``: its line
    says which)."""
    kind = type(obj)
    named = _c_name(obj)
    if named is not None:
        module, qualname = named
    elif kind is types.FunctionType:
        module, qualname = obj.__module__, obj.__code__.co_qualname
        if is_project_module(module if type(module) is str else "", obj.__code__.co_filename):
            return None
    elif is_class(obj):
        module, qualname = class_module(obj), TYPE_QUALNAME.__get__(obj, type)
        if is_project_class(obj):
            return None
    else:
        return None
    if type(module) is not str or not set_by_project(owner, owner_name, namespace):
        return None
    return f"<library {module}.{qualname}>"


def c_object_text(obj: Any) -> str | None:
    """``<library math.floor>`` for a C function, a ufunc or a C class's method that its own
    module holds under its own name (a registry filled with ``register("floor", math.floor)``:
    red team r44-4), so which one it is compares; None for anything else (a bound method of
    an object, ``random.random``, holds that object's state)."""
    named = _c_name(obj)
    if named is None or type(named[0]) is not str or type(named[1]) is not str:
        return None
    module, qualname = named
    held: Any = module_namespace(sys.modules.get(module))
    if module == "builtins":  # ``print`` once a module replaced it (red team r51-2)
        held = BUILTINS_AT_START
    for part in qualname.split("."):
        if type(held) is dict:
            held = held.get(part)
        elif is_class(held):
            held = TYPE_DICT.__get__(held, type).get(part)
        else:
            return None
    return f"<library {module}.{qualname}>" if held is obj else None


BUILTINS_AT_START = dict(vars(builtins))
"""The builtins as the engine found them (the interpreter's, a notebook's)."""


def _c_name(obj: Any) -> tuple[Any, Any] | None:
    """A C function's, a ufunc's or a C class's method's module and qualified name."""
    kind = type(obj)
    if one_of(kind, _DESCRIPTORS):  # ``str.upper``: its class's and its own name (r44-1)
        owner_class = obj.__objclass__
        return class_module(owner_class), f"{owner_class.__qualname__}.{obj.__name__}"
    if _is_ufunc(obj):  # ``np.floor``
        return "numpy", obj.__name__
    if kind is types.BuiltinFunctionType:
        return obj.__module__, obj.__qualname__
    return None


_DESCRIPTORS = (
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)
"""A C class's methods read from the class (``str.upper``)."""


def _is_ufunc(obj: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(obj) is numpy.ufunc
