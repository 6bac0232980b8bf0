"""The code digest of a step's function: what its code is, reported, never identity.

A step's identity is its config and its dependencies' versions (as in Marin, which removed code
from identity because every code edit forked a new path). The code digest sits beside that: a
hash of the normalised syntax tree of ``fn`` and of every function and class of the same project
it refers to, transitively, stored in each record so that a changed function can be reported
like config drift. It never enters a path or a fingerprint.

- **Normalised**: comments, docstrings, formatting and line numbers do not count; the serialiser
  skips empty fields, so the digest does not move between Python versions that only add fields.
- **Same project** is decided by file location: a ``.py`` file that is not under the standard
  library, any ``site-packages``/``dist-packages`` folder or the engine's own packages. Installed
  packages are not followed (their version is the environment's business, not the pipeline's).
- **Module-level constants** a function reads (``SCALE = 3`` at the top of its module) count
  when the source assigns them a literal; a name assigned anything else is run-time data.
- **Unknown** is said, never guessed: a builtin, a function made at run time (``exec``, a
  notebook's ``<string>``), a source file edited since it was imported. A step whose own
  function is unknown has no digest; an unknown callee is named in ``CodeDigest.unseen``.

Computed once per function object per process (``code_digest`` caches by the object), so a
pipeline of 100,000 steps sharing one ``fn`` parses it once.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import linecache
import os
import re
import site
import sys
import sysconfig
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEME = "ast1"
"""Stored with every digest; a record of another scheme compares as unknown, never as drift."""
_STATEMENT_CHARS = 12
_MAX_PARTS = 10_000
_MAX_TEXT = 1_000
_HEX = re.compile(r"^[0-9a-f]+$")
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


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


# --- what counts as the project ---------------------------------------------------------------


def _folder(path: str) -> str:
    return os.path.join(os.path.normcase(os.path.abspath(path)), "")


@functools.cache
def _outside_roots() -> tuple[str, ...]:
    """Folders whose code is not the project's: the standard library, installed packages, and
    the engine itself (an engine upgrade is not a change to a step's code)."""
    roots: set[str] = set()
    for variables in (None, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        paths = sysconfig.get_paths(vars=variables) if variables else sysconfig.get_paths()
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            if paths.get(key):
                roots.add(paths[key])
    with contextlib.suppress(AttributeError):  # some virtualenv builds have no getsitepackages
        roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    here = os.path.dirname(os.path.abspath(__file__))
    roots.add(os.path.dirname(here))  # the marin package
    for adapter in ("marin_airflow", "marin_prefect"):
        try:
            spec = importlib.util.find_spec(adapter)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            roots.add(location)
    out: set[str] = set()
    for root in roots:
        out.add(_folder(root))
        out.add(_folder(os.path.realpath(root)))
    return tuple(sorted(out))


@functools.lru_cache(maxsize=4096)
def is_project_file(filename: str) -> bool:
    """Whether code in ``filename`` belongs to the project (and is followed): by location only."""
    if not filename or filename.startswith("<") or not filename.endswith(".py"):
        return False
    path = os.path.normcase(os.path.abspath(filename))
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    real = os.path.normcase(os.path.realpath(filename))
    return not any(path.startswith(r) or real.startswith(r) for r in _outside_roots())


@functools.lru_cache(maxsize=4096)
def display_path(filename: str) -> str:
    """``examples/ngram.py``: relative to the working folder, else to the ``sys.path`` entry it
    was imported from, else absolute. Shown only; never part of a digest."""
    path = os.path.abspath(filename)
    bases = [os.getcwd(), *sorted((os.path.abspath(p or ".") for p in sys.path), key=len)[::-1]]
    for base in bases:
        if path.startswith(os.path.join(base, "")):
            return os.path.relpath(path, base).replace(os.sep, "/")
    return path


# --- the source index of one file ---------------------------------------------------------------


@dataclass
class _SourceIndex:
    """One parsed project file: its functions, classes and lambdas by name or line, and the
    literal values its top level assigns."""

    functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = field(default_factory=dict)
    classes: dict[str, list[ast.ClassDef]] = field(default_factory=dict)
    lambdas: dict[int, list[ast.Lambda]] = field(default_factory=dict)
    constants: dict[str, list[str]] = field(default_factory=dict)
    assigned: set[str] = field(default_factory=set)
    """Top-level names assigned anything but a literal (run-time data, not code)."""
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Top-level ``from module import name [as alias]``: alias -> (module, name)."""


def _index_source(tree: ast.Module) -> _SourceIndex:
    index = _SourceIndex()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                qualname = prefix + child.name
                index.functions.setdefault(qualname, []).append(child)
                visit(child, qualname + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                qualname = prefix + child.name
                index.classes.setdefault(qualname, []).append(child)
                visit(child, qualname + ".")
            else:
                if isinstance(child, ast.Lambda):
                    index.lambdas.setdefault(child.lineno, []).append(child)
                visit(child, prefix)

    visit(tree, "")
    for statement in tree.body:
        _index_assignment(statement, index)
    return index


def _index_assignment(statement: ast.stmt, index: _SourceIndex) -> None:
    if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
        for alias in statement.names:
            index.imports[alias.asname or alias.name] = (statement.module, alias.name)
        return
    if isinstance(statement, ast.Assign):
        targets, value = statement.targets, statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        targets, value = [statement.target], statement.value
    elif isinstance(statement, ast.AugAssign):
        targets, value = [statement.target], None
    else:
        return
    for target in targets:
        if not isinstance(target, ast.Name):
            continue
        literal = value is not None and len(targets) == 1 and _is_literal(value)
        if literal and value is not None:
            index.constants.setdefault(target.id, []).append(_dump(value))
        else:
            index.assigned.add(target.id)


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


_INDEX: dict[str, tuple[list[str], _SourceIndex | str]] = {}


def _source_index(filename: str, module_globals: dict[str, Any] | None) -> _SourceIndex | str:
    """The parsed file, once per version of it; a string says why there is none.

    ``linecache`` re-reads a file whose size or modification time changed (one ``stat``), and
    hands out the same list of lines while it did not: a file is parsed again only after an
    edit, so a long-lived process (an Airflow DAG processor, a notebook) that re-imports a
    module digests the code it now runs.
    """
    linecache.checkcache(filename)
    lines = linecache.getlines(
        filename, module_globals if isinstance(module_globals, dict) else None
    )
    known = _INDEX.get(filename)
    if known is not None and known[0] is lines:
        return known[1]
    result: _SourceIndex | str
    if not lines:
        result = f"its source file {display_path(filename)} cannot be read"
    else:
        try:
            result = _index_source(ast.parse("".join(lines), filename))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            result = f"its source file {display_path(filename)} does not parse"
    _INDEX[filename] = (lines, result)
    return result


# --- normalised syntax --------------------------------------------------------------------------


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


_References = dict[tuple[str, ...], None]
"""Every ``name`` and ``name.attr.attr`` a definition reads, in order, without repeats."""


def _write(node: Any, out: list[str], refs: _References, skip: str = "") -> None:
    """A canonical text of ``node`` (field names and values, no positions, no docstrings),
    collecting the names it reads into ``refs`` on the way (one pass over the tree).

    ``skip`` names a field of ``node`` itself to leave out (a definition's body, for its header).
    Locals that shadow a global are taken for the global: that can only add a callee (a
    spurious report when it changes), never hide one.
    """
    if isinstance(node, ast.AST):
        if isinstance(node, ast.Name | ast.Attribute):
            chain = _chain(node)
            if chain:
                refs.setdefault(chain, None)
        out.append(type(node).__name__)
        out.append("(")
        for name in node._fields:
            if name == "type_comment" or name == skip:
                continue
            value = getattr(node, name, None)
            if name == "body" and isinstance(node, _DEFS):
                value = _without_docstring(node.body)
            if value is None or value == []:
                continue  # fields a later Python adds (type_params=[]) do not move the digest
            out.append(name)
            out.append("=")
            _write(value, out, refs)
            out.append(",")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _write(item, out, refs)
            out.append(",")
        out.append("]")
    else:
        out.append(repr(node))


def _dump(node: Any, refs: _References | None = None) -> str:
    out: list[str] = []
    _write(node, out, {} if refs is None else refs)
    return "".join(out)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _first_line(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> int:
    """The line a code object reports as its first: the first decorator's, if any."""
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def _split(node: ast.AST, refs: _References) -> tuple[str, list[ast.AST]]:
    """A definition's header (everything but its body) and its body's statements."""
    if isinstance(node, ast.Lambda):
        return _dump(node.args, refs), [node.body]
    assert isinstance(node, _DEFS)
    out: list[str] = []
    _write(node, out, refs, skip="body")
    return "".join(out), list(_without_docstring(node.body))


# --- names a definition refers to ---------------------------------------------------------------


def _chain(node: ast.AST) -> tuple[str, ...] | None:
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return (node.id, *reversed(attrs))
    return None


# --- the parts ----------------------------------------------------------------------------------

_MISSING = object()


@dataclass(frozen=True)
class _Found:
    """A part and the objects it refers to (resolved in its own namespace)."""

    part: CodePart
    callees: tuple[Any, ...]


def _unwrap(obj: Any) -> Any:
    """The function whose code runs behind a partial, a bound method or decorators (whose own
    names stay in the function's syntax, so a project decorator is still followed)."""
    for _ in range(100):  # a cycle of __wrapped__ ends somewhere
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif isinstance(obj, types.MethodType):
            obj = obj.__func__
        elif isinstance(obj, types.FunctionType) and isinstance(
            getattr(obj, "__wrapped__", None), types.FunctionType
        ):
            obj = obj.__wrapped__  # type: ignore[attr-defined]
        else:
            break
    return obj


def _step_function(run: Any) -> Any:
    """The user's code behind a spec's ``run``: lowering's wrappers and ``apply()``'s call
    object name it as ``wrapped_fn`` (as ``graph.fn_identity`` reads it)."""
    for _ in range(100):
        inner = getattr(run, "wrapped_fn", run) if not isinstance(run, type) else run
        if inner is run:
            break
        run = inner
    return _unwrap(run)


def _is_code(obj: Any) -> bool:
    return isinstance(obj, types.FunctionType | type)


def _callee(obj: Any) -> Any:
    """What a referenced object contributes: a function or class of its own, else None."""
    obj = _unwrap(obj)
    if _is_code(obj):
        return obj
    if isinstance(obj, types.ModuleType | types.BuiltinFunctionType) or obj is None:
        return None
    kind = type(obj)
    if isinstance(kind, type) and kind.__module__ not in ("builtins", "types"):
        return kind  # an instance (a configured model object): its class is its code
    return None


def _module_file(obj: Any) -> tuple[str, Mapping[str, Any] | None]:
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    return (getattr(module, "__file__", None) or "", vars(module) if module else None)


def _find(obj: Any) -> _Found | None:
    """The part of a function or class; None when it is not the project's (not followed)."""
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        filename = code.co_filename
        qualname = code.co_qualname
        namespace: Mapping[str, Any] = obj.__globals__
        closure = dict(
            zip(code.co_freevars, (_cell(c) for c in obj.__closure__ or ()), strict=False)
        )
    else:
        filename, module_globals = _module_file(obj)
        qualname = obj.__qualname__
        namespace = module_globals or {}
        closure = {}
    if filename.startswith("<"):
        return _Found(_unknown_part(qualname, filename, 0, f"defined at run time ({filename})"), ())
    if not is_project_file(filename):
        return None
    file = display_path(filename)
    first = obj.__code__.co_firstlineno if isinstance(obj, types.FunctionType) else 0
    index = _source_index(filename, namespace if isinstance(namespace, dict) else None)
    if isinstance(index, str):
        return _Found(_unknown_part(qualname, file, first, index), ())
    nodes = _nodes(obj, qualname, index)
    if not nodes:
        reason = "its source does not match the running code (edited since it was imported?)"
        return _Found(_unknown_part(qualname, file, first, reason), ())
    headers, statements, lines = [], [], []
    references: _References = {}
    for node in nodes:
        header, body = _split(node, references)
        headers.append(header)
        statements += [_sha(_dump(s, references))[:_STATEMENT_CHARS] for s in body]
        lines += [getattr(s, "lineno", 0) for s in body]
    constants, callees = _resolve_all(list(references), namespace, closure, index)
    header = _sha("\n".join(headers))[:_STATEMENT_CHARS]
    constants_hash = _sha("\n".join(constants))[:_STATEMENT_CHARS] if constants else ""
    digest = _sha("\n".join([SCHEME, header, *statements, constants_hash]))
    line = _first_line(nodes[0]) if not isinstance(nodes[0], ast.Lambda) else nodes[0].lineno
    part = CodePart(
        qualname, file, line, digest, header, tuple(statements), constants_hash,
        statement_lines=tuple(lines),
    )  # fmt: skip
    return _Found(part, tuple(callees))


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (the name is assigned after the closure is made)
        return _MISSING


def _unknown_part(name: str, file: str, line: int, reason: str) -> CodePart:
    return CodePart(name, file, line, None, unknown=reason)


def _nodes(obj: Any, qualname: str, index: _SourceIndex) -> list[Any]:
    """The definition(s) of ``obj`` in its file. Several candidates (two lambdas on one line,
    a class defined in two branches) are hashed together: over-eager, never blind."""
    if isinstance(obj, type):
        return list(index.classes.get(qualname, []))
    code = obj.__code__
    if qualname.endswith("<lambda>"):
        names = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
        found = index.lambdas.get(code.co_firstlineno, [])
        matching = [n for n in found if _lambda_args(n) == names]
        return matching or found
    return [n for n in index.functions.get(qualname, []) if _first_line(n) == code.co_firstlineno]


def _lambda_args(node: ast.Lambda) -> list[str]:
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _resolve_all(
    references: list[tuple[str, ...]],
    namespace: Mapping[str, Any],
    closure: Mapping[str, Any],
    index: _SourceIndex,
) -> tuple[list[str], list[Any]]:
    """The literal constants (``name=dump``) and the callee objects that ``references`` name."""
    constants: list[str] = []
    callees: dict[int, Any] = {}
    for chain in references:
        head = chain[0]
        obj = closure.get(head, _MISSING) if head in closure else namespace.get(head, _MISSING)
        if obj is _MISSING:
            continue  # a builtin, a local or a name not yet bound
        owner_index: _SourceIndex | None = index if head not in closure else None
        owner_name = head
        for attr in chain[1:]:
            if isinstance(obj, types.ModuleType):
                inner = vars(obj).get(attr, _MISSING)
                if inner is _MISSING:
                    break
                found = _module_index(obj)
                owner_index, owner_name, obj = found, attr, inner
            elif isinstance(obj, type):
                inner = _static_attr(obj, attr)
                if inner is _MISSING or not _is_code(_unwrap(inner)):
                    break
                owner_index, obj = None, inner
            else:
                break
        target = _callee(obj)
        if target is not None:
            callees.setdefault(id(target), target)
        elif owner_index is not None and not isinstance(obj, types.ModuleType):
            values = _constant(owner_index, owner_name)
            if values:
                constants.append(f"{'.'.join(chain)}=" + "|".join(values))
    return constants, list(callees.values())


def _constant(index: _SourceIndex, name: str) -> list[str] | None:
    """The literal source of a module-level constant ``name``, also one imported by name from
    another project module (``from config import SCALE``); None when it is run-time data."""
    if name in index.assigned:
        return None
    values = index.constants.get(name)
    if values is None and name in index.imports:
        module_name, original = index.imports[name]
        module = sys.modules.get(module_name)
        other = _module_index(module) if module is not None else None
        if other is not None and original not in other.assigned:
            values = other.constants.get(original)
    return values


def _static_attr(cls: type, attr: str) -> Any:
    for klass in cls.__mro__:
        if attr in vars(klass):
            return vars(klass)[attr]
    return _MISSING


def _module_index(module: types.ModuleType) -> _SourceIndex | None:
    filename = getattr(module, "__file__", None) or ""
    if not is_project_file(filename):
        return None
    index = _source_index(filename, vars(module))
    return index if isinstance(index, _SourceIndex) else None


# --- the digest ---------------------------------------------------------------------------------

_LOCK = threading.RLock()
_PARTS: weakref.WeakKeyDictionary[Any, _Found | None] = weakref.WeakKeyDictionary()
_DIGESTS: weakref.WeakKeyDictionary[Any, CodeDigest] = weakref.WeakKeyDictionary()


def _found(obj: Any) -> _Found | None:
    try:
        return _PARTS[obj]
    except KeyError:
        pass
    result = _find(obj)
    _PARTS[obj] = result
    return result


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
    object per process."""
    try:
        cached = _DIGESTS.get(fn)  # the common case, without unwrapping or the lock
    except TypeError:  # not weakly referable (a builtin): never cached, said unknown below
        cached = None
    if cached is not None:
        return cached
    root = _step_function(fn)
    if not _is_code(root):
        root = _callee(root)
        if root is None:
            what = getattr(fn, "__qualname__", None) or type(fn).__qualname__
            return unknown_digest(f"{what} is a builtin or C function: no Python source")
    with _LOCK:
        cached = _DIGESTS.get(root)
        if cached is not None:
            return cached
        digest = _digest_of(root)
        _DIGESTS[root] = digest
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
        where = _module_file(root)[0] or getattr(getattr(root, "__code__", None), "co_filename", "")
        return unknown_digest(
            f"{root.__qualname__} is in an installed package or the standard library "
            f"({display_path(where) if where else 'no file'}): not followed"
        )
    if parts[0].digest is None:
        return CodeDigest(None, (parts[0],), f"{parts[0].name}: {parts[0].unknown}")
    tokens = sorted(p.digest or f"unknown:{p.name}" for p in parts)
    return CodeDigest(_sha("\n".join([SCHEME, *tokens])), tuple(parts))


def clear_cache() -> None:
    """Forget every digest and parsed file (tests that edit a source file in place use it)."""
    with _LOCK:
        _PARTS.clear()
        _DIGESTS.clear()
        _INDEX.clear()
        is_project_file.cache_clear()
        display_path.cache_clear()


# --- what changed -------------------------------------------------------------------------------


def code_drifted(stored: CodeDigest, current: CodeDigest) -> bool:
    """Both digests known, of one scheme, and different: the only case reported as drift."""
    return (
        stored.digest is not None
        and current.digest is not None
        and stored.scheme == current.scheme
        and stored.digest != current.digest
    )


def explain_code_drift(stored: CodeDigest, current: CodeDigest, limit: int = 20) -> list[str]:
    """One line per changed part, ``code: train_model changed (examples/ngram.py, line 42)``;
    a callee says so: ``code: tokenize changed (examples/ngram.py, line 17), called by
    train_model``. Empty when nothing is reported as drift."""
    if not code_drifted(stored, current):
        return []
    before = {p.name: p for p in stored.parts}
    now = {p.name for p in current.parts}
    lines: list[str] = []
    for part in current.parts:
        old = before.get(part.name)
        if old is None:
            lines.append(f"code: {part.via or part.name} now calls {part.name} ({_where(part)})")
        elif old.digest != part.digest and old.digest is not None and part.digest is not None:
            line, why = _changed_line(old, part)
            text = f"code: {part.name} changed ({part.file}, line {line}{why})"
            lines.append(text + (f", called by {part.via}" if part.via else ""))
    for old in stored.parts:
        if old.name not in now:
            lines.append(f"code: {old.via or current.name} no longer calls {old.name}")
    if not lines:
        lines.append(f"code: {current.name} changed")
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more changed part(s)"]
    return lines


def _where(part: CodePart) -> str:
    return f"{part.file}, line {part.line}"


def _changed_line(old: CodePart, new: CodePart) -> tuple[int, str]:
    """The current line of the first difference, and a note when it is not in the syntax."""
    if old.header != new.header:
        return new.line, ""
    for i, statement in enumerate(new.statements):
        if i >= len(old.statements) or old.statements[i] != statement:
            return (new.statement_lines[i] if i < len(new.statement_lines) else new.line), ""
    if len(old.statements) > len(new.statements):
        last = new.statement_lines[-1] if new.statement_lines else new.line
        return last, ": statements removed at the end"
    return new.line, ": a module-level constant it reads"
