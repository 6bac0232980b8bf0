"""Where a function's source is, and its syntax with comments, docstrings and layout removed.

The code digest (``code_digest.py``) is built from what this module answers: whether a file is
the project's (by location: not the standard library, not an installed package, not the
engine), the parsed source of a file (once per version of the file), and a canonical text of a
definition's syntax tree in which only what the code does counts.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.util
import linecache
import os
import site
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from typing import Any

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


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
    for package in ("marin", "marin_airflow", "marin_prefect"):  # the engine and its adapters
        try:
            spec = importlib.util.find_spec(package)
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


_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


@functools.lru_cache(maxsize=1024)
def _project_root(folder: str) -> str | None:
    """The nearest folder at or above ``folder`` that holds a project marker, if any."""
    current = folder
    while True:
        if any(os.path.exists(os.path.join(current, m)) for m in _ROOT_MARKERS):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


@functools.lru_cache(maxsize=4096)
def display_path(filename: str) -> str:
    """``examples/ngram.py``: relative to the project holding the file (the nearest folder with
    a ``pyproject.toml``, ``setup.py``, ``setup.cfg`` or ``.git``), so every runner, whatever
    its working folder, records the same; else relative to the working folder or the
    ``sys.path`` entry it was imported from, else absolute. Shown only; never part of a digest."""
    path = os.path.abspath(filename)
    root = _project_root(os.path.dirname(path))
    if root is not None:
        return os.path.relpath(path, root).replace(os.sep, "/")
    bases = [os.getcwd(), *sorted((os.path.abspath(p or ".") for p in sys.path), key=len)[::-1]]
    for base in bases:
        if path.startswith(os.path.join(base, "")):
            return os.path.relpath(path, base).replace(os.sep, "/")
    return path


# --- the source index of one file ---------------------------------------------------------------


@dataclass
class SourceIndex:
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


def _index_tree(tree: ast.Module) -> SourceIndex:
    index = SourceIndex()

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


def _index_assignment(statement: ast.stmt, index: SourceIndex) -> None:
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
            index.constants.setdefault(target.id, []).append(dump(value))
        else:
            index.assigned.add(target.id)


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


_INDEX: dict[str, tuple[list[str], SourceIndex | str]] = {}


def source_index(filename: str, module_globals: dict[str, Any] | None) -> SourceIndex | str:
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
    result: SourceIndex | str
    if not lines:
        result = f"its source file {display_path(filename)} cannot be read"
    else:
        try:
            result = _index_tree(ast.parse("".join(lines), filename))
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


References = dict[tuple[str, ...], None]
"""Every ``name`` and ``name.attr.attr`` a definition reads, in order, without repeats."""


def _write(node: Any, out: list[str], refs: References, skip: str = "") -> None:
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
            if name == "body" and isinstance(node, DEFINITIONS):
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


def dump(node: Any, refs: References | None = None) -> str:
    out: list[str] = []
    _write(node, out, {} if refs is None else refs)
    return "".join(out)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def first_line(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> int:
    """The line a code object reports as its first: the first decorator's, if any."""
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def split_definition(node: ast.AST, refs: References) -> tuple[str, list[ast.AST]]:
    """A definition's header (everything but its body) and its body's statements."""
    if isinstance(node, ast.Lambda):
        return dump(node.args, refs), [node.body]
    assert isinstance(node, DEFINITIONS)
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


def constant_source(index: SourceIndex, name: str) -> list[str] | None:
    """The literal source of a module-level constant ``name``, also one imported by name from
    another project module (``from config import SCALE``); None when it is run-time data."""
    if name in index.assigned:
        return None
    values = index.constants.get(name)
    if values is None and name in index.imports:
        module_name, original = index.imports[name]
        module = sys.modules.get(module_name)
        other = module_index(module) if module is not None else None
        if other is not None and original not in other.assigned:
            values = other.constants.get(original)
    return values


def module_index(module: types.ModuleType) -> SourceIndex | None:
    filename = getattr(module, "__file__", None) or ""
    if not is_project_file(filename):
        return None
    index = source_index(filename, vars(module))
    return index if isinstance(index, SourceIndex) else None


def clear_source_cache() -> None:
    """Forget every parsed file and location answer (tests that move files use it)."""
    _INDEX.clear()
    is_project_file.cache_clear()
    display_path.cache_clear()
