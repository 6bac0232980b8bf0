"""Where a function's source is, and its syntax with comments and layout removed.

The code digest (``code_digest.py``) is built from what this module answers: whether a module is
the project's (not the standard library, not an installed package, not the engine),
the parsed source of a file (once per version of the file), and a canonical text of a
definition's syntax tree in which only what the code does counts.
"""

from __future__ import annotations
import __future__

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import io
import linecache
import logging
import operator
import os
import re
import stat
import sys
import sysconfig
import threading
import tokenize
import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from marin.execution.digest.instance import class_module

log = logging.getLogger("marin")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


# --- what counts as the project ---------------------------------------------------------------


_ENGINE = frozenset({"marin", "marin_airflow", "marin_prefect"})
"""The engine's own packages: an engine upgrade is not a change to a step's code."""


def _normalise(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _providers(top: str) -> frozenset[str]:
    """The (normalised) installed distributions that provide the top-level module ``top``."""
    return _providers_on(top, tuple(sys.path))


@functools.lru_cache(maxsize=1024)
def _providers_on(top: str, path: tuple[str, ...]) -> frozenset[str]:
    """What ``importlib.metadata.packages_distributions()`` maps ``top`` to on ``path``, with
    that function's own rule: a distribution's ``top_level.txt``, else the modules its file
    list holds. Asked one name at a time, so a plan does not read every distribution's file
    list and metadata (a tenth of a second) to learn about the few modules its steps use: a
    file list that does not mention ``top`` at all cannot provide it."""
    inferred = getattr(importlib.metadata, "_top_level_inferred", None)
    try:
        if inferred is None:  # another Python's internals: the whole map, as documented
            found = importlib.metadata.packages_distributions().get(top, [])
            return frozenset(_normalise(d) for d in found)
        names = set()
        for dist in importlib.metadata.distributions(path=list(path)):
            declared = (dist.read_text("top_level.txt") or "").split()
            if declared:
                provides = top in declared
            else:
                listing = dist.read_text("RECORD")  # else a legacy egg-info list: read it all
                provides = (listing is None or top in listing) and top in inferred(dist)
            if provides:
                names.add(_normalise(dist.metadata["Name"]))
    except Exception:  # a broken distribution's metadata: nothing is known to be installed
        return frozenset()
    return frozenset(names)


@functools.lru_cache(maxsize=16)
def _own_distributions(folder: str) -> frozenset[str]:
    """The project's own distribution: ``[project] name`` of the ``pyproject.toml`` nearest
    ``folder`` (the working folder), if any: installed as a wheel in CI, it is still the
    project's code."""
    root = _project_root(folder)
    path = os.path.join(root, "pyproject.toml") if root else ""
    try:
        with open(path, "rb") as f:
            name = tomllib.load(f).get("project", {}).get("name")
    except (OSError, ValueError, AttributeError):
        return frozenset()
    return frozenset({_normalise(name)}) if isinstance(name, str) else frozenset()


@functools.lru_cache(maxsize=4096)
def is_project_module(module: str, filename: str) -> bool:
    """Whether code of ``module`` (defined in ``filename``) is the project's, and followed.

    Not the standard library, not the engine, and not a package an installed distribution
    provides, unless that distribution is the project's own, so a package imported from a
    checkout and the same package installed as a wheel are followed alike. A module whose name
    an installed distribution claims is that distribution's only when its file is where that
    distribution is installed: a project's own ``tools.py`` is the project's even when a wheel
    also ships a top-level ``tools``. Only Python source files are followed.
    """
    if not filename.endswith(".py") or filename.startswith("<") or _not_followed(module, filename):
        return False
    if not _in_site_folder(filename):
        return True  # no distribution is installed there: none is asked (a scan of them all)
    providers = _foreign_providers(module, filename)
    return not providers or not _installed_file(filename, providers)


def _not_followed(module: str, filename: str | None) -> bool:
    """The standard library and the engine. A module with a standard-library name is the
    standard library's only when it is loaded from the interpreter's library folder: a
    project's ``statistics.py`` is the project's."""
    top = module.partition(".")[0]
    if not top:  # code with no module name (``exec`` of a file into ``{}``): by its file alone
        # (red team r41-1: it was taken for library code, so never compared)
        files = (_stdlib_file, _in_site_folder, _engine_file)
        return filename is None or any(found(filename) for found in files)
    if top in _ENGINE:
        return True
    return top in sys.stdlib_module_names and _stdlib_file(filename or _loaded_file(top))


def _foreign_providers(module: str, filename: str | None = None) -> frozenset[str] | None:
    """None for the standard library and the engine; else the installed distributions other
    than the project's own that provide ``module``'s top-level name (empty: none does)."""
    if _not_followed(module, filename):
        return None
    providers = _providers(module.partition(".")[0])
    try:
        here = os.getcwd()
    except OSError:  # the working folder was deleted: no project of its own
        return providers
    return providers - _own_distributions(here)


def _loaded_file(top: str) -> str | None:
    """The file this process loaded the top-level module ``top`` from; None when it is not
    loaded or has no file (a builtin or frozen module: the standard library's)."""
    found = module_file(sys.modules.get(top))
    return found or None


@functools.lru_cache(maxsize=1)
def _stdlib_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths}
    return tuple(sorted(found))


def _engine_file(filename: str) -> bool:
    path = os.path.realpath(filename)
    for name in _ENGINE:
        for folder in getattr(sys.modules.get(name), "__path__", ()):
            if path.startswith(os.path.join(os.path.realpath(folder), "")):
                return True
    return False


def _stdlib_file(filename: str | None) -> bool:
    """Whether ``filename`` is the standard library's (None: no file, a builtin module); an
    installed package's folder inside the library folder is not."""
    if filename is None or filename.startswith("<"):
        return True
    path = os.path.realpath(filename)
    if f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path:
        return False
    return any(path.startswith(os.path.join(root, "")) for root in _stdlib_folders())


def _in_site_folder(filename: str) -> bool:
    """Whether ``filename`` lies in a folder on ``sys.path`` that holds installed distributions'
    metadata: the only folders ``_roots_on`` can name (``importlib.metadata`` finds a
    distribution there and locates its files from there), so a file anywhere else is no
    distribution's. An entry that is not a folder (a zip) counts as one."""
    try:
        here = os.getcwd()
    except OSError:  # the working folder was deleted: the distributions are asked
        return True
    path = tuple(os.path.join(here, entry) for entry in sys.path)
    real = os.path.realpath(filename)
    return any(real.startswith(folder) for folder in _site_folders(path))


@functools.lru_cache(maxsize=16)
def _site_folders(path: tuple[str, ...]) -> tuple[str, ...]:
    found = []
    for entry in path:
        try:
            names = os.listdir(entry)
        except NotADirectoryError:
            names = [".dist-info"]  # a zip on sys.path: may hold distributions
        except OSError:
            continue
        if any(n.endswith((".dist-info", ".egg-info")) or n == "EGG-INFO" for n in names):
            found.append(os.path.join(os.path.realpath(entry), ""))
    return tuple(found)


def _installed_file(filename: str, distributions: frozenset[str]) -> bool:
    """Whether ``filename`` lies where one of ``distributions`` is installed (its site folder)."""
    path = os.path.realpath(filename)
    roots = (r for d in sorted(distributions) for r in _roots_on(tuple(sys.path), d))
    return any(path.startswith(os.path.join(root, "")) for root in roots)


@functools.lru_cache(maxsize=256)
def _roots_on(path: tuple[str, ...], distribution: str) -> tuple[str, ...]:
    """The folders ``distribution`` is installed in (on one ``sys.path``)."""
    try:
        found = importlib.metadata.distributions(name=distribution, path=list(path))
        return tuple(os.path.realpath(str(d.locate_file(""))) for d in found)
    except Exception:  # broken metadata: say installed everywhere, as the name rule did
        return ("/",)


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


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_once(problem: str) -> None:
    """Log a problem of the code digest once per process (not once per step): code drift is
    advisory, so a problem makes a part unknown and is said, never raised."""
    with _WARNED_LOCK:
        if problem in _WARNED or len(_WARNED) > 1000:
            return
        _WARNED.add(problem)
    log.warning("code digest: %s; code drift is not checked there", problem)


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
    """Names the module's statements (or a function, under ``global``) assign anything but a
    literal, and ``Class.attr`` set so after the class: run-time data, counted by source."""
    filled: set[str] = field(default_factory=set)
    """Module-level names a function sets from what it is called with: under ``global``
    (``configure(0.1)``: ``LR = lr``), or an item of (``register("lr", 0.1)``: ``T[k] = v``,
    ``T.append(v)``). What a call puts there its statements' source does not show, so their
    value counts too (red team r37-1, r37-2)."""
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Top-level ``from module import name [as alias]``: alias -> (module, name)."""
    relative_imports: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Top-level ``from .m import name``: alias -> (``.m``, name), resolved against the
    module's package where it is read (a package ``__init__``'s re-export: red team r45-3)."""
    star_imports: list[str] = field(default_factory=list)
    """Top-level ``from module import *``: the modules, in source order."""
    sources: dict[str, list[str]] = field(default_factory=dict)
    """The source of each top-level non-literal assignment (``P = partial(h, 2)``): an edit of
    that expression is seen even though its value is run-time data."""
    bindings: dict[str, list[ast.AST]] = field(default_factory=dict)
    """Every top-level statement that binds or stores into a name, in order (``K = 3`` ...
    ``K = 5``, a ``def``, an import, a function's ``global`` assignment, a walrus, ``with ...
    as K``, a ``match`` capture, ``setattr(sys.modules[__name__], "K", 5)``,
    ``globals().update(K=5)``): a statement run between two of them captured an earlier value.
    Dumped only when read (``bound_earlier``)."""
    modules: dict[str, str] = field(default_factory=dict)
    """Top-level ``import module [as name]``: name -> module."""
    source_refs: dict[str, References] = field(default_factory=dict)
    """What each name of ``sources`` reads, in its source: followed as the reader's own reads."""
    dynamic: list[str] = field(default_factory=list)
    """Top-level statements that bind names known at run time only (``exec(...)``,
    ``globals().update(d)``): what reads this module's globals is unknown."""
    tree: ast.Module | None = None
    filename: str = ""
    _codes: dict[str, list[types.CodeType]] | None = None

    def runs_this_source(self, code: types.CodeType) -> bool:
        """Whether ``code`` is what this version of the file compiles to at its line (other
        line numbers aside): a function imported before its file was edited, kept by a module
        that did ``from m import f`` while ``m`` was reloaded (red team r53-1), runs other code
        than the file says. True when the file cannot be compiled (nothing to say)."""
        if self._codes is None:
            self._codes = _compiled_codes(self.tree, self.filename)
        if not self._codes:
            return True  # the file did not compile: nothing to say
        # The definition at the code's own line, which the digest reads (another of the same
        # name, ``if``/``else`` bodies swapped, is not it: red team r54-1).
        known = self._codes.get(f"{code.co_qualname}:{code.co_firstlineno}", [])
        return any(same_code(code, other) for other in known)


def _index_tree(tree: ast.Module) -> SourceIndex:
    """Every definition and lambda of ``tree``, in source order (an explicit stack: a deeply
    nested file must not recurse past Python's limit)."""
    index = SourceIndex()
    stack: list[tuple[ast.AST, str]] = [(tree, "")]
    while stack:
        node, prefix = stack.pop()
        todo: list[tuple[ast.AST, str]] = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                qualname = prefix + child.name
                index.functions.setdefault(qualname, []).append(child)
                _index_globals(child, index)
                todo.append((child, qualname + ".<locals>."))
            elif isinstance(child, ast.ClassDef):
                qualname = prefix + child.name
                index.classes.setdefault(qualname, []).append(child)
                todo.append((child, qualname + "."))
            else:
                if isinstance(child, ast.Lambda):
                    index.lambdas.setdefault(child.lineno, []).append(child)
                todo.append((child, prefix))
        stack.extend(reversed(todo))
    _index_statements(tree.body, index)
    return index


_BLOCKS = (ast.If, ast.Try, ast.TryStar, ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While)
"""Module-level statements whose bodies run at import too (``try: SCALE = 2``)."""


def _index_statements(body: list[ast.stmt], index: SourceIndex) -> None:
    for statement in body:
        _index_expressions(statement, index)
        if isinstance(statement, ast.Match):
            for case in statement.cases:
                for name in _captures(case.pattern):
                    _index_computed(name, statement, index)
                for name in _bound_in(case.body):  # which case binds it (red team r45-1)
                    _add_source(index, name, statement.subject)
                    _add_source(index, name, case.pattern)
                    if case.guard is not None:  # ``case "fast" if flags.GUARD``: r46-1
                        _add_source(index, name, case.guard)
                _index_statements(case.body, index)
            continue
        if isinstance(statement, ast.With | ast.AsyncWith):
            for item in statement.items:
                for name in _target_names(item.optional_vars) if item.optional_vars else ():
                    _index_computed(name, statement, index)
        if isinstance(statement, ast.If | ast.While):  # which branch binds it (red team r44-2)
            block = statement.body + statement.orelse
            for name in _bound_in(block) | (_receivers_in(block) - index.modules.keys()):
                _add_source(index, name, statement.test)
        if isinstance(statement, _BLOCKS):
            if isinstance(statement, ast.For | ast.AsyncFor):  # its target: computed
                for name in _target_names(statement.target):
                    index.assigned.add(name)
                    _add_source(index, name, statement.iter)
                    _index_binding(name, statement.iter, index)
            for inner in ("body", "orelse", "finalbody"):
                _index_statements(getattr(statement, inner, []), index)
            for handler in getattr(statement, "handlers", []):
                _index_statements(handler.body, index)
        else:
            _index_assignment(statement, index)
            for name in _bound_by(statement):
                _index_binding(name, statement, index)


def _bound_in(body: list[ast.stmt]) -> set[str]:
    """The module-level names the statements of a block bind (not inside a definition)."""
    names: set[str] = set()
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            continue
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        if not isinstance(node, ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return names


def _receiver(call: ast.Call) -> str | None:
    """The name whose method a call runs (``PARSER.add_argument(...)``, ``RNG.seed(2)``,
    ``P.add_argument_group("g").add_argument(...)``): at module level, such a call may change
    the value that name holds after its statement, so it counts as that name's source."""
    node: ast.AST = call.func
    if not isinstance(node, ast.Attribute):
        return None
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _receivers_in(body: list[ast.stmt]) -> set[str]:
    """The names whose methods the module-level statements of a block call (``_receiver``)."""
    found: set[str] = set()
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Call):
            receiver = _receiver(node)
            found.update([receiver] if receiver is not None else [])
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _index_computed(name: str, node: ast.AST, index: SourceIndex) -> None:
    """``name`` bound by ``node`` to a computed value (a walrus, ``with ... as``, a capture)."""
    index.assigned.add(name)
    _add_source(index, name, node)
    _index_binding(name, node, index)


def _captures(pattern: ast.AST) -> list[str]:
    """The names a ``match`` pattern binds (``case K``, ``case [*K]``, ``case {**K}``)."""
    found: list[str] = []
    for node in ast.walk(pattern):
        if isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            found.append(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            found.append(node.rest)
    return found


_NESTED_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


def _own_expressions(statement: ast.stmt) -> list[ast.AST]:
    """The expressions a module-level statement evaluates in the module's scope: not its
    nested statements (indexed on their own), nor a function's or lambda's body (a
    definition's decorators, defaults and bases are)."""
    if isinstance(statement, DEFINITIONS):
        roots: list[ast.AST] = [*statement.decorator_list]
        if isinstance(statement, ast.ClassDef):
            roots += [*statement.bases, *statement.keywords]
        else:
            roots += [*statement.args.defaults, *(d for d in statement.args.kw_defaults if d)]
    else:
        roots = [
            child for name, value in ast.iter_fields(statement) if name not in _NESTED_BODIES
            for child in (value if isinstance(value, list) else [value])
            if isinstance(child, ast.AST)
        ]  # fmt: skip
    found: list[ast.AST] = []
    stack = roots
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, ast.Lambda):
            stack += [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
        else:
            stack += ast.iter_child_nodes(node)
    return found


_EXECUTORS = {("exec",), ("eval",), ("builtins", "exec"), ("builtins", "eval")}
_NAMESPACES = {("globals",), ("vars",), ("builtins", "globals"), ("builtins", "vars")}


def _index_expressions(statement: ast.stmt, index: SourceIndex) -> None:
    """Names a module-level statement binds inside an expression: a walrus (also in a
    comprehension), ``setattr(sys.modules[__name__], "K", v)``, ``globals().update(K=v)``,
    ``globals().__setitem__("K", v)``; ``exec``/``eval`` or a computed name make the module's
    globals ``dynamic``."""
    for node in _own_expressions(statement):
        if isinstance(node, ast.NamedExpr):
            _index_computed(node.target.id, statement, index)
        elif isinstance(node, ast.Call):
            for name in _call_bindings(node, index, statement):
                _index_binding(name, statement, index)
            receiver = _receiver(node)
            if receiver is not None and receiver not in index.modules:
                _add_source(index, receiver, node)  # ``PARSER.add_argument(...)``: red team r47
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and _is_namespace(node.value)
            and _constant_str(node.slice) is None
        ):
            index.dynamic.append(dump(statement))  # ``globals()[name] = v``


def _call_bindings(node: ast.Call, index: SourceIndex, statement: ast.stmt) -> list[str]:
    function = _chain(node.func)
    args = node.args
    if function in _EXECUTORS:
        index.dynamic.append(dump(statement))
        return []
    if function == ("setattr",) and len(args) >= 2 and _is_this_module(args[0]):
        name = _constant_str(args[1])
    elif isinstance(node.func, ast.Attribute) and _is_namespace(node.func.value):
        method = node.func.attr
        if method == "update":
            names = [k.arg for k in node.keywords]
            for arg in args:
                keys = arg.keys if isinstance(arg, ast.Dict) else [None]
                names += [_constant_str(k) if k is not None else None for k in keys]
            if None not in names:
                return cast(list[str], names)
            name = None
        elif method in ("__setitem__", "setdefault") and args:
            name = _constant_str(args[0])
        else:
            return []
    else:
        return []
    if name is None:
        index.dynamic.append(dump(statement))
        return []
    return [name]


def _is_this_module(node: ast.AST) -> bool:
    """``sys.modules[__name__]``: the module itself."""
    return (
        isinstance(node, ast.Subscript)
        and _chain(node.value) == ("sys", "modules")
        and isinstance(node.slice, ast.Name)
        and node.slice.id == "__name__"
    )


def _is_namespace(node: ast.AST) -> bool:
    """``globals()``, ``vars()`` or ``sys.modules[__name__].__dict__``: the module's names."""
    if isinstance(node, ast.Call) and not node.args and _chain(node.func) in _NAMESPACES:
        return True
    attribute = isinstance(node, ast.Attribute) and node.attr == "__dict__"
    return attribute and _is_this_module(cast(ast.Attribute, node).value)


def _bound_by(statement: ast.stmt) -> list[str]:
    """The names a ``def``, ``class`` or import binds (an assignment's: ``_index_assignment``)."""
    if isinstance(statement, DEFINITIONS):
        return [statement.name]
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return [a.asname or a.name.partition(".")[0] for a in statement.names if a.name != "*"]
    return []


def _index_assignment(statement: ast.stmt, index: SourceIndex) -> None:
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            if alias.asname:
                index.modules[alias.asname] = alias.name
            else:
                top = alias.name.partition(".")[0]
                index.modules[top] = top
        return
    if isinstance(statement, ast.ImportFrom) and statement.level > 0:
        relative = "." * statement.level + (statement.module or "")
        for alias in statement.names:
            if alias.name == "*":  # ``from .impl import *`` in a package ``__init__``: r46-2
                index.star_imports.append(relative)
            else:
                index.relative_imports[alias.asname or alias.name] = (relative, alias.name)
        return
    if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
        for alias in statement.names:
            if alias.name == "*":
                index.star_imports.append(statement.module)
            else:
                index.imports[alias.asname or alias.name] = (statement.module, alias.name)
        return
    if isinstance(statement, ast.Assign):
        targets, value = statement.targets, statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        targets, value = [statement.target], statement.value
    elif isinstance(statement, ast.AugAssign | ast.Delete):
        targets, value = (
            [statement.target] if isinstance(statement, ast.AugAssign) else statement.targets,
            None,
        )
    else:
        return
    for name in {n for t in targets for n in _target_names(t) or _stored_in(t)}:
        _index_binding(name, statement, index)
    literal = value is not None and _is_literal(value)
    for target in targets:
        if isinstance(target, ast.Name) and literal and len(targets) == 1 and value is not None:
            index.constants.setdefault(target.id, []).append(dump(value))
            continue
        stored = _target_names(target)
        for name in stored or _stored_in(target):  # `LIMITS["a"] = 2`, `Cfg.k = 2`: its source
            _add_source(index, name, statement)
            if not literal:  # `PATHS["root"] = os.getcwd()`: a value of this host only
                index.assigned.add(name if stored else _attribute_key(target))


def _add_source(index: SourceIndex, name: str, node: ast.AST) -> None:
    """``name``'s source (``node``, dumped) and the names its value reads (red team r26-1:
    ``K = cfg.BASE`` counts what ``cfg.BASE`` is, not only its own line). Only the value's:
    where it is stored (``vars()["K"] = 5``, ``sys.modules[__name__].K = 5``) is the binding's
    business, not a read."""
    index.sources.setdefault(name, []).append(dump(node))
    refs = index.source_refs.setdefault(name, {})
    for value in _values_of(node):
        dump(value, refs)


def _values_of(node: ast.AST) -> list[ast.AST]:
    """The expressions a binding statement computes its value from."""
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.NamedExpr):
        return [node.value] if node.value is not None else []
    if isinstance(node, ast.With | ast.AsyncWith):
        return [item.context_expr for item in node.items]
    if isinstance(node, ast.Match):
        return [node.subject]
    return [node]


def _index_binding(name: str, statement: ast.AST, index: SourceIndex) -> None:
    index.bindings.setdefault(name, []).append(statement)


def bound_earlier(index: SourceIndex, name: str, depth: int = 0) -> list[str]:
    """The source of every top-level statement binding a name that ``name``'s value may have
    captured an earlier value of: ``name`` itself and, transitively, each name its computed
    value reads, when that name is bound more than once (``K = 3``, ``def h(k=K)`` or
    ``B = Box(K)``, then ``K = 5``: the value at lowering, 5, hides an edit of ``K = 3``)."""
    found: list[str] = []
    stack, seen = [name], set()
    while stack:
        current = stack.pop()
        if current in seen or (current.startswith("__") and current.endswith("__")):
            continue
        seen.add(current)
        statements = index.bindings.get(current, [])
        if len(statements) < 2 and current not in index.assigned:
            continue
        refs: References = {}
        texts = [dump(statement, refs) for statement in statements]
        if len(statements) > 1:
            found += [f"{current}:{text}" for text in texts]
            found += _imported_bindings(index, current, statements, refs, depth)
        stack += sorted({chain[0] for chain in refs if chain[0] != VALUE})
    return found


def _imported_bindings(
    index: SourceIndex, name: str, statements: list[ast.AST], refs: References, depth: int
) -> list[str]:
    """What the binding statements of ``name`` import from another project module
    (``from cfg import K``, ``K = cfg.K``): that module's statements binding it, since what ran
    in between captured the value they made (``from cfg import K; def h(k=K); from cfg2
    import K``: an edit of cfg.py)."""
    wanted: list[tuple[str, str]] = []
    for statement in statements:
        if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
            wanted += [
                (statement.module, a.name) for a in statement.names if (a.asname or a.name) == name
            ]
    for chain in refs:
        if len(chain) > 1 and chain[0] in index.modules and chain[1] != VALUE:
            wanted.append((index.modules[chain[0]], chain[1]))
    found: list[str] = []
    for module_name, attr in wanted:
        other = module_index(sys.modules.get(module_name))
        if other is None or other is index or depth > 10:  # (a cycle of imports ends)
            continue
        texts = other.constants.get(attr, []) + other.sources.get(attr, [])
        texts += [dump(s) for s in other.bindings.get(attr, []) if isinstance(s, DEFINITIONS)]
        found += [f"{name}<{attr}:{text}" for text in texts]  # (the import says from where)
        found += [f"{name}<{text}" for text in bound_earlier(other, attr, depth + 1)]
    return found


def _target_names(target: ast.expr) -> list[str]:
    """The names an assignment target binds (``A, (B, *C) = ...``)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    if isinstance(target, ast.Tuple | ast.List):
        return [name for element in target.elts for name in _target_names(element)]
    value = target.value if isinstance(target, ast.Subscript) else None
    if value is not None and _is_namespace(value):  # globals()["K"] = 5, vars()["K"] = 5
        name = _constant_str(cast(ast.Subscript, target).slice)
        return [name] if name else []
    if isinstance(target, ast.Attribute) and _is_this_module(target.value):
        return [target.attr]  # ``sys.modules[__name__].K = 5``
    return []


def _attribute_key(target: ast.expr) -> str:
    """``Cfg.k`` for a store to ``Cfg.k`` (a class attribute set after the class), else the
    name whose item is stored."""
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        return f"{target.value.id}.{target.attr}"
    return _stored_in(target)[0]


def _index_globals(function: ast.FunctionDef | ast.AsyncFunctionDef, index: SourceIndex) -> None:
    """A module-level name a function assigns under ``global``: its value may be anything the
    function computes, so it counts by the source of those assignments, and by its value when
    that is made from what the function is called with (``index.filled``)."""
    names = {n for node in ast.walk(function) if isinstance(node, ast.Global) for n in node.names}
    local = _function_locals(function) - names
    for node in ast.walk(function):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for name in {n for t in targets for n in _target_names(t)} & names:
                index.assigned.add(name)
                _add_source(index, name, node)
                _index_binding(name, node, index)
                if node.value is not None and _reads(node.value) & local:
                    index.filled.add(name)
        index.filled.update(_items_set(node, local))


_MUTATORS = {"append", "extend", "insert", "update", "setdefault", "add", "__setitem__"}
"""The methods by which a function puts what it is called with into a container."""


def _items_set(node: ast.AST, local: set[str]) -> list[str]:
    """The non-local names ``node`` puts a value read from ``local`` names into (``T[k] = v``,
    ``T.append(v)``, ``T |= {k: v}``)."""
    if isinstance(node, ast.Assign | ast.AugAssign) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        stored = [t for t in targets if isinstance(t, ast.Subscript)]
        if stored and (_reads(node.value) | {n for t in stored for n in _reads(t.slice)}) & local:
            return [n for t in stored for n in _stored_in(t) if n not in local]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        arguments = [*node.args, *(k.value for k in node.keywords)]
        named = isinstance(owner, ast.Name) and owner.id not in local
        if node.func.attr in _MUTATORS and named and any(_reads(a) & local for a in arguments):
            return [cast(ast.Name, owner).id]
    return []


def _reads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _function_locals(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Its parameters and the names it binds (a nested definition's too: over-eager)."""
    arguments = function.args
    names = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    stores = (
        n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    )
    return names | set(stores)


def _stored_in(target: ast.expr) -> list[str]:
    """The name whose value an item or attribute store changes (``LIMITS["a"] = 2``)."""
    while isinstance(target, ast.Subscript | ast.Attribute):
        target = target.value
    return [target.id] if isinstance(target, ast.Name) else []


def computed_names(body: list[ast.stmt]) -> set[str]:
    """The names a class body assigns a computed value (``t = time.time()``): their value may
    differ in every process, so their source counts, not their value."""
    names: set[str] = set()
    for statement in body:
        if isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign):
            value = statement.value
            if value is None or not _is_literal(value) or isinstance(statement, ast.AugAssign):
                targets = (
                    statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                )
                names.update(n for t in targets for n in _target_names(t))
    return names


_CONTAINER_CALLS = {"dict", "list", "set", "frozenset", "tuple", "OrderedDict", "defaultdict"}
_CONTAINER_CALLS |= {"deque", "Counter", "SimpleNamespace", "bytearray", "ChainMap"}
_CONTAINER_CALLS |= {"UserDict", "UserList"}


def _is_literal(node: ast.expr) -> bool:
    """A literal, or a container made by a call of literals (``dict()``, ``OrderedDict()``,
    ``defaultdict`` of any factory: ``defaultdict(lambda: 0.0)``): a registry filled later,
    whose value counts as a ``{}``'s does (red team r36-2, r37-2)."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in _CONTAINER_CALLS and _chain(func) != ("array", "array"):
            return False  # (not ``np.array(...)``: an array of another library is not read)
        rest = node.args[1:] if name == "defaultdict" else node.args  # its factory is code
        return all(_is_literal(a) for a in (*rest, *(k.value for k in node.keywords)))
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


class _Problem(Exception):
    """A source file that must not be read (not a regular file, too large)."""


_MAX_SOURCE = 16 << 20
"""A larger ``.py`` file (generated data, not code) is not parsed: its parts are unknown."""
_INDEX: dict[str, tuple[tuple[int, ...], SourceIndex | str]] = {}


def _read_source(
    filename: str, known: tuple[int, ...] | None
) -> tuple[tuple[int, ...], str | None]:
    """``(version, text)`` of a regular file, read without ever blocking; text None when it
    is still at version ``known`` (not read again) or there is none to read. A FIFO, a device
    or a folder is never opened for reading (a FIFO named ``x.py`` would block a plan forever);
    the version (device, inode, size, modification time) tells an edit. A file not on disk may
    be a notebook cell IPython put in ``linecache``: its lines are read from there (a plain
    dict; no loader is asked, so no import hook runs)."""
    try:
        st = os.stat(filename)
    except OSError:
        return (), _registered_lines(filename)
    _check_regular(filename, st)
    if _version(st) == known:
        return _version(st), None
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    with open(os.open(filename, flags), "rb", closefd=True) as f:
        opened = os.fstat(f.fileno())
        _check_regular(filename, opened)  # swapped for something else after the stat
        data = f.read(_MAX_SOURCE + 1)
    _check_regular(filename, opened, len(data))
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return _version(opened), data.decode(encoding)


def _registered_lines(filename: str) -> str | None:
    """The source IPython registered in ``linecache`` for a cell (modification time None);
    a deleted file's stale lines are not used."""
    cached: Any = linecache.cache.get(filename)
    if not (isinstance(cached, tuple) and len(cached) == 4 and cached[1] is None):
        return None
    lines = cached[2]
    ok = isinstance(lines, list) and all(isinstance(line, str) for line in lines)
    return "".join(lines) if ok and lines else None


def _version(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _check_regular(filename: str, st: os.stat_result, size: int | None = None) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _Problem(f"{display_path(filename)} is not a regular file")
    if (st.st_size if size is None else size) > _MAX_SOURCE:
        raise _Problem(f"{display_path(filename)} is larger than {_MAX_SOURCE >> 20} MiB")


def _compiled_codes(tree: ast.Module | None, filename: str) -> dict[str, list[types.CodeType]]:
    """Every code object a parsed file compiles to, by qualified name and first line; empty
    when it does not compile (``return`` at module level parses)."""
    try:
        module = compile(tree, filename, "exec", dont_inherit=True) if tree is not None else None
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        module = None
    found: dict[str, list[types.CodeType]] = {}
    stack = [module] if module is not None else []
    while stack:
        code = stack.pop()
        found.setdefault(f"{code.co_qualname}:{code.co_firstlineno}", []).append(code)
        stack += [c for c in code.co_consts if type(c) is types.CodeType]
    return found


_FUTURE_FLAGS = functools.reduce(
    operator.or_, (getattr(__future__, f).compiler_flag for f in __future__.all_feature_names)
)
"""``from __future__`` flags: what compiled a function may pass them on (``exec`` inherits the
caller's), without changing what the function's own code does."""


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Whether two code objects do the same, line numbers aside: their bytecode, names,
    flags and constants (nested code objects compared the same way)."""
    if (
        a.co_code != b.co_code
        or a.co_names != b.co_names
        or a.co_varnames != b.co_varnames
        or a.co_freevars != b.co_freevars
        or a.co_cellvars != b.co_cellvars
        or a.co_flags & ~_FUTURE_FLAGS != b.co_flags & ~_FUTURE_FLAGS
        or a.co_argcount != b.co_argcount
        or a.co_posonlyargcount != b.co_posonlyargcount
        or a.co_kwonlyargcount != b.co_kwonlyargcount
        or len(a.co_consts) != len(b.co_consts)
    ):
        return False
    for x, y in zip(a.co_consts, b.co_consts, strict=True):
        if type(x) is types.CodeType and type(y) is types.CodeType:
            if not same_code(x, y):
                return False
        elif type(x) is not type(y) or repr(x) != repr(y):
            return False
    return True


def sources_changed() -> bool:
    """Whether a file parsed so far was edited since (one ``stat`` each)."""
    for filename, (version, _) in list(_INDEX.items()):
        try:
            now = _version(os.stat(filename))
        except OSError:  # gone, or a notebook cell's lines (no file): as it was
            now = ()
        if version and now != version:
            return True
    return False


def source_index(filename: str) -> SourceIndex | str:
    """The parsed file, once per version of it; a string says why there is none.

    A file is read and parsed again only after an edit (its size, modification time or inode
    changed: one ``stat``), so a long-lived process (an Airflow DAG processor, a notebook)
    that re-imports a module digests the code it now runs.
    """
    known = _INDEX.get(filename)
    try:
        version, text = _read_source(filename, known[0] if known is not None else None)
    except _Problem as exc:
        warn_once(str(exc))
        return f"{exc}: not read"
    except (OSError, SyntaxError, LookupError, UnicodeDecodeError):
        version, text = (), None
    if known is not None and version and known[0] == version:
        return known[1]
    result: SourceIndex | str
    if text is None:
        result = f"its source file {display_path(filename)} cannot be read"
    else:
        try:
            tree = ast.parse(text, filename)
            result = _index_tree(tree)
            result.tree, result.filename = tree, filename
        except (SyntaxError, ValueError):
            result = f"its source file {display_path(filename)} does not parse"
        except (RecursionError, MemoryError) as exc:  # nested past what the parser takes
            result = f"its source file {display_path(filename)} is too deep to parse"
            warn_once(f"{result} ({type(exc).__name__})")
    _INDEX[filename] = (version, result)
    return result


# --- normalised syntax --------------------------------------------------------------------------


def with_clean_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` with its docstring's indentation and trailing spaces normalised
    (``inspect.cleandoc``): what a formatter changes is layout, what the text says is code."""
    first = body[0] if body else None
    if not (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body
    lines = inspect.cleandoc(first.value.value).splitlines()
    text = "\n".join(line.rstrip() for line in lines)
    # Its line kept: a drift of the docstring is reported where it is (not at line 0).
    return [ast.copy_location(ast.Expr(ast.Constant(text)), first), *body[1:]]


References = dict[tuple[str, ...], bool | None]
"""Every ``name`` and ``name.attr.attr`` a definition reads, in order, without repeats; True
marks a global read by its name through ``globals()`` (no local shadows it)."""


def _write(root: Any, out: list[str], refs: References, skip: str = "") -> None:
    """A canonical text of ``root`` (field names and values, no positions; docstrings count:
    code reads them, as a DSPy signature's instructions or a tool's description, red team r24-2),
    collecting the names it reads into ``refs`` on the way (one pass over the tree).

    ``skip`` names a field of ``root`` itself to leave out (a definition's body, for its header).
    Locals that shadow a global are taken for the global: that can only add a callee (a
    spurious report when it changes), never hide one. Iterative, with its own stack: a
    generated 600-branch ``elif`` chain nests deeper than Python's recursion limit.
    """
    stack: list[str | tuple[Any, str]] = [(root, skip)]
    consumed: set[int] = set()  # nodes read as part of a dynamic reference (``_dynamic``)
    inner: set[int] = set()  # an attribute's object, a call's function: not a value of its own
    while stack:
        item = stack.pop()
        if isinstance(item, str):  # text to write; a node (or a value) is always in a tuple
            out.append(item)
            continue
        node, skip_field = item
        if isinstance(node, ast.AST):
            if isinstance(node, _DYNAMIC_NODES) and id(node) not in consumed:
                _dynamic(node, refs, consumed)
                _inner_nodes(node, consumed, inner)
            if isinstance(node, ast.Name | ast.Attribute) and id(node) not in consumed:
                chain = _chain(node)
                if chain:
                    refs.setdefault(chain, None)
                    if id(node) not in inner:  # ``helpers = other``: a module as a value
                        refs.setdefault((*chain, VALUE), None)
            todo: list[str | tuple[Any, str]] = [type(node).__name__, "("]
            for name in node._fields:
                if name == "type_comment" or name == skip_field:
                    continue
                value = getattr(node, name, None)
                if name == "body" and isinstance(node, DEFINITIONS):
                    value = with_clean_docstring(node.body)
                if value is None or value == []:
                    continue  # fields a later Python adds (type_params=[]) do not move it
                todo += [name, "=", (value, ""), ","]
            stack.extend(reversed([*todo, ")"]))
        elif isinstance(node, list):
            todo = ["["]
            for element in node:
                todo += [(element, ""), ","]
            stack.extend(reversed([*todo, "]"]))
        else:
            out.append(repr(node))


def _inner_nodes(node: ast.AST, consumed: set[int], inner: set[int]) -> None:
    """The nodes of ``node`` that are read only as a part of it: an attribute's object, a
    call's function, and the object ``getattr(m, "h")`` or ``vars(m)`` reads from."""
    if isinstance(node, ast.Attribute):
        inner.add(id(node.value))
    elif isinstance(node, ast.Call):
        inner.add(id(node.func))
        if id(node.func) in consumed and node.args:  # a look-up by name: ``_dynamic_call``
            inner.add(id(node.args[0]))


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
    return "".join(out), list[ast.AST](with_clean_docstring(node.body))


# --- names a definition refers to ---------------------------------------------------------------


def _chain(node: ast.AST) -> tuple[str, ...] | None:
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return (node.id, *reversed(attrs))
    return None


DYNAMIC = "<dynamic>"
"""In a reference: a name computed at run time (``getattr(helpers, name)``)."""
IMPORT = "<import>"
"""A reference's head: the module a string names (``import_module("helpers")``,
``sys.modules["helpers"]``); ``helpers.<dynamic>`` when only its start is constant."""
GLOBALS = "<globals>"
"""A reference to ``globals()`` other than with a constant key."""
VALUE = "<value>"
"""A reference's last item when the name is used as a value (``helpers = other``, ``f(other)``),
not as the object of an attribute or a call: a project module so used is not followed."""
SUBCLASSES = "<subclasses>"
"""A reference to ``__subclasses__`` of a class computed in place (``type(self)``)."""
_DYNAMIC_NODES = (ast.Call, ast.Subscript, ast.Attribute)
_IMPORTERS = {("importlib", "import_module"), ("import_module",), ("__import__",)}


def _dynamic(node: ast.AST, refs: References, consumed: set[int]) -> None:
    """The references that code reached through a string adds: ``getattr(m, "h")`` reads
    ``m.h``, ``importlib.import_module("m").h`` and ``sys.modules["m"].h`` read ``m.h``,
    ``globals()["h"]`` reads ``h``; with a computed string, the reference ends in ``DYNAMIC``
    (or is ``GLOBALS``). Nodes read here are ``consumed``: not references of their own."""
    attrs: list[str] = []
    base = node
    while isinstance(base, ast.Attribute):
        attrs.append(base.attr)
        base = base.value
    attrs.reverse()
    head = _string_reference(base, consumed)
    if head is not None:  # a module used as a value (``m = import_module("m")``) is dynamic
        bare = (DYNAMIC,) if head[0] == IMPORT else ()
        chain = (*head, *(attrs or bare))
        if head[0] in (IMPORT, GLOBALS):
            refs.setdefault(chain, None)
        else:  # ``globals()["K"]``: the module's K, whatever local has that name
            refs[chain] = True
        return
    if attrs:
        if "__subclasses__" in attrs and not isinstance(base, ast.Name):
            refs.setdefault((SUBCLASSES,), None)  # ``type(self).__subclasses__()``
        return
    if isinstance(node, ast.Call):
        _dynamic_call(node, refs, consumed)


def _dynamic_call(node: ast.Call, refs: References, consumed: set[int]) -> None:
    """``getattr(m, "h")`` reads ``m.h``; ``getattr(m, name)`` and ``vars(m)`` read ``m``'s
    members by a computed name; ``globals()`` and ``vars()`` any global. The function's own
    name is ``consumed`` (any other reference to it is unseen: see ``code._DYNAMIC_FUNCTIONS``).
    An object computed in place (``getattr(f(), "x")``) is run-time data, as an argument is."""
    function = _chain(node.func)
    args = node.args
    if function == ("getattr",) and len(args) >= 2:
        target = _chain(args[0])
        if target:
            refs.setdefault((*target, _constant_str(args[1]) or DYNAMIC), None)
    elif function == ("vars",) and len(args) == 1:
        target = _chain(args[0])
        if target:
            refs.setdefault((*target, DYNAMIC), None)
    elif function in (("globals",), ("vars",)) and not args:
        refs.setdefault((GLOBALS,), None)
    else:
        return
    consumed.add(id(node.func))


def _string_reference(node: ast.AST, consumed: set[int]) -> tuple[str, ...] | None:
    """The reference a module or global named by a string is (``(IMPORT, "m")``, ``("h",)``);
    None when ``node`` is no such expression. Its inner nodes are ``consumed``."""
    if isinstance(node, ast.Call) and _chain(node.func) in _IMPORTERS and node.args:
        consumed.update((id(node), id(node.func)))
        name = _module_name(node.args[0])
        package = node.args[1] if len(node.args) > 1 else None
        own = isinstance(package, ast.Name) and package.id == "__package__"
        if name.startswith(".") and not own:  # relative to a package only known at run time
            name = "." + DYNAMIC
        return IMPORT, name
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        inner = node.func.value  # ``globals().get("h")`` reads ``h`` (red team r29-5)
        if node.func.attr == "get" and isinstance(inner, ast.Call) and _is_globals(inner):
            consumed.update((id(node), id(node.func), id(inner), id(inner.func)))
            constant = _constant_str(node.args[0])
            return (constant,) if constant else (GLOBALS,)
    if isinstance(node, ast.Subscript):
        inner = node.value
        key = node.slice
        name = _module_name(key)
        if _chain(inner) == ("sys", "modules") and DYNAMIC not in name:
            consumed.update((id(node), id(inner)))  # else sys.modules itself: unseen
            return IMPORT, name
        if isinstance(inner, ast.Call) and _is_globals(inner):
            consumed.update((id(node), id(inner), id(inner.func)))
            constant = _constant_str(key)
            return (constant,) if constant else (GLOBALS,)
    return None


def _is_globals(call: ast.Call) -> bool:
    """``globals()``, called with nothing."""
    return _chain(call.func) == ("globals",) and not call.args and not call.keywords


def _constant_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _module_name(node: ast.AST) -> str:
    """The module a string expression names: itself when constant; ``pkg.<dynamic>`` when only
    a prefix naming a package is (``f"plugins.{name}"``, ``"plugins." + name``); else DYNAMIC."""
    constant = _constant_str(node)
    if constant is not None:
        return constant
    first = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        first = node.left
    prefix = first.value if isinstance(first, ast.Constant) else None
    if isinstance(prefix, str) and "." in prefix:
        return prefix.rpartition(".")[0] + "." + DYNAMIC
    return DYNAMIC


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
    for module_name in reversed(index.star_imports) if values is None else ():
        module = sys.modules.get(module_name)  # ``from config import *``: the last one wins
        other = module_index(module) if module is not None else None
        if other is not None and name in other.constants and name not in other.assigned:
            return other.constants[name]
    return values


def imported_from(
    index: SourceIndex, name: str, namespace: Mapping[str, Any]
) -> tuple[str, str] | None:
    """Where a module's ``name`` is imported from: ``from m import name``, ``from .m import
    name`` (against the module's package: red team r45-3), or the last ``from m import *``
    whose module has it (r45-2); None when the module binds it itself."""
    if name in index.imports:
        return index.imports[name]
    if name in index.relative_imports:
        module, original = index.relative_imports[name]
        return absolute_module(module, namespace.get("__package__")), original
    for module_name in reversed(index.star_imports):
        module_name = absolute_module(module_name, namespace.get("__package__"))
        if name in (module_namespace(sys.modules.get(module_name)) or {}):
            return module_name, name
    return None


def counts_by_value(index: SourceIndex, name: str, namespace: Mapping[str, Any]) -> bool:
    """Whether the plain value of the module-level ``name`` counts (read at lowering, so a
    later ``LIMITS["a"] = 5``, ``A, B = 5, 3``, ``setattr`` or ``global`` is seen): a name of
    the project, not a dunder (``__file__`` differs by host), and not assigned a computed value
    (``START = time.time()`` differs in every process: its source counts). Follows ``from m
    import name``, relative and star imports (``namespace``: the module's, for its package) to
    the module that assigns it; another package's is not the project's (its version is the
    environment's)."""
    for _ in range(20):  # a cycle of imports ends somewhere
        if (name.startswith("__") and name.endswith("__")) or name in index.assigned:
            return False
        if name in index.constants:
            return True
        imported = imported_from(index, name, namespace)
        if imported is None:
            return True  # set by a statement other than an assignment (setattr, a global)
        module = sys.modules.get(imported[0])
        other, scope = module_index(module), module_namespace(module)
        if other is None or scope is None:
            return False
        index, name, namespace = other, imported[1], scope
    return False


def assignment_source(index: SourceIndex, name: str) -> list[str] | None:
    """The source of a module-level name assigned something other than a literal (a call, an
    expression): its value is run-time data, but an edit of the expression is seen."""
    return index.sources.get(name)


def is_project_name(module: str) -> bool:
    """``is_project_module`` for a module that may not be imported yet (no file known): not the
    standard library, not the engine, not another installed distribution's package."""
    return _foreign_providers(module) == frozenset()


def module_file(module: Any) -> str:
    """A module's ``__file__``, read from its namespace without running code (a lazy module
    object's ``__getattr__`` imports things; a proxy in ``sys.modules`` resolves)."""
    namespace = module_namespace(module)
    filename = namespace.get("__file__") if namespace is not None else None
    return filename if type(filename) is str else ""


def module_namespace(module: Any) -> dict[str, Any] | None:
    """A real module's own namespace (its ``__dict__`` slot, whatever a subclass defines);
    None for anything that is not a module."""
    if not issubclass(type(module), types.ModuleType):
        return None
    namespace = _MODULE_DICT.__get__(module, types.ModuleType)
    return namespace if type(namespace) is dict else None


_MODULE_DICT = vars(types.ModuleType)["__dict__"]


def unreadable_module(module: Any) -> str | None:
    """Why a project module's values cannot be compared, or None: it was made at run time with
    no file and no package path (``sys.modules["cfg"] = types.ModuleType("cfg")``, then ``cfg.K
    = 2``: red team r49-1), or its source cannot be read (imported from a zip archive: r50-2).
    A library's module, or a project module whose source is read, is None."""
    namespace = module_namespace(module)
    name = namespace.get("__name__") if namespace is not None else None
    if namespace is None or type(name) is not str or name in sys.builtin_module_names:
        return None
    filename = module_file(module)
    if not filename:
        made = "__path__" not in namespace and is_project_name(name)
        return "a module made at run time, with no file" if made else None
    if not is_project_module(name, filename):
        return None
    index = source_index(filename)
    return index if isinstance(index, str) else None


def is_project_class(kind: type) -> bool:
    """Whether a class is defined by the project (not a library's, not the engine's)."""
    module = class_module(kind)
    return bool(module) and is_project_module(module, module_file(sys.modules.get(module)))


def module_index(module: Any) -> SourceIndex | None:
    """The parsed source of a project module, else None."""
    namespace = module_namespace(module)
    name = namespace.get("__name__") if namespace is not None else None
    filename = module_file(module)
    if type(name) is not str or not is_project_module(name, filename):
        return None
    index = source_index(filename)
    return index if isinstance(index, SourceIndex) else None


def clear_source_cache() -> None:
    """Forget every parsed file and project answer (tests that move files use it)."""
    _INDEX.clear()
    _providers_on.cache_clear()
    is_project_module.cache_clear()
    _roots_on.cache_clear()
    _site_folders.cache_clear()
    _project_root.cache_clear()
    display_path.cache_clear()


def absolute_module(module: str, package: Any) -> str:
    """``module`` made absolute against ``package`` (its module's ``__package__``); as it is
    when it cannot be (no package, or above the top level: unseen)."""
    if not module.startswith(".") or not isinstance(package, str) or not package:
        return module
    try:
        return importlib.util.resolve_name(module, package)
    except ValueError:
        return module
