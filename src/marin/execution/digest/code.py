"""The code digest of a step's function: what its code is, reported, never identity.

A step's identity is its config and its dependencies' versions (as in Marin, which removed code
from identity because every code edit forked a new path). The code digest sits beside that: a
hash of the normalised syntax tree of ``fn`` and of every function and class of the same project
it refers to, transitively, stored in each record so that a changed function can be reported
like config drift. It never enters a path or a fingerprint.

- **Normalised**: comments, formatting and line numbers do not count (docstrings do: code reads
  them, as a DSPy signature's instructions or a tool's description); the serialiser
  skips empty fields, so the digest does not move between Python versions that only add fields.
- **Same project** (``source.is_project_module``): not the standard library, not the engine,
  not a package of an installed distribution other than the project's own, loaded from where
  that distribution is installed (a project's ``tools.py`` stays the project's). Installed
  libraries are not followed (their version is the environment's business, not the pipeline's).
- **Advisory**: it never raises, blocks or runs user code (types are read with ``type()``,
  attributes from namespaces, never through ``getattr``: a lazy proxy stays unresolved); a
  part that cannot be digested is unknown, with one warning.
- **Module-level values** a function reads count by their value at lowering when plain data
  (``LIMITS = {...}`` then ``LIMITS["a"] = 5``; a class's own attributes likewise); a name the
  source assigns a computed value counts by the source of those statements (``counts_by_value``).
- **Unknown** is said, never guessed: a builtin, a function made at run time (``exec``, a
  notebook's ``<string>``), a source file edited since it was imported. A step whose own
  function is unknown has no digest; an unknown callee is named in ``CodeDigest.unseen``.

Computed once per function object per process (``code_digest`` caches by the object; a
lowering after a source file was edited starts afresh: ``new_lowering``), so a pipeline of
100,000 steps sharing one ``fn`` parses it once. The fields of the object a bound
method or callable instance carries are a part of its own, read at each call (by the closure
rule: ``instance.py``), so a digest holds their values at lowering. Where the source is and what its
normalised syntax is comes from ``source.py``; a value's text, from ``value_text.py``; which
library object a name holds, from ``library_names.py``; comparing two digests, from
``code_drift.py``.
"""

from __future__ import annotations

import abc
import ast
import builtins
import collections
import contextlib
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import operator
import os
import pkgutil
import re
import runpy
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from marin.execution.digest.instance import (
    TYPE_DICT,
    TYPE_QUALNAME,
    bound_objects,
    carried_field,
    carries,
    class_module,
    instance_fields,
    is_class,
    one_of,
    static_attr,
    unwrapped,
)
from marin.execution.digest.library_names import (
    BUILTINS_AT_START,
    bound_at_module_level,
    c_object_text,
    import_chain,
    library_identity,
    library_modules,
)
from marin.execution.digest.library_values import (
    LIBRARY_CONTAINERS,
    read_by_value,
)
from marin.execution.digest.source import (
    DYNAMIC,
    GLOBALS,
    IMPORT,
    SUBCLASSES,
    VALUE,
    References,
    SourceIndex,
    absolute_module,
    assignment_source,
    bound_earlier,
    clear_source_cache,
    computed_names,
    constant_source,
    counts_by_value,
    display_path,
    dump,
    first_line,
    imported_from,
    is_project_class,
    is_project_module,
    is_project_name,
    module_file,
    module_index,
    module_namespace,
    sha,
    source_index,
    sources_changed,
    split_definition,
    unreadable_module,
    warn_once,
)
from marin.execution.digest.value_text import CONTAINERS, PLAIN, plain_text

SCHEME = "ast11"
"""Stored with every digest; a record of another scheme compares as unknown, never as drift.
``ast2``: which callees are followed is decided by module name (``ast1``: by file location),
so an ``ast1`` record of code that is now followed must not read as drift. ``ast3``: code held
in module-level containers (a registry dict) and modules imported inside a function are
followed, and non-literal module-level assignments count by their source. ``ast4``: closure
cell values, code reached through a constant string (``getattr(m, "h")``, ``import_module``,
``globals()``, ``sys.modules``), instances in containers and ``SimpleNamespace`` members.
``ast5``: a ``functools.wraps`` wrapper is followed beside what it wraps, ``singledispatch``
overloads, any reference to a function that looks code up by name is unseen. ``ast6``: the
fields of a bound method's or callable instance's object (``OBJECT_STATE``). ``ast7``: a
module-level or class-level value of plain data by its value at lowering, ``__wrapped__`` of
any callable (``lru_cache``), a class's subclasses, more look-ups by name unseen. ``ast8``: a
dict value by its key order, a bound classmethod's class followed, a class's later statements
(``Cfg.k = f()``) by source, an object's fields one statement each (drift names them).
``ast9``: every binding statement of a module name bound more than once, a module-level
instance's fields, functions assigned onto a class, a ``build_config`` and a config object's
class; a project module used as a value is unseen. ``ast10``: more binding forms (a walrus, ``with
as``, ``match``, ``setattr`` on the module, ``globals().update``), an imported binding's source,
``exec`` at module level unseen, a function's defaults and attributes by value, code swapped into
a class, what a module-level partial or bound method carries, a ``build_config``'s object, an
instance's fields in a container or a class attribute, a dict/list subclass's items, a library
class the project patched; a project module held as a field is unseen. ``ast11``: docstrings
count (a prompt in a DSPy signature's, a tool's description: code reads them)."""
OBJECT_STATE = ".<self>"
"""The suffix of the part holding the fields of a step function's object (``Trainer.<self>``):
a bound method's ``__self__`` or a callable instance, through partials too."""
_MAX_CONTAINER = 100_000
_STATEMENT_CHARS = 12
_MAX_PARTS = 10_000
_MAX_TEXT = 1_000
_HEX = re.compile(r"^[0-9a-f]+$")


@dataclass(frozen=True, slots=True)
class CodePart:
    """One function or class of a step's code: where it is and the hash of its syntax.

    ``digest`` is None when its source is not available (``unknown`` says why). ``header`` hashes
    the signature and decorators, ``statements`` each statement of the body, ``constants`` the
    module-level literals it reads: together they say where a change is, not only that it is.
    """

    name: str
    """The qualified name (``train_model``, ``Tokenizer.split``), as messages show it."""
    file: str
    """The source file as people read it: relative to the working folder where possible."""
    line: int
    digest: str | None
    header: str = ""
    statements: tuple[str, ...] = ()
    constants: str = ""
    unknown: str | None = None
    via: str | None = None
    """The part that refers to this one (None for the step's own function)."""
    statement_lines: tuple[int, ...] = field(default=(), compare=False)
    """Each statement's line in the current source (this process only, never stored)."""
    labels: tuple[str, ...] = field(default=(), compare=False)
    """Each statement's name, for an object's fields (this process only, never stored)."""
    source: str = field(default="", compare=False)
    """The file's absolute path (this process only, never stored): ``file`` is relative to
    the project, whatever this process's working folder."""

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.file,
            "line": self.line,
            "digest": self.digest,
            "header": self.header,
            "statements": list(self.statements),
            "constants": self.constants,
            "unknown": self.unknown,
            "via": self.via,
        }


@dataclass(frozen=True, slots=True)
class CodeDigest:
    """The digest of a step's code: its function and same-project callees, transitively.

    ``digest`` is None when the step's own function has no source (``unknown`` says why); two
    digests are compared only when both are known and of one ``scheme``.
    """

    digest: str | None
    parts: tuple[CodePart, ...] = ()
    """The step's function first, then its callees in the order they were found."""
    unknown: str | None = None
    scheme: str = SCHEME

    @property
    def name(self) -> str:
        """The step function's name, or ``?`` when nothing is known."""
        return self.parts[0].name if self.parts else "?"

    @property
    def unseen(self) -> list[str]:
        """Callees of the same project whose source is not available: their changes are not seen."""
        return [f"{p.name} ({p.unknown})" for p in self.parts[1:] if p.digest is None]

    def to_record(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "digest": self.digest,
            "unknown": self.unknown,
            "parts": [part.to_record() for part in self.parts],
        }

    @classmethod
    def from_record(cls, data: Any) -> CodeDigest:
        """A stored digest, validated: anything malformed loads as unknown, never raises.

        Records are untrusted data (another tool, an old version or a corrupted write may have
        written them); a record without a digest (written before digests existed) is unknown.
        """
        if data is None:
            return unknown_digest("the record has no code digest (written before code digests)")
        try:
            return _parse_digest(data)
        except (TypeError, ValueError, KeyError, AttributeError):
            return unknown_digest("the stored code digest is unreadable")


def unknown_digest(reason: str) -> CodeDigest:
    return CodeDigest(None, (), reason)


def mixed_digest(before: CodeDigest, now: CodeDigest) -> CodeDigest:
    """The code of an output made partly by ``before`` and partly by ``now`` (a partial output
    resumed across a code change): ``now`` when they are one code; else a digest that is
    neither (it shows as code drift against any code, never as unchanged), with ``before``'s
    parts so that drift names what changed since; unknown when either is."""
    if before.digest == now.digest and before.scheme == now.scheme:
        return now
    if before.digest is None or now.digest is None or before.scheme != now.scheme:
        why = before.unknown or now.unknown or "digests of two schemes"
        return unknown_digest(f"made partly by code that cannot be compared ({why})")
    mixed = hashlib.sha256(f"mixed:{before.digest}:{now.digest}".encode()).hexdigest()
    return CodeDigest(mixed, before.parts, None, now.scheme)


def _text(value: Any, what: str, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise ValueError(f"{what} is not a short string")
    return value


def _hex(value: Any, what: str, optional: bool = False, empty: bool = False) -> Any:
    if value is None and optional:
        return None
    if value == "" and empty:
        return ""
    if not isinstance(value, str) or len(value) > 64 or not _HEX.match(value):
        raise ValueError(f"{what} is not a hex digest")
    return value


def _parse_digest(data: Any) -> CodeDigest:
    if not isinstance(data, dict):
        raise TypeError("not an object")
    scheme = _text(data.get("scheme"), "scheme")
    if scheme != SCHEME:
        return unknown_digest(f"the stored code digest uses another scheme ({scheme[:40]})")
    digest = _hex(data.get("digest"), "digest", optional=True)
    unknown = _text(data.get("unknown"), "unknown", optional=True)
    raw_parts = data.get("parts")
    if not isinstance(raw_parts, list) or len(raw_parts) > _MAX_PARTS:
        raise TypeError("parts is not a list")
    parts = []
    for raw in raw_parts:
        if not isinstance(raw, dict):
            raise TypeError("a part is not an object")
        line = raw.get("line")
        if type(line) is not int or line < 0:
            raise ValueError("line is not a line number")
        statements = raw.get("statements")
        if not isinstance(statements, list) or len(statements) > _MAX_PARTS:
            raise TypeError("statements is not a list")
        parts.append(
            CodePart(
                name=_text(raw.get("name"), "name"),
                file=_text(raw.get("file"), "file"),
                line=line,
                digest=_hex(raw.get("digest"), "part digest", optional=True),
                header=_hex(raw.get("header"), "header", empty=True),
                statements=tuple(_hex(s, "statement") for s in statements),
                constants=_hex(raw.get("constants"), "constants", empty=True),
                unknown=_text(raw.get("unknown"), "part unknown", optional=True),
                via=_text(raw.get("via"), "via", optional=True),
            )
        )
    if digest is not None and not parts:
        raise ValueError("a known digest without parts")
    return CodeDigest(digest, tuple(parts), unknown)


# --- the parts ----------------------------------------------------------------------------------

_MISSING = object()


@dataclass(frozen=True)
class _Found:
    """A part and the objects it refers to (resolved in its own namespace)."""

    part: CodePart
    callees: tuple[Any, ...]


# Reading a user object never runs its code: its type is read with ``type()`` (``isinstance``
# falls back to ``obj.__class__``, which resolves a lazy proxy), and attributes come from the
# C-level slots of functions, methods, partials and classes, never through ``getattr``.
_TYPE_BASES = type.__dict__["__bases__"]


def _unwrap(obj: Any) -> Any:
    """The function whose code runs behind a partial or a bound method (a decorator's wrapper
    is code of its own: ``_layers`` follows it and what it wraps)."""
    return unwrapped(obj)[1]


_DISPATCH_CODE = cast(types.FunctionType, functools.singledispatch(lambda _: None)).__code__
"""The code of every ``singledispatch`` function's wrapper: its ``registry`` is functools'
own dict behind a mapping proxy (so reading it runs no user code)."""


def _layers(obj: Any) -> list[Any]:
    """A function and what runs behind it: each ``functools.wraps`` wrapper and the function
    it wraps (``__wrapped__``), outermost first, and the overloads of a ``singledispatch``
    function (its ``registry``, read as a plain mapping: no user code runs)."""
    found = [obj]
    for _ in range(100):  # a cycle of __wrapped__ ends somewhere
        if type(obj) is not types.FunctionType:
            break
        members = obj.__dict__
        registry = members.get("registry")
        if obj.__code__ is _DISPATCH_CODE and type(registry) is types.MappingProxyType:
            found += [f for f in registry.values() if type(f) is types.FunctionType]
        inner = members.get("__wrapped__", _MISSING)
        if type(inner) is not types.FunctionType or any(inner is f for f in found):
            break
        found.append(obj := inner)
    return found


def _step_function(run: Any) -> Any:
    """The function or class whose code runs behind a spec's ``run``."""
    return _unwrap(_user_callable(run))


def _user_callable(run: Any) -> Any:
    """The user's callable behind a spec's ``run``: lowering's wrappers and ``apply()``'s call
    object hold it in the field their class names in ``wraps_field`` (a function may name it
    as ``wrapped_fn``, as ``graph.fn_identity`` reads it)."""
    for _ in range(100):
        kind = type(run)
        if kind is types.FunctionType:
            inner = run.__dict__.get("wrapped_fn", run)
        else:
            name = static_attr(kind, "wraps_field", _MISSING)
            engine = class_module(kind).startswith("marin.")
            inner = object.__getattribute__(run, name) if engine and type(name) is str else run
        if inner is run:
            break
        run = inner
    return run


def _is_code(obj: Any) -> bool:
    return type(obj) is types.FunctionType or is_class(obj)


def _callee(obj: Any) -> Any:
    """What a referenced object contributes: a function or class of its own, else None."""
    obj = _unwrap(obj)
    if _is_code(obj):
        return obj
    kind = type(obj)
    if obj is None or issubclass(kind, types.ModuleType) or kind is types.BuiltinFunctionType:
        return None
    if class_module(kind) not in ("builtins", "types"):
        return kind  # an instance (a configured model object): its class is its code
    return None


def _where(obj: Any) -> tuple[str, str, str, Mapping[str, Any]]:
    """``(module name, file, qualified name, namespace)`` of a function or class."""
    if type(obj) is types.FunctionType:
        code = obj.__code__
        module = obj.__module__
        return (module if type(module) is str else "", code.co_filename, code.co_qualname,
                obj.__globals__)  # fmt: skip
    module = class_module(obj)
    qualname = TYPE_QUALNAME.__get__(obj, type)
    if module == "builtins" and vars(builtins).get(qualname) is not obj:
        # Made by ``exec`` of a file into ``{}`` (red team r44-3): its methods know the file.
        for function in _own_functions(obj):
            return "", function.__code__.co_filename, qualname, function.__globals__
    found = sys.modules.get(module)
    namespace = module_namespace(found) or {}
    return module, module_file(found), qualname, namespace


class _ObjectState:
    """The fields of an object a step function carries, as a part of its code (the closure
    rule: ``_object_part``)."""

    def __init__(self, holder: Any) -> None:
        self.holder = holder


def _object_part(holder: Any) -> _Found:
    """The part of a step function's object: its fields' values as constants (plain data by
    value, code by name), a field of any other value unseen, as ``_closure_values`` treats a
    closure's cells; its class and the code its fields hold are followed. Read at each call:
    an object's fields may change, so the value at lowering counts."""
    kind = type(holder)
    qualname = TYPE_QUALNAME.__get__(kind, type)
    fields, hidden = instance_fields(holder)
    constants, opaque = _closure_values(qualname, fields, "self", "its object")
    callees: list[Any] = [kind, *opaque]
    if hidden:  # its class replaced ``__dict__``: the real one is not read (that runs its code)
        why = "its class replaces __dict__, so its fields are not read: not compared"
        callees.append(_Unseen(f"{qualname}.<self __dict__>", why))
    for value in fields.values():
        code = _callee(value)  # a function or an instance's class (only the project's count)
        callees += ([code] if code is not None else []) + _wrapped_chain(value)
        callees += _in_container(value) or []
    constants.sort()
    where = _found(kind)
    file, line = (where.part.file, where.part.line) if where is not None else ("?", 0)
    digest = sha("\n".join([SCHEME, OBJECT_STATE, *constants]))
    held = sha("\n".join(constants))[:_STATEMENT_CHARS] if constants else ""
    labels = tuple(c.removeprefix("<self>").partition("=")[0] for c in constants)
    half = _STATEMENT_CHARS // 2  # each field: the hash of its name, then of its value
    statements = tuple(
        sha(n)[:half] + sha(c)[:half] for n, c in zip(labels, constants, strict=True)
    )
    part = CodePart(
        qualname + OBJECT_STATE, file, line, digest, "", statements, held, labels=labels
    )
    return _Found(part, tuple(callees))


class _Unseen:
    """A callee the digest knows of but cannot read (a project module imported inside a
    function and not imported in this process): an unknown part, never "unchanged"."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason


def _find(obj: Any) -> _Found | None:
    """The part of a function or class; None when it is not the project's (not followed)."""
    if type(obj) is _Unseen:
        return _Found(_unknown_part(obj.name, "?", 0, obj.reason), ())
    if type(obj) is _ObjectState:
        return _object_part(obj.holder)
    if type(obj) is _Carried:
        return _carried_part(obj.holder)
    module, filename, qualname, namespace = _where(obj)
    closure: dict[str, Any] = {}
    if type(obj) is types.FunctionType:
        cells = (_cell(c) for c in obj.__closure__ or ())
        closure = dict(zip(obj.__code__.co_freevars, cells, strict=False))
    if filename.startswith("<frozen "):
        return None  # a frozen module of the standard library (os, posixpath): not followed
    if filename.startswith("<"):
        return _Found(_unknown_part(qualname, filename, 0, f"defined at run time ({filename})"), ())
    if not is_project_module(module, filename):
        return _patched_library_class(obj) if is_class(obj) else None
    file = display_path(filename)
    first = obj.__code__.co_firstlineno if type(obj) is types.FunctionType else 0
    index = source_index(filename)
    if isinstance(index, str):
        return _Found(_unknown_part(qualname, file, first, index), ())
    if is_class(obj) and qualname not in index.classes and _made_by_namedtuple(obj):
        return _patched_library_class(obj)  # ``NT = namedtuple("NT", "a b")``: no source
    syntax = _syntax(obj, qualname, index)
    if syntax is not None and not _runs_this_source(obj, index):
        syntax = None  # the function runs code its file no longer holds (red team r53-1)
    if syntax is None:
        made = is_class(obj) and qualname not in index.classes and qualname in index.sources
        reason = MADE_BY_A_CALL if made else SOURCE_EDITED  # ``type("Dyn", ...)``: r45-4
        return _Found(_unknown_part(qualname, file, first, reason), ())
    # What the names refer to is resolved for each object: closures of one code differ.
    local = _local_imports(syntax.imports, namespace.get("__package__"))
    scope = {**namespace, **local} if local else namespace
    shadowed = _locals(obj) - syntax.named_globals
    constants, callees = _resolve_all(syntax.references, scope, closure, index, shadowed)
    cell_values, opaque = _closure_values(qualname, closure)
    constants += cell_values
    callees += opaque
    if type(obj) is types.FunctionType:  # ``h.__defaults__ = (...)``, ``configure(h)``
        held_values, held_code = _function_state(qualname, obj)
        constants += held_values
        callees += held_code
    if is_class(obj):
        class_values, held = _class_state(obj, qualname, index, syntax)
        constants += class_values
        callees += held
    constants_hash = sha("\n".join(constants))[:_STATEMENT_CHARS] if constants else ""
    part = CodePart(
        qualname, file, syntax.line, syntax.digest(constants_hash), syntax.header,
        syntax.statements, constants_hash, statement_lines=syntax.lines,
        source=os.path.abspath(filename),
    )  # fmt: skip
    return _Found(part, tuple(callees))


def _function_state(qualname: str, function: types.FunctionType) -> tuple[list[str], list[Any]]:
    """A function's defaults and attributes, by value at lowering (what a later
    ``h.__defaults__ = ...`` or another module's ``configure(h)`` set, which its source does
    not show): plain data by value, a project instance by its fields (``_instance_state``),
    the code they hold followed."""
    constants: list[str] = []
    callees: list[Any] = []
    kwdefaults = function.__kwdefaults__
    values: list[tuple[str, Any]] = [
        *((f"<default {i}>", v) for i, v in enumerate(function.__defaults__ or ())),
        *((f"<default {k}>", v) for k, v in (kwdefaults or {}).items()),
        *(
            (k, v) for k, v in function.__dict__.items()
            if not (k.startswith("__") and k.endswith("__")) and k != "registry"
        ),
    ]  # fmt: skip
    for key, value in values:
        label = f"{qualname}.{key}"
        text = plain_text(value, [_MAX_CONTAINER], 0)
        callees += _module_field(label, value)
        if text is not None:
            constants.append(f"{label}=={text}")
            continue
        fields, code = _instance_state(label, value)
        constants += fields
        callees += code
    return constants, callees


_PATCHED = ".<patched>"


def _patched_library_class(cls: type) -> _Found | None:
    """A library class the project patched (``fractions.Fraction.__add__ = _add``): the
    project's functions in its namespace are followed; None when there are none (a library's
    class is not followed). Read again whenever its namespace holds other names or objects
    (the cache keeps the objects, so an unchanged one is the same objects)."""
    namespace = TYPE_DICT.__get__(cls, type)
    keys, values = tuple(namespace), tuple(namespace.values())
    known = _LIBRARY_CLASSES.get(cls)
    if known is not None and known[0] == keys and all(map(operator.is_, known[1], values)):
        return known[2]
    found = _patched_part(cls, dict(zip(keys, values, strict=True)))
    _LIBRARY_CLASSES.put(cls, (keys, values, found))
    return found


def _patched_part(cls: type, namespace: Mapping[str, Any]) -> _Found | None:
    patched: dict[str, Any] = {}
    for name, value in namespace.items():
        function = _unwrap(_method_function(value))
        if type(function) is not types.FunctionType:
            continue
        module = function.__module__
        code = function.__code__
        if type(module) is str and is_project_module(module, code.co_filename):
            patched[name] = function
    if not patched:
        return None
    qualname = TYPE_QUALNAME.__get__(cls, type)
    names = sorted(patched)
    part = CodePart(qualname + _PATCHED, "?", 0, sha("\n".join([SCHEME, *names])), "", (),
                    sha("\n".join(names))[:_STATEMENT_CHARS])  # fmt: skip
    return _Found(part, tuple(patched.values()))


def _class_values(
    cls: type, computed: frozenset[str], decorated: frozenset[str] = frozenset()
) -> tuple[list[str], list[Any]]:
    """A class's own attributes of plain data, by their value (``Cfg.k = 2`` after the class
    is seen; a name its body assigns a computed value counts by its source), and the code they
    hold (a registry ``__init_subclass__`` fills); every subclass when it defines
    ``__init_subclass__`` (its subclasses decide what it registers). Read from ``vars(cls)``."""
    constants: list[str] = []
    held: list[Any] = []
    qualname = TYPE_QUALNAME.__get__(cls, type)
    file = _where(cls)[1]
    for name, value in TYPE_DICT.__get__(cls, type).items():
        dunder = name.startswith("__") and name.endswith("__")
        if one_of(type(value), _WEAK_REGISTRIES):  # however it was made
            held.append(_weak_registry(f"{qualname}.{name}"))
        function = _unwrap(_method_function(value))
        if type(function) is types.FunctionType:  # ``Model.compute = _compute``: its code
            if _assigned_onto(function, qualname, name in decorated, file):
                held.append(function)
            continue
        if dunder or _is_code(function):
            continue
        if name == "_abc_impl":  # ``Marker.register(float)``: whom ``isinstance`` accepts (r42-2)
            constants.append(f"<class>registered=={_abc_registered(cls)}")
            continue
        held += _module_field(f"{qualname}.{name}", value)
        text = plain_text(value, [_MAX_CONTAINER], 0)
        if text is not None:
            constants += [f"<class>{name}=={text}"] if name not in computed else []
            held += _in_container(value) or []
        else:  # ``box = Box()``, ``c = partialmethod(_c)``: an instance's class, fields, code
            fields, code = _instance_state(f"<class>{name}", value)  # (by value, as at module
            constants += fields  # level: ``configure(Cfg.box)`` counts)
            held += code
    if "__init_subclass__" in TYPE_DICT.__get__(cls, type):
        held += _subclasses(cls)
    return constants, held


def _abc_registered(cls: type) -> str:
    """The classes an abstract class registered as its virtual subclasses, by name, read from
    its registry (``abc._get_dump``: the interpreter's own table, no user code runs)."""
    try:
        registry = abc._get_dump(cls)[0]  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # not an ``abc.ABCMeta`` class after all
        return "?"
    classes = (ref() for ref in registry)
    return ",".join(sorted(TYPE_QUALNAME.__get__(c, type) for c in classes if is_class(c)))


def _assigned_onto(function: types.FunctionType, qualname: str, decorated: bool, file: str) -> bool:
    """Whether a function in class ``qualname``'s namespace was put there from outside its body
    (``Model.compute = _compute``): not one it defines (a dataclass names its own methods
    so too), nor the wrapper a decorator in its body made (its source is the decorator's)."""
    code = function.__code__  # ``Model.compute.__code__ = _other.__code__``: _other's code
    swapped = code.co_filename == file and not code.co_qualname.startswith(qualname + ".")
    if function.__qualname__.startswith(qualname + ".") and not swapped:
        return False
    return not (decorated and "<locals>" in function.__code__.co_qualname)


_STATIC_FUNC = staticmethod.__dict__["__func__"]
_CLASS_FUNC = classmethod.__dict__["__func__"]


def _method_function(value: Any) -> Any:
    """What a ``staticmethod`` or ``classmethod`` in a class's namespace holds (C-level slots)."""
    kind = type(value)
    if kind is staticmethod:
        return _STATIC_FUNC.__get__(value, kind)
    if kind is classmethod:
        return _CLASS_FUNC.__get__(value, kind)
    return value


@dataclass
class _Syntax:
    """The normalised syntax of one definition, as one version of its file holds it."""

    index: SourceIndex
    """The parsed file it was read from: stale once the file changed (another index)."""
    line: int
    header: str
    statements: tuple[str, ...]
    lines: tuple[int, ...]
    references: list[tuple[str, ...]]
    imports: tuple[tuple[str, str, str | None], ...]
    """What ``import`` statements inside the definition bind: (name, module, attribute)."""
    named_globals: frozenset[str] = frozenset()
    """Globals read by their name through ``globals()``: no local of the reader shadows them."""
    computed: frozenset[str] = frozenset()
    """A class body's names assigned a computed value (their source counts, not their value)."""
    decorated: frozenset[str] = frozenset()
    """A class body's methods with decorators (a wrapper a decorator made replaces them)."""
    digests: dict[str, str] = field(default_factory=dict)
    """The part's digest by the hash of the constants it reads."""

    def digest(self, constants_hash: str) -> str:
        known = self.digests.get(constants_hash)
        if known is None:
            text = "\n".join([SCHEME, self.header, *self.statements, constants_hash])
            known = self.digests[constants_hash] = sha(text)
        return known


def _runs_this_source(obj: Any, index: SourceIndex) -> bool:
    """A function's code is what its file now compiles to (once per code object and file
    version); a class's methods are checked as parts of their own."""
    if type(obj) is not types.FunctionType:
        return True
    code = obj.__code__
    known = _MATCHES.get(code)
    if known is None or known[0] is not index:
        known = (index, index.runs_this_source(code))
        _MATCHES.put(code, known)
    return known[1]


def _syntax(obj: Any, qualname: str, index: SourceIndex) -> _Syntax | None:
    """``obj``'s definition in ``index``, hashed once per code object (a factory's closures
    share one) and version of its file; None when the file holds no such definition."""
    key = obj.__code__ if type(obj) is types.FunctionType else obj
    known = _SYNTAX.get(key)
    if known is not None and known.index is index:
        return known
    nodes = _nodes(obj, qualname, index)
    if not nodes:
        return None
    headers, statements, lines = [], [], []
    references: References = {}
    for node in nodes:
        header, body = split_definition(node, references)
        headers.append(header)
        statements += [sha(dump(s, references))[:_STATEMENT_CHARS] for s in body]
        lines += [getattr(s, "lineno", 0) for s in body]
    line = first_line(nodes[0]) if not isinstance(nodes[0], ast.Lambda) else nodes[0].lineno
    header = sha("\n".join(headers))[:_STATEMENT_CHARS]
    bodies = [n.body for n in nodes if isinstance(n, ast.ClassDef)]
    computed = {n for body in bodies for n in computed_names(body)}
    decorated = {
        d.name for body in bodies for d in body
        if isinstance(d, ast.FunctionDef | ast.AsyncFunctionDef) and d.decorator_list
    }  # fmt: skip
    named = frozenset(chain[0] for chain, by_name in references.items() if by_name)
    syntax = _Syntax(
        index, line, header, tuple(statements), tuple(lines), list(references), _imports(nodes),
        named, frozenset(computed), frozenset(decorated),
    )  # fmt: skip
    _SYNTAX.put(key, syntax)
    return syntax


def _imports(nodes: list[Any]) -> tuple[tuple[str, str, str | None], ...]:
    """What ``import`` statements inside the definition bind: ``(name, module, attribute)``."""
    bound: list[tuple[str, str, str | None]] = []
    for node in (n for top in nodes for n in ast.walk(top)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.partition(".")[0]
                bound.append((name, alias.name if alias.asname else name, None))
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            bound += [(alias.asname or alias.name, module, alias.name) for alias in node.names]
    return tuple(bound)


def _local_imports(
    imports: tuple[tuple[str, str, str | None], ...], package: Any
) -> dict[str, Any]:
    """The names that ``import`` statements inside the definition bind, resolved from
    ``sys.modules`` (never imported here: that would run code); a relative one against the
    definition's ``package`` (red team r28-3: ``from .cfg import BASE`` was never compared). A
    project module that is not imported in this process (kept off the driver) is unseen, so
    the step's code is unknown."""
    bound = {
        name: _imported(absolute_module(module, package), attr) for name, module, attr in imports
    }
    return {k: v for k, v in bound.items() if v is not _MISSING}


def _imported(module: str, attr: str | None) -> Any:
    """``module`` (or its ``attr``) as this process has it; ``_Unseen`` for a project module
    it does not have; ``_MISSING`` for another package's."""
    found = sys.modules.get(module) if not module.startswith(".") else None
    if found is None:
        if module.startswith(".") or is_project_name(module):
            why = f"imported inside the function, not in this process: {module} is not seen"
            return _Unseen(module + (f".{attr}" if attr else ""), why)
        return _MISSING
    if attr is None:
        return found
    members = module_namespace(found)
    inner = members.get(attr, _MISSING) if members is not None else _MISSING
    if inner is _MISSING:
        inner = sys.modules.get(f"{module}.{attr}", _MISSING)
    if inner is _MISSING and is_project_name(module):  # ``from pkg import sub``: red team r51-1
        why = f"imported inside the function, not in this process: {module}.{attr} is not seen"
        return _Unseen(f"{module}.{attr}", why)
    return inner


_HOLDERS = (*CONTAINERS, *LIBRARY_CONTAINERS, types.SimpleNamespace)
_DEFAULT_FACTORY = collections.defaultdict.__dict__["default_factory"]
_HOLDER_IDS = frozenset(id(kind) for kind in _HOLDERS)
_PLAIN_IDS = frozenset(id(kind) for kind in PLAIN)
"""By identity (no ``__hash__`` or ``__eq__`` of a user's metaclass runs), for the hot loops."""
_SEQUENCE_IDS = frozenset(id(kind) for kind in (list, tuple))
_SKIPPED: dict[int, type] = {id(kind): kind for kind in PLAIN}
"""Plain data's classes and the engine's met so far, by identity (each kept alive here, so its
id is never another's): a handle among a step's ``deps`` is skipped without reading its
module again."""


def _skipped(kind: type) -> bool:
    """Plain data, or a value of the engine's own (``OUT``, a handle): no project code."""
    if id(kind) in _SKIPPED:
        return True
    if class_module(kind).startswith("marin."):
        _SKIPPED[id(kind)] = kind
        return True
    return False


def _in_container(obj: Any) -> list[Any] | None:
    """The functions and classes a plain dict, list, tuple or set holds, at any depth (a
    registry of tokenizers, a dispatch table); None when it holds over ``_MAX_CONTAINER``
    items (not read: unseen). Only these exact types are read, so no user code runs."""
    found: list[Any] = []
    stack, seen, budget = [obj], {id(obj)}, _MAX_CONTAINER
    while stack:
        current = stack.pop()
        if type(current) is types.SimpleNamespace:
            items = [*_namespace_dict(current).values()]
        elif issubclass(type(current), dict) and id(type(current)) in _HOLDER_IDS:
            items = [*dict.keys(current), *dict.values(current)]
            if type(current) is collections.defaultdict:  # its factory runs on a missing key
                items.append(_DEFAULT_FACTORY.__get__(current, collections.defaultdict))
        elif id(type(current)) in _HOLDER_IDS:
            items = [*current]
        else:
            continue
        budget -= len(items)
        if budget < 0:
            return None
        for item in items:
            if _skipped(type(item)):
                continue  # (a handle among a step's ``deps``: the engine's, as in _also_code)
            kind = id(type(item))
            if kind in _HOLDER_IDS and id(item) not in seen:
                seen.add(id(item))
                stack.append(item)
            elif type(item) is _Unseen:
                found.append(item)
            elif module_index(item) is not None:  # ``MODS = {"m": other}``: read by a key
                why = "a project module held in a container: what is read from it is not followed"
                found.append(
                    _Unseen(f"<module {(module_namespace(item) or {}).get('__name__')}>", why)
                )
            else:  # an instance (``MODELS = {"a": Model()}``)
                if carries(item) or is_project_class(type(item)):  # ``[Box()]``: its fields
                    found.append(_Carried(item))
                code = _callee(item)
                found += [code, *_wrapped_chain(item)] if code is not None else _wrapped_chain(item)
    return found


def _closure_values(
    qualname: str, closure: Mapping[str, Any], kind: str = "closure", holder: str = "its closure"
) -> tuple[list[str], list[Any]]:
    """What a closure's cells hold (``make(0.1)``'s ``lr``), as constants of its code: plain
    data by value, functions and classes by name (and followed); any other value (an object,
    an open file) is run-time state the digest cannot compare: an unseen part. An object's
    fields are read by the same rule (``kind`` ``self``, ``holder`` ``its object``)."""
    constants: list[str] = []
    opaque: list[Any] = []
    for name, value in closure.items():
        if value is _MISSING:
            continue
        text = plain_text(value, [_MAX_CONTAINER], 0)
        if text is None:
            what = TYPE_QUALNAME.__get__(type(value), type)
            why = f"{holder} holds a {what} ({name}): a run-time value, not compared"
            opaque.append(_Unseen(f"{qualname}.<{kind} {name}>", why))
        else:
            constants.append(f"<{kind}>{name}={text}")
    return constants, opaque


def _made_by_namedtuple(cls: Any) -> bool:
    """A class ``collections.namedtuple`` made: the library's code (its ``__new__`` is
    compiled from a string), with no definition in the project's source to read."""
    new = TYPE_DICT.__get__(cls, type).get("__new__")
    function = new.__func__ if type(new) is staticmethod else None
    module = function.__module__ if type(function) is types.FunctionType else None
    return type(module) is str and module.startswith("namedtuple_")


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (the name is assigned after the closure is made)
        return _MISSING


SOURCE_EDITED = "its source does not match the running code (edited since it was imported?)"
"""Why a part is unknown whose file no longer holds the code that runs (``code_check`` reads
it as a change: the process that imported it runs other code than the file now says)."""
MADE_BY_A_CALL = (
    "a class made by a call (type(...)), not by a class statement: the statement making it"
    " counts by its source"
)


def _unknown_part(name: str, file: str, line: int, reason: str) -> CodePart:
    return CodePart(name, file, line, None, unknown=reason)


def _nodes(obj: Any, qualname: str, index: SourceIndex) -> list[Any]:
    """The definition(s) of ``obj`` in its file: of several candidates (two lambdas on one
    line, a class defined in two branches), the one holding where its code is (red team r39-1:
    hashed together, a swap of one for the other was no change); else all of them, hashed
    together: over-eager, never blind."""
    if is_class(obj):
        classes = list(index.classes.get(qualname, []))
        own = [c for c in _method_codes(obj) if c.co_qualname.startswith(qualname + ".")]
        lines = [c.co_firstlineno for c in own]
        return _holding(classes, [(line, -1) for line in lines]) or classes
    code = obj.__code__
    if qualname.endswith("<lambda>"):
        names = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
        found = index.lambdas.get(code.co_firstlineno, [])
        matching = [n for n in found if _lambda_args(n) == names] or found
        where = [(p[0], p[2]) for p in code.co_positions() if p[0] is not None and p[2]]
        return _holding(matching, where) or matching
    return [n for n in index.functions.get(qualname, []) if first_line(n) == code.co_firstlineno]


def _class_state(
    cls: type, qualname: str, index: SourceIndex, syntax: _Syntax
) -> tuple[list[str], list[Any]]:
    """A class's values (``_class_values``), what statements after it set (their source), and
    what it holds that its source does not name (``_class_objects``)."""
    assigned = {n.partition(".")[2] for n in index.assigned if n.startswith(qualname + ".")}
    # ``Model.REG[k] = v`` in a function (red team r37-2), a class a function makes (one
    # statement, a class per call: r40-2): every value counts as it is.
    made = qualname in index.filled or "<locals>" in qualname
    computed = frozenset() if made else syntax.computed | assigned
    constants, held = _class_values(cls, computed, syntax.decorated)
    later = assignment_source(index, qualname)  # `Cfg.k = f()` after the class: its source
    constants += [f"<class>:={'|'.join(later)}"] if later else []
    objects = _class_objects(cls, qualname)
    return constants + objects[0], held + objects[1]


def _class_objects(cls: type, qualname: str) -> tuple[list[str], list[Any]]:
    """What a class holds that its source does not name (red team r40): its bases as objects
    (``class Scaled(cls)`` in a decorator: a parameter), and its methods' closure cells (the
    arguments of the function that made it), by the closure rule."""
    constants: list[str] = []
    callees: list[Any] = list(_TYPE_BASES.__get__(cls, type))
    for function in _own_functions(cls):
        code = function.__code__
        if not code.co_qualname.startswith(qualname + "."):
            continue  # put there from outside its body (followed as code of its own)
        cells = dict(zip(code.co_freevars, map(_cell, function.__closure__ or ()), strict=False))
        cells.pop("__class__", None)  # ``super()``'s: the class itself
        found = _closure_values(f"{qualname}.{code.co_name}", cells)
        constants += found[0]
        callees += found[1]
    return constants, callees


def _holding(nodes: list[Any], where: list[tuple[int, int]]) -> list[Any]:
    """The one of several ``nodes`` whose span holds every ``(line, column)`` (column -1: any),
    as a list; empty when not exactly one does (or there is nothing to place)."""
    if len(nodes) < 2 or not where:
        return []

    def holds(node: ast.expr | ast.stmt, line: int, column: int) -> bool:
        start = (node.lineno, node.col_offset)
        end = (node.end_lineno or node.lineno, node.end_col_offset or 0)
        if column < 0:
            return start[0] <= line <= end[0]
        return start <= (line, column) <= end

    found = [n for n in nodes if all(holds(n, line, column) for line, column in where)]
    return found if len(found) == 1 else []


def _method_codes(cls: type) -> list[types.CodeType]:
    """The code of the functions in a class's own namespace."""
    return [f.__code__ for f in _own_functions(cls)]


def _own_functions(cls: type) -> list[types.FunctionType]:
    functions = (_method_function(v) for v in TYPE_DICT.__get__(cls, type).values())
    return [f for f in functions if type(f) is types.FunctionType]


def _lambda_args(node: ast.Lambda) -> list[str]:
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _resolve_all(
    references: list[tuple[str, ...]],
    namespace: Mapping[str, Any],
    closure: Mapping[str, Any],
    index: SourceIndex,
    seen: frozenset[str] = frozenset(),
) -> tuple[list[str], list[Any]]:
    """The constants (a module-level plain value, ``name==value``; else the literal source,
    ``name=dump``, and a non-literal's source, ``name:=dump``, with what it reads) and the
    callee objects that ``references`` name; ``seen``: names whose value's reads are not
    followed (being followed already, or a local of the reader: ``_locals``)."""
    constants: list[str] = []
    callees: dict[int, Any] = {}
    for chain in references:
        if chain[-1] == VALUE:  # ``helpers = other``: a project module as a value is unseen
            module = _module_as_value(chain[:-1], namespace, closure)
            callees.update({} if module is None else {id(module): module})
            continue
        name = ".".join(chain)
        constants += _module_doc(name, chain, namespace, closure)  # ``__doc__`` read (r25-3)
        obj, rest = _head(chain, namespace, closure)
        if chain[0] not in closure and chain[0] not in namespace:
            constants += _builtin_value(chain[0])  # ``builtins.K = 2`` by a module: r51-2
        constants += library_modules(chain, obj, rest, index, namespace, chain[0] not in closure)
        if obj is _MISSING:  # a builtin, a local or a name not yet bound
            if "__subclasses__" in chain:
                obj = _Unseen(name, "it lists the subclasses of a class known at run time only")
            else:
                continue
        owner: _Owner = (index if chain[0] not in closure else None), chain[0], namespace
        obj, owner, extra = _follow(chain, obj, rest, owner)
        obj = _lookup_unseen(name, obj)
        held = _in_container(obj)  # also a literal: `TOKENIZERS = {}` is filled at import
        if held is None:
            held = [_Unseen(name, f"a container of over {_MAX_CONTAINER} items")]
        target = obj if type(obj) is _Unseen else _callee(obj)
        for code in [target, *_wrapped_chain(obj), *held, *extra]:
            if code is not None:
                callees.setdefault(id(code), code)
        owner_index, owner_name, owner_scope = owner
        if owner_index is None:
            continue
        identity = library_identity(obj, owner_index, owner_name, owner_scope)
        constants += [f"{name}=={identity}"] if identity else []
        if owner_index.dynamic:  # ``exec(...)``, ``globals().update(d)``: one part per module
            why = "its module binds names known at run time only (exec, globals().update)"
            callees.setdefault(id(owner_index), _Unseen(f"{name} (globals)", why))
        if (target is None or read_by_value(target)) and module_namespace(obj) is None:
            found = _module_value(name, obj, owner_index, owner_name, owner_scope)
            _merge(found, constants, callees)
        else:  # a module-level instance, ``P = partial(f, cfg.K)``, ``G = make().get``
            _merge(_held_state(name, obj, target), constants, callees)
        bindings = _bindings(name, owner_index, owner_name, owner_scope, index, seen)
        _merge(bindings, constants, callees)
    return constants, list(callees.values())


def _lookup_unseen(name: str, obj: Any) -> Any:
    """``obj``, or what it is unseen as: ``sys.modules`` (any module, by a name known at run
    time only), a function that looks code up by a name (an alias too: ``g = getattr``), a
    weak-reference registry."""
    if obj is sys.modules:
        return _Unseen(name, "it reads sys.modules by a computed name")
    if _DYNAMIC_FUNCTIONS.get(id(obj), _MISSING) is obj:
        why = "it refers to a function that looks code up by a name (getattr, eval, ...)"
        return _Unseen(name, why)
    return _weak_registry(name) if one_of(type(obj), _WEAK_REGISTRIES) else obj


def _bindings(
    name: str,
    owner: SourceIndex,
    owner_name: str,
    namespace: Mapping[str, Any],
    index: SourceIndex,
    seen: frozenset[str],
) -> tuple[list[str], list[Any]]:
    """What a module-level name's statements say beyond its value: the source of a computed
    one (``name:=dump``) and what that source reads (``_assigned_reads``), also of one imported
    from another module (``from cfg import CARD``: red team round 28), and the values it was
    bound to before (``K = 3``, ``def h(k=K)``, ``K = 5``: what h captured is the first)."""
    constants: list[str] = []
    callees: list[Any] = []
    source = assignment_source(owner, owner_name)
    if source:
        constants.append(f"{name}:=" + "|".join(source))
        reads, callees = _assigned_reads(owner, owner_name, namespace, index, seen)
        constants += reads
    imported = imported_from(owner, owner_name, namespace)
    if imported is not None and not (owner is index and owner_name in seen):
        held, now = namespace.get(owner_name, _MISSING), _MISSING
        for other, scope, other_name in import_chain(owner, imported):  # a re-export: r44-2
            source = assignment_source(other, other_name)  # ``act = math.floor``: r42-1
            constants += [f"{name}:=" + "|".join(source)] if source else []
            reads, more = _assigned_reads(other, other_name, scope, index, seen)
            constants += reads
            callees += more
            now = scope.get(other_name, _MISSING)
        if now is not _MISSING and now is not held and len(owner.bindings.get(owner_name, [])) < 2:
            why = "it holds what its module held before it was reloaded or rebound: not compared"
            callees.append(_Unseen(name, why))  # ``from m import K``, then m reloaded: r54-2
    earlier = bound_earlier(owner, owner_name)
    if earlier:
        constants.append(f"{name}<=" + "|".join(earlier))
    return constants, callees


def _locals(obj: Any) -> frozenset[str]:
    """A function's own parameters and locals: a global one shadows (``def read(src)`` beside
    ``src = apply(...)``) is taken for a read of the global (``References``), by its source,
    but what that global's value reads is not followed (``_assigned_reads``): it would put
    another step's code in this one's digest. Only the function's own: a name bound in a
    nested function, lambda or comprehension shadows nothing in the body (red team r27-1)."""
    if type(obj) is not types.FunctionType:
        return frozenset()
    return frozenset(obj.__code__.co_varnames) | frozenset(obj.__code__.co_cellvars)


def _assigned_reads(
    owner: SourceIndex,
    name: str,
    namespace: Mapping[str, Any],
    index: SourceIndex,
    seen: frozenset[str],
) -> tuple[list[str], list[Any]]:
    """What a module-level name assigned a computed value reads in its source (``K =
    cfg.BASE``, ``PROMPT = __doc__``, ``CARD = helpers.card()``): resolved as the reader's own
    reads, in ``namespace`` (its module's), its constants labelled with the name (red team
    r26-1; another module's, read as ``cfg.X``: round 28). Each once along a chain: ``seen``
    holds the reader's shadowed names and ``<module>:<name>`` of each one followed."""
    key = f"{id(owner)}:{name}"
    if key in seen or (owner is index and name in seen):
        return [], []
    # In another module, the reader's own names shadow nothing: only the chain's keys go on.
    carried = seen if owner is index else frozenset(s for s in seen if ":" in s)
    reads = [chain for chain in owner.source_refs.get(name, {}) if chain[0] != name]
    constants, callees = _resolve_all(reads, namespace, {}, owner, carried | {name, key})
    return [f"{name}<-{c}" for c in constants], callees


def _merge(
    found: tuple[list[str], list[Any]], constants: list[str], callees: dict[int, Any]
) -> None:
    constants += found[0]
    for code in found[1]:
        callees.setdefault(id(code), code)


def _module_doc(
    name: str, chain: tuple[str, ...], namespace: Mapping[str, Any], closure: Mapping[str, Any]
) -> list[str]:
    """``__doc__`` (the function's own module's docstring) or ``m.__doc__`` of a project module,
    by its text: code reads it as data, a model card, a prompt. A class's or function's is in
    its own digest already; a library module's is the environment's. Nothing for any other
    reference."""
    if chain[-1] != "__doc__":
        return []
    if len(chain) == 1:
        doc = namespace.get("__doc__")
    else:
        obj, rest = _head(chain[:-1], namespace, closure)
        if obj is _MISSING or type(obj) is _Unseen:
            return []
        obj = _follow(chain[:-1], obj, rest, (None, chain[0], {}))[0]
        if module_index(obj) is None:
            return []
        doc = getattr(obj, "__doc__", None)
    return [f"{name}=={json.dumps(doc)}"] if isinstance(doc, str) else []


def _module_as_value(
    chain: tuple[str, ...], namespace: Mapping[str, Any], closure: Mapping[str, Any]
) -> _Unseen | None:
    """Unseen when ``chain`` names a project module used as a value (``helpers = other``, a
    ``global`` rebinding it, ``impl = other`` in a class): what is read from it later goes by
    another name, which the digest does not follow."""
    obj, rest = _head(chain, namespace, closure)
    if obj is _MISSING or type(obj) is _Unseen:
        return None
    obj = _follow(chain, obj, rest, (None, chain[0], {}))[0]
    if module_index(obj) is None:
        return None
    why = "a project module used as a value: what is read from it is not followed"
    return _Unseen(".".join(chain), why)


def _instance_state(name: str, obj: Any, depth: int = 0) -> tuple[list[str], list[Any]]:
    """The fields of an instance held at module or class level (``B = Box(K)``,
    ``setattr(B, "v", 30)``, ``R.f = helpers.a``): of a project class, plain data by value
    and an instance's fields in turn (4 levels); of any class, the code they hold followed (a
    function, an instance's class, a container's). A field of any other value (a lock, a
    client, a container of over ``_MAX_CONTAINER`` items) is not compared: the statement that
    made the instance counts by its source. Read as ``instance_fields`` reads: no user code
    runs."""
    kind = type(obj)
    project = is_project_class(kind)
    if depth > 4 or is_class(obj) or not (project or (depth == 0 and _has_fields(kind))):
        return [], []
    fields, hidden = instance_fields(obj)
    constants: list[str] = []
    callees: list[Any] = [kind] if project else []
    if hidden and project:
        why = "its class replaces __dict__, so its fields are not read: not compared"
        callees.append(_Unseen(f"{name}.<__dict__>", why))
    if project:  # ``class Reg(dict)``: its items, as a plain dict's or list's
        fields = {**fields, **_builtin_items(obj)}
    for key, value in fields.items():
        label = f"{name}.{key}"
        code = _callee(value)
        callees += ([code] if code is not None else []) + _wrapped_chain(value)
        callees += _in_container(value) or []
        callees += _module_field(label, value)
        text = plain_text(value, [_MAX_CONTAINER], 0)
        dunder = key.startswith("__") and key.endswith("__")
        if project and text is not None and not dunder:
            constants.append(f"{label}=={text}")  # (``__module__``: the name it was loaded as)
        if text is None:  # a project instance's fields (a library object's: only its code)
            inner = _instance_state(label, value, depth + 1)
            constants += inner[0]
            callees += inner[1]
    return sorted(constants), callees


def _held_state(name: str, obj: Any, target: Any) -> tuple[list[str], list[Any]]:
    """What a module-level value holds besides its code: an instance's fields, a partial's
    arguments, a bound method's object (plain data by value at lowering)."""
    if type(obj) is not _Unseen and target is type(obj):
        return _instance_state(name, obj)
    return _carried_state(name, obj)


def _carried_state(name: str, obj: Any) -> tuple[list[str], list[Any]]:
    """What a partial or bound method held at module level carries besides its code (``P =
    partial(f, cfg.K)``, ``G = make().get``): each partial's arguments and each bound object's
    fields, by ``_instance_state``'s rule (plain data by value at lowering)."""
    constants: list[str] = []
    callees: list[Any] = []
    for layer in unwrapped(obj)[0]:
        if layer.is_method and not is_class(layer.owner):
            fields, code = _instance_state(f"{name}.<self>", layer.owner)
            constants += fields
            callees += code
        for key, value in layer.arguments:
            label = f"{name}.<partial {key}>"
            text = plain_text(value, [_MAX_CONTAINER], 0)
            if text is not None:
                constants.append(f"{label}=={text}")
                callees += _in_container(value) or []
            else:
                fields, code = _instance_state(label, value)
                constants += fields
                callees += code + ([c] if (c := _callee(value)) is not None else [])
    return constants, callees


class _Carried:
    """A partial or bound method held in a module-level container: what it carries
    (``_carried_state``) as a part of its own."""

    def __init__(self, holder: Any) -> None:
        self.holder = holder


def _carried_part(holder: Any) -> _Found:
    name = _name_of(_unwrap(holder))
    carried = _carried_state if carries(holder) else _instance_state
    constants, callees = carried(name, holder)
    constants.sort()
    held = sha("\n".join(constants))[:_STATEMENT_CHARS] if constants else ""
    digest = sha("\n".join([SCHEME, "<carried>", *constants]))
    part = CodePart(f"{name}.<carried>", "?", 0, digest, "", (), held)
    return _Found(part, tuple(callees))


def _builtin_items(obj: Any) -> dict[str, Any]:
    """The items of an instance of a project ``dict`` or ``list`` subclass, as a plain copy
    read by the builtin type's own C methods (no user code runs)."""
    if issubclass(type(obj), dict):
        return {"<items>": dict(dict.items(obj))}
    if issubclass(type(obj), list):
        return {"<items>": list(list.__iter__(obj))}
    return {}


def _module_field(label: str, value: Any) -> list[Any]:
    """A project module held as a field or attribute (``C.mod = helpers``): what is read from
    it goes by another name, not followed, so unseen."""
    if type(value) is _Unseen or module_index(value) is None:
        return []
    why = "a project module held as a field or attribute: what is read from it is not followed"
    return [_Unseen(label, why)]


def _has_fields(kind: type) -> bool:
    """A library's class whose instances may hold the project's code (not a C type's)."""
    module = class_module(kind)
    return module.partition(".")[0] not in ("builtins", "types", "marin", "")


_WEAK_REGISTRIES = (weakref.WeakKeyDictionary, weakref.WeakValueDictionary, weakref.WeakSet)
"""Registries of live objects (state an object keeps about itself: ``_STATE[self] = k``):
run-time state whatever statement made them, so unseen."""


def _weak_registry(name: str) -> _Unseen:
    return _Unseen(name, "a weak-reference registry: run-time state of live objects, not compared")


def _module_value(
    name: str, obj: Any, index: SourceIndex, owner_name: str, namespace: Mapping[str, Any]
) -> tuple[list[str], list[Any]]:
    """A module-level value a function reads: a literal's (``counts_by_value``) by its value at
    lowering, so a later statement that changes it is seen; one computed at import by its
    source, and by its value too when a function puts what it is called with there
    (``SourceIndex.filled``: red team r37). What the value holds that cannot be read is unseen
    (r36-2: ``{}``'s source was all a ``register()`` call left to compare)."""
    by_value = counts_by_value(index, owner_name, namespace)
    if by_value and not bound_at_module_level(index, owner_name, namespace):
        # An import inside the function: what this process has loaded, which another (an
        # isolated one) may not have: plain data only, as both can read it (not a library's
        # C function: ``from json.decoder import scanstring`` resolves only where it is loaded).
        library = c_object_text(obj) is not None
        text = None if library else plain_text(obj, [_MAX_CONTAINER], 0)
        return ([f"{name}=={text}"] if text is not None else []), []
    if by_value:
        return _by_value(name, obj)
    values = constant_source(index, owner_name)
    constants = [f"{name}=" + "|".join(values)] if values else []
    if owner_name in index.filled:  # what a call put there (red team r37-1, r37-2)
        found = _by_value(name, obj)
        return constants + found[0], found[1]
    return constants, []


def _by_value(name: str, obj: Any) -> tuple[list[str], list[Any]]:
    """``name==value`` of a module-level value; what it holds that cannot be read makes it
    unseen (red team r36-2), its plain items still compared."""
    unread: list[str] = []
    text = plain_text(obj, [_MAX_CONTAINER], 0, unread)
    if text is not None and not unread:
        return [f"{name}=={text}"], []
    what = ", ".join(sorted(set(unread))) or f"over {_MAX_CONTAINER} items"
    why = f"a module-level value changed after its statement holds {what}: not compared"
    return ([f"{name}=={text}"] if text is not None else []), [_Unseen(name, why)]


_DYNAMIC_ATTRS = (DYNAMIC, "__dict__", "__globals__")
"""Attributes that reach a namespace by a computed name (``getattr(m, name)``, ``m.__dict__``,
``f.__globals__``)."""
_LOOKUP_ATTRS = ("__getattribute__", "__getattr__")


_Owner = tuple[SourceIndex | None, str, Mapping[str, Any]]
"""Where a module-level name is read from: its module's index (None: not a project module's),
the name, and that module's namespace."""


def _follow(
    chain: tuple[str, ...], obj: Any, rest: tuple[str, ...], owner: _Owner
) -> tuple[Any, _Owner, list[Any]]:
    """What ``obj.rest`` names, the module (``_Owner``) it is read from, and code that reading
    it reaches besides (a class's subclasses)."""
    owner_index, owner_name, owner_scope = owner
    for position, attr in enumerate(rest, len(chain) - len(rest)):
        members = module_namespace(obj)
        prefix = ".".join(c for c in chain[:position] if c != IMPORT)
        if attr in _DYNAMIC_ATTRS:  # getattr(m, name), m.__dict__: not known
            return _dynamic_target(prefix, obj, attr), (None, attr, {}), []
        if attr in _LOOKUP_ATTRS:  # m.__getattribute__(name): as getattr
            unseen = _dynamic_target(prefix, obj, attr)
            if unseen is not None:
                return unseen, (None, attr, {}), []
        if type(obj) is types.SimpleNamespace:
            members = _namespace_dict(obj)
        if members is not None:
            inner = members.get(attr, _MISSING)
            found = module_index(obj) if type(obj) is not types.SimpleNamespace else None
            unreadable = unreadable_module(obj) if found is None else None
            if unreadable is not None:
                why = f"{unreadable}: what it holds is not compared"
                return _Unseen(prefix, why), (None, attr, {}), []
            if inner is _MISSING:  # a module's ``__getattr__`` (PEP 562) decides: its code
                hook = members.get("__getattr__") if found is not None else None
                return (hook if type(hook) is types.FunctionType else obj), (None, attr, {}), []
            owner_index, owner_name, owner_scope, obj = found, attr, members, inner
        elif is_class(obj):
            if attr == "__subclasses__":
                return obj, (None, attr, {}), _subclasses(obj)
            inner = static_attr(obj, attr, _MISSING)
            dynamic = _DYNAMIC_FUNCTIONS.get(id(inner), _MISSING) is inner
            held = module_index(inner) is not None  # ``setattr(Ctx, "mod", helpers)``
            if inner is _MISSING or not (dynamic or held or _is_code(_unwrap(inner))):
                break
            owner_index, obj = None, inner
        else:  # a project module held as a field or a function's attribute: read from it
            inner = _held_module(obj, attr)
            if inner is None:
                break
            owner_index, obj = None, inner
    return obj, (owner_index, owner_name, owner_scope), []


def _held_module(obj: Any, attr: str) -> Any:
    """The project module ``obj`` holds as ``attr`` (``C.mod = helpers``, ``f.m = helpers``),
    read as ``instance_fields`` reads (no user code runs); else None."""
    if type(obj) is types.FunctionType:
        inner = obj.__dict__.get(attr)
    elif is_project_class(type(obj)):
        inner = instance_fields(obj)[0].get(attr)
    else:
        return None
    return inner if module_index(inner) is not None else None


_TYPE_SUBCLASSES = type.__dict__["__subclasses__"]


def _subclasses(cls: type) -> list[Any]:
    """Every subclass of ``cls`` this process has, at any depth (read from the type's own list:
    no user code runs); over ``_MAX_CONTAINER``, unseen."""
    found: list[Any] = []
    stack, seen = [cls], {id(cls)}
    while stack:
        for sub in _TYPE_SUBCLASSES(stack.pop()):
            if id(sub) not in seen:
                seen.add(id(sub))
                found.append(sub)
                stack.append(sub)
        if len(found) > _MAX_CONTAINER:
            why = f"over {_MAX_CONTAINER} subclasses"
            return [_Unseen(f"{TYPE_QUALNAME.__get__(cls, type)}.__subclasses__()", why)]
    return found


def _wrapped_chain(obj: Any) -> list[Any]:
    """The code a callable object that is not a function wraps: what ``__wrapped__`` holds in
    its own namespace or slots (``functools.lru_cache``, a class calling
    ``functools.update_wrapper``), read without running user code (``carried_field``)."""
    found: list[Any] = []
    for _ in range(100):  # a cycle of wrappers ends somewhere
        if type(obj) is types.FunctionType or is_class(obj) or type(obj) is _Unseen:
            break
        inner = carried_field(obj, "__wrapped__")
        if inner is None or any(inner is f for f in found):
            break
        found.append(inner)
        obj = inner
    return [code for code in map(_callee, found) if code is not None]


def _head(
    chain: tuple[str, ...], namespace: Mapping[str, Any], closure: Mapping[str, Any]
) -> tuple[Any, tuple[str, ...]]:
    """The object a reference's head names, and the attributes read from it: a closure's or
    the module's name; a module named by a string (``IMPORT``); ``globals()`` read with a
    computed key (``GLOBALS``), which may reach any function of the module: unseen."""
    head = chain[0]
    if head == GLOBALS:
        return _Unseen("globals()[...]", "it reads globals() by a computed name"), ()
    if head == SUBCLASSES:
        why = "it lists the subclasses of a class known at run time only"
        return _Unseen("<class>.__subclasses__()", why), ()
    if head == IMPORT:  # a relative name is its module's package's (red team r33-4)
        module = absolute_module(chain[1], namespace.get("__package__"))
        if DYNAMIC not in module:
            return _imported(module, None), chain[2:]
        package = module.partition(".")[0]
        if module.startswith(".") or (package != DYNAMIC and is_project_name(package)):
            reason = "it imports a module of the project by a computed name"
            return _Unseen(module.replace(DYNAMIC, "*"), reason), ()
        return _MISSING, ()  # import_module(name): any module, as data (docs: a blind spot)
    found = closure.get(head, _MISSING) if head in closure else namespace.get(head, _MISSING)
    if found is _MISSING:  # a builtin: only those that look code up by a name count
        found = _BUILTIN_HEADS.get(head, _MISSING)
    if found is _MISSING:
        found = _put_in_builtins(head)
    return found, chain[1:]


_BUILTIN_CONSTANTS = (None, True, False, Ellipsis, NotImplemented)


def _put_in_builtins(name: str) -> Any:
    """What a module put into ``builtins`` under ``name`` (``builtins.abs = _abs``: red team
    r50-1): code is followed; a value of plain data (``builtins.print = partial(print,
    flush=True)``: r51-2) is compared by ``_builtin_value``, any other is unseen; ``_MISSING``
    for the interpreter's own."""
    value = _builtin(name)
    if value is _MISSING:
        return _MISSING
    if _callee(value) is not None and (_is_code(_unwrap(value)) or carries(value)):
        return value
    if plain_text(value, [_MAX_CONTAINER], 0) is not None:
        return _MISSING
    return _Unseen(f"builtins.{name}", "a value put into builtins at run time: not compared")


def _builtin_value(name: str) -> list[str]:
    """``builtins.name==text`` of plain data a module put into ``builtins``."""
    value = _builtin(name)
    text = plain_text(value, [_MAX_CONTAINER], 0) if value is not _MISSING else None
    return [f"builtins.{name}=={text}"] if text is not None else []


def _builtin(name: str) -> Any:
    """``builtins.name`` when a module put it there; ``_MISSING`` when it is not there or is
    the interpreter's own (a C function or class, a constant, ``site``'s ``exit``), as the
    engine found it, whichever was imported first."""
    value = vars(builtins).get(name, _MISSING)
    kind = type(value)
    own = (
        kind is types.BuiltinFunctionType
        or (is_class(value) and class_module(value) == "builtins")
        or class_module(kind) == "_sitebuiltins"
        or any(value is constant for constant in _BUILTIN_CONSTANTS)
        or name.startswith("__")
    )
    return _MISSING if own and value is BUILTINS_AT_START.get(name, _MISSING) else value


_DYNAMIC_BUILTINS = {f.__name__: f for f in (getattr, globals, vars, eval, exec, __import__)}
_BUILTIN_HEADS: dict[str, Any] = {**_DYNAMIC_BUILTINS, "object": object, "type": type}
"""Builtins a reference may start with: those that look code up by a name, and the classes
whose ``__getattribute__`` does (``object.__getattribute__(m, name)``)."""
_DYNAMIC_FUNCTIONS: dict[int, Any] = {
    id(f): f
    for f in (
        *_DYNAMIC_BUILTINS.values(), importlib.import_module, importlib.reload,
        importlib.__import__, importlib.util.spec_from_file_location, operator.attrgetter,
        operator.methodcaller, runpy.run_path, runpy.run_module, inspect.getattr_static,
        inspect.getmembers, inspect.getmembers_static, pkgutil.resolve_name,
        vars(object)["__getattribute__"], vars(type)["__getattribute__"],
        vars(types.ModuleType)["__getattribute__"],
    )
}  # fmt: skip
"""What reaches code by a name known at run time: a reference to one of them (an alias, an
argument to ``map``, a call other than the constant shapes ``source._dynamic`` follows) makes
the referring part's code unseen. Keyed by identity: these live as long as the process."""


def _dynamic_target(name: str, obj: Any, how: str = DYNAMIC) -> Any:
    """What ``getattr(obj, <computed name>)`` contributes: unseen when ``obj`` holds the
    project's code (a project module, class or instance, a namespace, a container), else
    nothing (a library's attribute is the environment's business)."""
    if type(obj) is _Unseen:
        return obj
    members = module_namespace(obj)
    if members is not None:
        project = module_index(obj) is not None
    elif one_of(type(obj), _HOLDERS):
        project = True
    else:
        code = _callee(obj)
        project = code is not None and _found(code) is not None
    reason = f"it reads an attribute by a computed name ({'getattr' if how == DYNAMIC else how})"
    return _Unseen(f"{name}.*", reason) if project else None


def _namespace_dict(obj: types.SimpleNamespace) -> dict[str, Any]:
    """A ``SimpleNamespace``'s attributes (its exact type: no user code runs)."""
    found = object.__getattribute__(obj, "__dict__")
    return found if type(found) is dict else {}


# --- the digest ---------------------------------------------------------------------------------

_V = TypeVar("_V")


class _ByObject(Generic[_V]):
    """A cache keyed by an object's identity that does not keep it alive (a
    ``WeakKeyDictionary`` would hash the key: a metaclass or a callable object may define
    ``__hash__``, which is user code)."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref[Any], _V]] = {}

    def get(self, obj: Any) -> _V | None:
        item = self._items.get(id(obj))
        return item[1] if item is not None and item[0]() is obj else None

    def put(self, obj: Any, value: _V) -> None:
        key, items = id(obj), self._items

        def forget(ref: weakref.ref[Any]) -> None:
            if items.get(key, (None,))[0] is ref:
                items.pop(key, None)

        with contextlib.suppress(TypeError):  # not weakly referable (a builtin): not cached
            items[key] = (weakref.ref(obj, forget), value)

    def clear(self) -> None:
        self._items.clear()

    def live(self) -> list[tuple[Any, _V]]:
        """The objects still alive, with their values."""
        pairs = [(ref(), value) for ref, value in list(self._items.values())]
        return [(obj, value) for obj, value in pairs if obj is not None]


_LOCK = threading.RLock()
_PARTS: _ByObject[_Found | None] = _ByObject()
_SYNTAX: _ByObject[_Syntax] = _ByObject()
_NOT_FOLLOWED = _Found(CodePart("", "", 0, None), ())
_DIGESTS: _ByObject[CodeDigest] = _ByObject()
_LIBRARY_CLASSES: _ByObject[tuple[tuple[str, ...], tuple[Any, ...], _Found | None]] = _ByObject()
"""``_patched_library_class`` by class, with the namespace it read."""
_WITH: _ByObject[tuple[tuple[Any, ...], CodeDigest]] = _ByObject()
"""Digests with ``also`` code, by the step function: the last ``also`` it was digested with."""
_MATCHES: _ByObject[tuple[SourceIndex, bool]] = _ByObject()
"""Whether a code object is what a version of its file compiles to."""
_CODES: _ByObject[types.CodeType] = _ByObject()
"""The code object each function digested had: one swapped in place since (``%autoreload``)
makes ``new_lowering`` forget every digest."""


def _found(obj: Any) -> _Found | None:
    known = _PARTS.get(obj)
    if known is not None:
        return None if known is _NOT_FOLLOWED else known
    if type(obj) is types.FunctionType:
        _CODES.put(obj, obj.__code__)
    try:
        result = _find(obj)
    except Exception as exc:  # advisory: a part that cannot be digested is unknown, said once
        name = _name_of(obj)
        reason = f"its digest failed ({type(exc).__name__})"
        warn_once(f"{name}: {reason}")
        result = _Found(_unknown_part(name, "?", 0, reason), ())
    if not (is_class(obj) and (result is None or result.part.name.endswith(_PATCHED))):
        _PARTS.put(obj, _NOT_FOLLOWED if result is None else result)  # (a library class may
    return result  # be patched later: read again)


_C_FUNCTIONS = (
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
)


def _name_of(obj: Any) -> str:
    """A function's or class's qualified name (else its type's), read without running code."""
    if type(obj) is types.FunctionType:
        return str(obj.__code__.co_qualname)
    if one_of(type(obj), _C_FUNCTIONS):  # their names are C-level slots
        return str(obj.__qualname__)
    return str(TYPE_QUALNAME.__get__(obj if is_class(obj) else type(obj), type))


def _walk(root: Any, wrappers: list[Any]) -> Iterator[tuple[CodePart, str | None]]:
    """The root's part, then every callee's (the root's ``wrappers`` first), depth first, each
    once, with who refers to it. A callee's ``_layers`` are followed too: a library's wrapper
    is not, but the project function it wraps is."""
    seen = {id(root)}
    stack: list[tuple[Any, str | None, list[Any]]] = [(root, None, wrappers)]
    while stack:
        obj, via, more = stack.pop()
        found = _found(obj)
        if found is None:
            continue
        yield found.part, via
        callees = [layer for callee in (*more, *found.callees) for layer in _layers(callee)]
        for callee in reversed(callees):
            if id(callee) not in seen:
                seen.add(id(callee))
                stack.append((callee, found.part.name, []))


def code_digest(
    fn: Callable[..., Any] | Any, also: Sequence[Any] = (), runs: Sequence[Any] = ()
) -> CodeDigest:
    """The code digest of a step's function (or callable object, or a spec's ``run``), once per
    object per process (the fields of an object it carries: at each call). ``also``: what else
    runs the step's code: the values of its config (a config object's class: its methods and
    class constants). ``runs``: callables that run with ``fn`` and count as it does, the object
    of a bound method or callable instance by its fields (a handle's ``build_config``: its
    run-time branch makes the config). Never raises and never runs user code: it is advisory,
    so any problem makes it unknown, with one warning."""
    extra: tuple[Any, ...] = ()
    # What partials bind (``partial(gen, cfg=Cfg(1))``, a ``build_config`` too): r33-3, r34-1.
    also = (*also, *_partial_values(fn), *(v for run in runs for v in _partial_values(run)))
    if also or runs:
        try:
            with _LOCK:
                extra = _also_code([*runs, *also])
        except Exception as exc:
            extra = (_Unseen("<config>", f"its digest failed ({type(exc).__name__})"),)
    cached = None if runs else _cached(fn, extra)  # the common case: no lock, no unwrapping
    if cached is not None:
        return cached
    objects: list[Any] = []
    try:
        objects = [
            *bound_objects(_user_callable(fn)),
            *(o for run in runs for o in bound_objects(_user_callable(run))),
        ]
        digest = _root_digest(fn, objects, extra)
    except Exception as exc:
        problem = f"the code of {_name_of(fn)} could not be digested ({type(exc).__name__})"
        warn_once(problem)
        digest = unknown_digest(problem)
    if not objects:  # an object's fields are read at each call: they may have changed
        _cache(fn, extra, digest)
    return digest


def _partial_values(fn: Any) -> tuple[Any, ...]:
    """The arguments the partials behind a step's function bind (``partial(gen, cfg=Cfg(1))``):
    its config as much as ``apply()``'s inputs are, read without running user code."""
    return tuple(v for layer in unwrapped(_user_callable(fn))[0] for _, v in layer.arguments)


def _cached(fn: Any, extra: tuple[Any, ...]) -> CodeDigest | None:
    if not extra:
        return _DIGESTS.get(fn)
    known = _WITH.get(fn)
    if known is None or len(known[0]) != len(extra):
        return None
    return known[1] if all(a is b for a, b in zip(known[0], extra, strict=True)) else None


def _cache(fn: Any, extra: tuple[Any, ...], digest: CodeDigest) -> None:
    if extra:
        _WITH.put(fn, (extra, digest))
    else:
        _DIGESTS.put(fn, digest)


def _also_code(values: Sequence[Any]) -> tuple[Any, ...]:
    """The project's code behind ``values`` (``code_digest``'s ``also``): a function's, and the
    classes of the instances a config holds (their fields' too; in a container of at most
    ``_MAX_CONTAINER`` items); nothing of the engine's."""
    found: dict[int, Any] = {}
    for value in values:
        if _skipped(type(value)):
            continue  # (``OUT``, a handle's placeholder: the engine's)
        kind = id(type(value))
        if kind in _SEQUENCE_IDS and all(id(type(item)) in _SKIPPED for item in value):
            continue  # a step's ``deps``: handles only (``_in_container`` would find nothing)
        function = _step_function(value) if kind not in _HOLDER_IDS else value
        if _is_code(function):
            code = [function]
        elif kind in _HOLDER_IDS:
            code = _in_container(value) or []
        else:
            code = _instance_state("<config>", value)[1]
        for item in code:
            if type(item) is _Unseen or _found(item) is not None:
                found.setdefault(id(item), item)
    return tuple(found.values())


def _root_digest(fn: Any, objects: list[Any], extra: tuple[Any, ...] = ()) -> CodeDigest:
    """``fn``'s digest, with the fields of the ``objects`` it carries (``bound_objects``), and
    the ``extra`` code that runs with it (``code_digest``'s ``also``)."""
    outer = _step_function(fn)
    if not _is_code(outer):
        outer = _callee(outer)
        if outer is None:
            what = _name_of(_unwrap(fn))
            return unknown_digest(f"{what} is a builtin or C function: no Python source")
    with _LOCK:
        cached = None if objects else _cached(outer, extra)  # by the outermost wrapper
        if cached is not None:
            return cached
        layers = _layers(outer)
        root = _innermost(outer)  # the step's own function names the digest
        wrappers = [layer for layer in layers if layer is not root]
        held = [obj if is_class(obj) else _ObjectState(obj) for obj in objects]
        digest = _digest_of(root, wrappers + held + [*extra])  # a classmethod's class: followed
        if not objects:
            _cache(outer, extra, digest)
        return digest


def _innermost(obj: Any) -> Any:
    """The function a chain of ``functools.wraps`` wrappers ends in."""
    for _ in range(100):
        inner = obj.__dict__.get("__wrapped__") if type(obj) is types.FunctionType else None
        if type(inner) is not types.FunctionType:
            break
        obj = inner
    return obj


def _digest_of(root: Any, wrappers: list[Any]) -> CodeDigest:
    parts: list[CodePart] = []
    names: set[str] = set()
    for part, via in _walk(root, wrappers):
        name = part.name
        if name in names:  # one qualname in two files: tell them apart by file (or by order,
            # for the state of objects made at run time: red team r39-2)
            name = f"{name} ({part.file})" if part.file != "?" else f"{name} ({len(names)})"
        names.add(name)
        parts.append(dataclasses.replace(part, name=name, via=via))
    if not parts:
        _, where, qualname, _ = _where(root)
        return unknown_digest(
            f"{qualname} is in an installed package or the standard library "
            f"({display_path(where) if where else 'no file'}): not followed"
        )
    if parts[0].digest is None:
        return CodeDigest(None, (parts[0],), f"{parts[0].name}: {parts[0].unknown}")
    tokens = sorted(p.digest or f"unknown:{p.name}" for p in parts)
    return CodeDigest(sha("\n".join([SCHEME, *tokens])), tuple(parts))


_MODULES_SEEN: set[str] = set()


def _new_project_modules() -> bool:
    """Whether a project module was imported since the last lowering (a notebook cell's
    ``import patches`` may rebind what other modules hold: red team r53-2)."""
    new = sys.modules.keys() - _MODULES_SEEN
    _MODULES_SEEN.update(new)
    if not _PARTS.live():  # nothing digested yet (a command's first lowering): nothing stale
        return False
    return any(is_project_module(name, module_file(sys.modules.get(name))) for name in new)


def new_lowering() -> None:
    """Before a lowering: forget every digest when a source file digested so far was edited
    since (a module reloaded in a notebook, ``importlib.reload``) or a function's code was
    swapped in place (``%autoreload``): a second run in one process digests the code it now
    runs (red team r52-1). Otherwise digests are kept, so a value a step changes while it runs
    (``RESULTS.append(x)``) is not taken for an edit."""
    with _LOCK:
        swapped = any(function.__code__ is not code for function, code in _CODES.live())
        if swapped or _new_project_modules() or sources_changed():
            _forget_digests()


def _forget_digests() -> None:
    """Forget every digest and part (parsed files and their syntax stay: each is checked by
    its file's version when read again)."""
    _PARTS.clear()
    _DIGESTS.clear()
    _WITH.clear()
    _LIBRARY_CLASSES.clear()
    _CODES.clear()


def clear_cache() -> None:
    """Forget every digest and parsed file (tests that edit a source file in place use it)."""
    with _LOCK:
        _forget_digests()
        _SYNTAX.clear()
        _MATCHES.clear()
        clear_source_cache()
