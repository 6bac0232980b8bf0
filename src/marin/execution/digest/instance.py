"""The objects a step function carries and their fields, read without running user code.

A bound method (``Trainer(103).train``), a callable instance (``Trainer(103)``) or a
``functools.partial`` over either carries an object whose values decide the output as a
closure's cells do. ``code.py`` digests them by the closure rule (docs/caching.md): a field of
plain data by value, any other value unseen. Reading them never calls ``__getstate__``,
``__repr__``, ``__getattr__`` or a property: the instance dict and the slots are read through
the C-level descriptors of their classes, as lowering reads a partial's slots. A bound
classmethod's object is its class: code, followed with its attributes' values (``code.py``).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Any

# The C-level slots read instead of getattr (never user code); code.py reads them too.
TYPE_MODULE = type.__dict__["__module__"]
TYPE_QUALNAME = type.__dict__["__qualname__"]
TYPE_MRO = type.__dict__["__mro__"]
TYPE_DICT = type.__dict__["__dict__"]
_TYPE_DICTOFFSET = type.__dict__["__dictoffset__"]
PARTIAL_FUNC = functools.partial.__dict__["func"]
_PARTIAL_ARGS = functools.partial.__dict__["args"]
_PARTIAL_KEYWORDS = functools.partial.__dict__["keywords"]
_METHOD_SELF = types.MethodType.__dict__["__self__"]
_METHOD_FUNC = types.MethodType.__dict__["__func__"]

_NO_STATE = ("builtins", "functools", "types", "marin", "marin_airflow", "marin_prefect")
"""Modules whose objects carry no user state (the engine's own wrappers, C types)."""


@dataclass(frozen=True, slots=True)
class Wrapper:
    """One layer around a step's callable: a ``functools.partial`` (its bound arguments, by
    position or keyword) or a bound method (``is_method``, its object ``owner``)."""

    arguments: tuple[tuple[int | str, Any], ...] = ()
    owner: Any = None
    is_method: bool = False


def unwrapped(fn: Any) -> tuple[list[Wrapper], Any]:
    """The partials and bound methods around ``fn``, outermost first, and the callable they
    wrap; read through the C-level slots (never user code). Every walk of the layers around a
    step's function is this one."""
    layers: list[Wrapper] = []
    for _ in range(100):  # a cycle of partials ends somewhere
        kind = type(fn)
        if issubclass(kind, functools.partial):
            args = _PARTIAL_ARGS.__get__(fn, kind)
            keywords = _PARTIAL_KEYWORDS.__get__(fn, kind)
            bound: list[tuple[int | str, Any]] = [*enumerate(args if type(args) is tuple else ())]
            bound += [*keywords.items()] if type(keywords) is dict else []
            layers.append(Wrapper(tuple(bound)))
            fn = PARTIAL_FUNC.__get__(fn, kind)
        elif kind is types.MethodType:
            layers.append(Wrapper(owner=_METHOD_SELF.__get__(fn, kind), is_method=True))
            fn = _METHOD_FUNC.__get__(fn, kind)
        else:
            break
    return layers, fn


def bound_objects(fn: Any) -> list[Any]:
    """The objects behind ``fn`` whose fields the step reads: each bound method's ``__self__``
    through any partials (a class, for a bound classmethod), and ``fn`` itself (or what the
    partials wrap) when it is a callable instance; never a function, a module or an object of
    the engine or of a C type."""
    layers, fn = unwrapped(fn)
    owners = [layer.owner for layer in layers if layer.is_method]
    found = [o for o in owners if _has_state(o, issubclass(type(o), type))]
    return found + ([fn] if _has_state(fn) else [])


def _has_state(obj: Any, is_class: bool = False) -> bool:
    """Whether ``obj`` is the user's object (a class too when ``is_class``: a bound
    classmethod's), not a function, a module, the engine's or a C type's."""
    kind = obj if is_class else type(obj)
    if not is_class and issubclass(kind, type | types.ModuleType | types.FunctionType):
        return False
    module = TYPE_MODULE.__get__(kind, type)
    return type(module) is str and module.partition(".")[0] not in _NO_STATE


def instance_fields(obj: Any) -> tuple[dict[str, Any], bool]:
    """``obj``'s attributes: its slots (each class's member descriptors, an unassigned one
    left out) and its instance dict, by name; and whether it has an instance dict that no
    C-level ``__dict__`` descriptor reads (its class replaced ``__dict__`` by a property:
    reading it would run that code). Raises nothing but what a corrupt object would."""
    fields: dict[str, Any] = {}
    members: Any = None
    kind = type(obj)
    for klass in reversed(TYPE_MRO.__get__(kind, type)):
        module = TYPE_MODULE.__get__(klass, type)
        builtin = type(module) is str and module == "builtins"  # a str's ``==`` only
        for name, slot in TYPE_DICT.__get__(klass, type).items():
            if type(slot) is types.MemberDescriptorType and not builtin:  # not the interpreter's
                try:
                    fields[name] = slot.__get__(obj, klass)
                except AttributeError:  # a slot never assigned
                    continue
            elif name == "__dict__" and type(slot) is types.GetSetDescriptorType:
                members = slot.__get__(obj, klass)  # a builtin base's too (an Exception's)
    if type(members) is dict:
        fields.update({str(k): v for k, v in list(members.items())})
    return fields, members is None and _TYPE_DICTOFFSET.__get__(kind, type) != 0


def carried_field(obj: Any, name: str) -> Any:
    """The attribute ``name`` that ``obj`` itself holds (its instance dict or a slot), or None;
    read as ``instance_fields`` reads them: no ``__getattr__``, property or descriptor of the
    user's runs (``functools.lru_cache``'s wrapper keeps ``__wrapped__`` in its instance dict)."""
    for klass in TYPE_MRO.__get__(type(obj), type):
        slot = TYPE_DICT.__get__(klass, type).get(name)
        if type(slot) is types.MemberDescriptorType:
            try:
                return slot.__get__(obj, klass)
            except AttributeError:  # a slot never assigned
                return None
    for klass in TYPE_MRO.__get__(type(obj), type):
        slot = TYPE_DICT.__get__(klass, type).get("__dict__")
        if type(slot) is types.GetSetDescriptorType:
            members = slot.__get__(obj, klass)
            return members.get(name) if type(members) is dict else None
    return None


def is_class(obj: Any) -> bool:
    """Whether ``obj`` is a class (its metaclass's ``__instancecheck__`` does not run)."""
    return issubclass(type(obj), type)


def class_module(cls: type) -> str:
    """The module a class names as its own (``""`` when that is not a string)."""
    value = TYPE_MODULE.__get__(cls, type)
    return value if type(value) is str else ""


def one_of(kind: type, kinds: tuple[type, ...]) -> bool:
    """``kind in kinds`` by identity: ``in`` compares with ``==``, which runs the ``__eq__`` of
    a user's metaclass (a subclass of ``type`` is asked first)."""
    return any(kind is k for k in kinds)


def static_attr(cls: type, attr: str, default: Any) -> Any:
    """``attr`` as the class (or a base) stores it: a descriptor is not called."""
    for klass in TYPE_MRO.__get__(cls, type):
        namespace = TYPE_DICT.__get__(klass, type)
        if attr in namespace:
            return namespace[attr]
    return default


def carries(obj: Any) -> bool:
    """A partial or a bound method: it carries arguments or an object besides its code."""
    kind = type(obj)
    return issubclass(kind, functools.partial) or kind is types.MethodType
