"""The code digest of a step's function: what its code is, reported, never identity.

A step's identity is its config and its dependencies' versions (as in Marin, which removed code
from identity because every code edit forked a new path). The code digest sits beside that: a
hash of the normalised syntax tree of ``fn`` and of every function and class of the same project
it refers to, transitively, stored in each record so that a changed function can be reported
like config drift. It never enters a path or a fingerprint.

- **Normalised**: comments, docstrings, formatting and line numbers do not count; the serialiser
  skips empty fields, so the digest does not move between Python versions that only add fields.
- **Same project** is decided by module name (``code_source.is_project_module``), never by
  where the module was imported from: not the standard library, not the engine, not a package
  of an installed distribution other than the project's own. Installed libraries are not
  followed (their version is the environment's business, not the pipeline's).
- **Advisory**: it never raises, blocks or runs user code (types are read with ``type()``,
  attributes from namespaces, never through ``getattr``: a lazy proxy stays unresolved); a
  part that cannot be digested is unknown, with one warning.
- **Module-level constants** a function reads (``SCALE = 3`` at the top of its module) count
  when the source assigns them a literal; a name assigned anything else is run-time data.
- **Unknown** is said, never guessed: a builtin, a function made at run time (``exec``, a
  notebook's ``<string>``), a source file edited since it was imported. A step whose own
  function is unknown has no digest; an unknown callee is named in ``CodeDigest.unseen``.

Computed once per function object per process (``code_digest`` caches by the object), so a
pipeline of 100,000 steps sharing one ``fn`` parses it once. Where the source is and what its
normalised syntax is comes from ``code_source.py``; comparing two digests, from
``code_drift.py``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import re
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from marin.execution.digest.source import (
    References,
    SourceIndex,
    assignment_source,
    clear_source_cache,
    constant_source,
    display_path,
    dump,
    first_line,
    is_project_module,
    is_project_name,
    module_file,
    module_index,
    module_namespace,
    sha,
    source_index,
    split_definition,
    warn_once,
)

SCHEME = "ast3"
"""Stored with every digest; a record of another scheme compares as unknown, never as drift.
``ast2``: which callees are followed is decided by module name (``ast1``: by file location),
so an ``ast1`` record of code that is now followed must not read as drift. ``ast3``: code held
in module-level containers (a registry dict) and modules imported inside a function are
followed, and non-literal module-level assignments count by their source."""
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
_TYPE_MODULE = type.__dict__["__module__"]
_TYPE_QUALNAME = type.__dict__["__qualname__"]
_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_DICT = type.__dict__["__dict__"]
_PARTIAL_FUNC = functools.partial.__dict__["func"]


def _is_class(obj: Any) -> bool:
    return issubclass(type(obj), type)


def _class_module(cls: type) -> str:
    value = _TYPE_MODULE.__get__(cls, type)
    return value if type(value) is str else ""


def _static_attr(cls: type, attr: str) -> Any:
    """``attr`` as the class (or a base) stores it: a descriptor is not called."""
    for klass in _TYPE_MRO.__get__(cls, type):
        namespace = _TYPE_DICT.__get__(klass, type)
        if attr in namespace:
            return namespace[attr]
    return _MISSING


def _unwrap(obj: Any) -> Any:
    """The function whose code runs behind a partial, a bound method or decorators (whose own
    names stay in the function's syntax, so a project decorator is still followed)."""
    for _ in range(100):  # a cycle of __wrapped__ ends somewhere
        kind = type(obj)
        if issubclass(kind, functools.partial):
            obj = _PARTIAL_FUNC.__get__(obj, kind)
        elif kind is types.MethodType:
            obj = obj.__func__
        elif kind is types.FunctionType and type(obj.__dict__.get("__wrapped__")) is kind:
            obj = obj.__dict__["__wrapped__"]
        else:
            break
    return obj


def _step_function(run: Any) -> Any:
    """The user's code behind a spec's ``run``: lowering's wrappers and ``apply()``'s call
    object hold it in the field their class names in ``wraps_field`` (a function may name it
    as ``wrapped_fn``, as ``graph.fn_identity`` reads it)."""
    for _ in range(100):
        kind = type(run)
        if kind is types.FunctionType:
            inner = run.__dict__.get("wrapped_fn", run)
        else:
            name = _static_attr(kind, "wraps_field")
            engine = _class_module(kind).startswith("marin.")
            inner = object.__getattribute__(run, name) if engine and type(name) is str else run
        if inner is run:
            break
        run = inner
    return _unwrap(run)


def _is_code(obj: Any) -> bool:
    return type(obj) is types.FunctionType or _is_class(obj)


def _callee(obj: Any) -> Any:
    """What a referenced object contributes: a function or class of its own, else None."""
    obj = _unwrap(obj)
    if _is_code(obj):
        return obj
    kind = type(obj)
    if obj is None or issubclass(kind, types.ModuleType) or kind is types.BuiltinFunctionType:
        return None
    if _class_module(kind) not in ("builtins", "types"):
        return kind  # an instance (a configured model object): its class is its code
    return None


def _where(obj: Any) -> tuple[str, str, str, Mapping[str, Any]]:
    """``(module name, file, qualified name, namespace)`` of a function or class."""
    if type(obj) is types.FunctionType:
        code = obj.__code__
        module = obj.__module__
        return (module if type(module) is str else "", code.co_filename, code.co_qualname,
                obj.__globals__)  # fmt: skip
    module = _class_module(obj)
    found = sys.modules.get(module)
    namespace = module_namespace(found) or {}
    return module, module_file(found), _TYPE_QUALNAME.__get__(obj, type), namespace


class _Unseen:
    """A callee the digest knows of but cannot read (a project module imported inside a
    function and not imported in this process): an unknown part, never "unchanged"."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason


def _find(obj: Any) -> _Found | None:
    """The part of a function or class; None when it is not the project's (not followed)."""
    if type(obj) is _Unseen:
        return _Found(_unknown_part(obj.name, "?", 0, obj.reason), ())
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
        return None
    file = display_path(filename)
    first = obj.__code__.co_firstlineno if type(obj) is types.FunctionType else 0
    index = source_index(filename)
    if isinstance(index, str):
        return _Found(_unknown_part(qualname, file, first, index), ())
    nodes = _nodes(obj, qualname, index)
    if not nodes:
        reason = "its source does not match the running code (edited since it was imported?)"
        return _Found(_unknown_part(qualname, file, first, reason), ())
    headers, statements, lines = [], [], []
    references: References = {}
    for node in nodes:
        header, body = split_definition(node, references)
        headers.append(header)
        statements += [sha(dump(s, references))[:_STATEMENT_CHARS] for s in body]
        lines += [getattr(s, "lineno", 0) for s in body]
    local = _local_imports(nodes)
    scope = {**namespace, **local} if local else namespace
    constants, callees = _resolve_all(list(references), scope, closure, index)
    header = sha("\n".join(headers))[:_STATEMENT_CHARS]
    constants_hash = sha("\n".join(constants))[:_STATEMENT_CHARS] if constants else ""
    digest = sha("\n".join([SCHEME, header, *statements, constants_hash]))
    line = first_line(nodes[0]) if not isinstance(nodes[0], ast.Lambda) else nodes[0].lineno
    part = CodePart(
        qualname, file, line, digest, header, tuple(statements), constants_hash,
        statement_lines=tuple(lines),
    )  # fmt: skip
    return _Found(part, tuple(callees))


def _local_imports(nodes: list[Any]) -> dict[str, Any]:
    """The names that ``import`` statements inside the definition bind, resolved from
    ``sys.modules`` (never imported here: that would run code). A project module that is not
    imported in this process (kept off the driver) is unseen, so the step's code is unknown."""
    bound: dict[str, Any] = {}
    for node in (n for top in nodes for n in ast.walk(top)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.partition(".")[0]
                module = alias.name if alias.asname else name
                bound[name] = _imported(module, None)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                bound[alias.asname or alias.name] = _imported(module, alias.name)
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
    return sys.modules.get(f"{module}.{attr}", _MISSING) if inner is _MISSING else inner


_CONTAINERS = (dict, list, tuple, set, frozenset)


def _in_container(obj: Any) -> list[Any] | None:
    """The functions and classes a plain dict, list, tuple or set holds, at any depth (a
    registry of tokenizers, a dispatch table); None when it holds over ``_MAX_CONTAINER``
    items (not read: unseen). Only these exact types are read, so no user code runs."""
    found: list[Any] = []
    stack, seen, budget = [obj], {id(obj)}, _MAX_CONTAINER
    while stack:
        current = stack.pop()
        if type(current) not in _CONTAINERS:
            continue
        items = [*current.keys(), *current.values()] if type(current) is dict else [*current]
        budget -= len(items)
        if budget < 0:
            return None
        for item in items:
            if type(item) in _CONTAINERS and id(item) not in seen:
                seen.add(id(item))
                stack.append(item)
            elif type(item) is _Unseen or _is_code(_unwrap(item)):
                found.append(_unwrap(item))
    return found


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (the name is assigned after the closure is made)
        return _MISSING


def _unknown_part(name: str, file: str, line: int, reason: str) -> CodePart:
    return CodePart(name, file, line, None, unknown=reason)


def _nodes(obj: Any, qualname: str, index: SourceIndex) -> list[Any]:
    """The definition(s) of ``obj`` in its file. Several candidates (two lambdas on one line,
    a class defined in two branches) are hashed together: over-eager, never blind."""
    if _is_class(obj):
        return list(index.classes.get(qualname, []))
    code = obj.__code__
    if qualname.endswith("<lambda>"):
        names = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
        found = index.lambdas.get(code.co_firstlineno, [])
        matching = [n for n in found if _lambda_args(n) == names]
        return matching or found
    return [n for n in index.functions.get(qualname, []) if first_line(n) == code.co_firstlineno]


def _lambda_args(node: ast.Lambda) -> list[str]:
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _resolve_all(
    references: list[tuple[str, ...]],
    namespace: Mapping[str, Any],
    closure: Mapping[str, Any],
    index: SourceIndex,
) -> tuple[list[str], list[Any]]:
    """The literal constants (``name=dump``) and the callee objects that ``references`` name."""
    constants: list[str] = []
    callees: dict[int, Any] = {}
    for chain in references:
        head = chain[0]
        obj = closure.get(head, _MISSING) if head in closure else namespace.get(head, _MISSING)
        if obj is _MISSING:
            continue  # a builtin, a local or a name not yet bound
        owner_index: SourceIndex | None = index if head not in closure else None
        owner_name = head
        for attr in chain[1:]:
            members = module_namespace(obj)
            if members is not None:
                inner = members.get(attr, _MISSING)
                if inner is _MISSING:
                    break
                found = module_index(obj)
                owner_index, owner_name, obj = found, attr, inner
            elif _is_class(obj):
                inner = _static_attr(obj, attr)
                if inner is _MISSING or not _is_code(_unwrap(inner)):
                    break
                owner_index, obj = None, inner
            else:
                break
        held = _in_container(obj)  # also a literal: `TOKENIZERS = {}` is filled at import
        if held is None:
            held = [_Unseen(".".join(chain), f"a container of over {_MAX_CONTAINER} items")]
        target = obj if type(obj) is _Unseen else _callee(obj)
        for code in [target, *held] if target is not None else held:
            callees.setdefault(id(code), code)
        if target is None and owner_index is not None and module_namespace(obj) is None:
            values = constant_source(owner_index, owner_name)
            if values:
                constants.append(f"{'.'.join(chain)}=" + "|".join(values))
        source = assignment_source(owner_index, owner_name) if owner_index is not None else None
        if source:
            constants.append(f"{'.'.join(chain)}:=" + "|".join(source))
    return constants, list(callees.values())


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


_LOCK = threading.RLock()
_PARTS: _ByObject[_Found | None] = _ByObject()
_NOT_FOLLOWED = _Found(CodePart("", "", 0, None), ())
_DIGESTS: _ByObject[CodeDigest] = _ByObject()


def _found(obj: Any) -> _Found | None:
    known = _PARTS.get(obj)
    if known is not None:
        return None if known is _NOT_FOLLOWED else known
    try:
        result = _find(obj)
    except Exception as exc:  # advisory: a part that cannot be digested is unknown, said once
        name = _name_of(obj)
        reason = f"its digest failed ({type(exc).__name__})"
        warn_once(f"{name}: {reason}")
        result = _Found(_unknown_part(name, "?", 0, reason), ())
    _PARTS.put(obj, _NOT_FOLLOWED if result is None else result)
    return result


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
    if type(obj) in _C_FUNCTIONS:  # their names are C-level slots
        return str(obj.__qualname__)
    return str(_TYPE_QUALNAME.__get__(obj if _is_class(obj) else type(obj), type))


def _walk(root: Any) -> Iterator[tuple[CodePart, str | None]]:
    """The root's part, then every callee's, depth first, each once, with who refers to it."""
    seen = {id(root)}
    stack: list[tuple[Any, str | None]] = [(root, None)]
    while stack:
        obj, via = stack.pop()
        found = _found(obj)
        if found is None:
            continue
        yield found.part, via
        for callee in reversed(found.callees):
            if id(callee) not in seen:
                seen.add(id(callee))
                stack.append((callee, found.part.name))


def code_digest(fn: Callable[..., Any] | Any) -> CodeDigest:
    """The code digest of a step's function (or callable object, or a spec's ``run``), once per
    object per process. Never raises and never runs user code: it is advisory, so any problem
    makes it unknown, with one warning."""
    cached = _DIGESTS.get(fn)  # the common case, without unwrapping or the lock
    if cached is not None:
        return cached
    try:
        digest = _root_digest(fn)
    except Exception as exc:
        problem = f"the code of {_name_of(fn)} could not be digested ({type(exc).__name__})"
        warn_once(problem)
        digest = unknown_digest(problem)
    _DIGESTS.put(fn, digest)
    return digest


def _root_digest(fn: Any) -> CodeDigest:
    root = _step_function(fn)
    if not _is_code(root):
        root = _callee(root)
        if root is None:
            what = _name_of(_unwrap(fn))
            return unknown_digest(f"{what} is a builtin or C function: no Python source")
    with _LOCK:
        cached = _DIGESTS.get(root)
        if cached is not None:
            return cached
        digest = _digest_of(root)
        _DIGESTS.put(root, digest)
        return digest


def _digest_of(root: Any) -> CodeDigest:
    parts: list[CodePart] = []
    names: set[str] = set()
    for part, via in _walk(root):
        name = part.name
        if name in names:  # one qualname in two files: tell them apart by file
            name = f"{name} ({part.file})"
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


def clear_cache() -> None:
    """Forget every digest and parsed file (tests that edit a source file in place use it)."""
    with _LOCK:
        _PARTS.clear()
        _DIGESTS.clear()
        clear_source_cache()
