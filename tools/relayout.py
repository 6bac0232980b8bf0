"""Move ``src/marin/execution/`` from one flat folder into layered sub-packages (issue 44).

Run from the repository's root, on a clean tree::

    python tools/relayout.py            # move, rewrite imports, write the alias table
    python tools/relayout.py --check    # say what would move, change nothing

Then commit what it did (``git add -A``): it stages the moves and the files it writes.

It is idempotent: a module already at its new path is left there, and the import rewrite only
touches old names, so running it again after another branch merges (bringing old imports back)
rewrites just those. It stops with a non-zero status, before changing anything, when the tree
holds what the mapping does not know: a module in the flat folder with no entry (add one to
``MOVES``, or to ``GROUND`` if it belongs on the ground floor), or a module at both its old and
its new path.

``MOVES`` is the one table: the moves come from it, and so does ``marin/execution/_moved.py``,
which keeps every old dotted name importable for one release (the same module object, and a
``DeprecationWarning``), without any file left at an old path (git sees pure renames).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

PKG = "marin.execution"
EXEC = Path("src/marin/execution")

LAYERS: dict[str, str] = {
    "digest": "code and output digests; config and code drift explanations",
    "store": "the location (fsspec), prefix policy, the storage probe, records, leases",
    "pipeline": "handles and lowering, specs, canonical form, context, graph, resources, "
    "targets, isolation",
    "plan": "run options and policy, the decision, reading stored state",
    "build": "the one commit path, the output tree walk, step logs, lineage",
    "run": "scheduler, run loop, executors, report, the runner and the run/resolve API",
}
"""The layers, bottom first (the ground floor, modules directly in ``execution/``, is below
them all). tests/test_layering.py holds the same order."""

GROUND = frozenset(
    {"errors", "vocabulary", "ids", "suggest", "heap", "faults", "atomic_file", "names"}
)
"""Modules that stay in ``execution/``: the ground floor, imported by every layer."""

MOVES: dict[str, str] = {
    # digest/
    "code_digest": "digest.code",
    "code_source": "digest.source",
    "code_drift": "digest.code_drift",
    "drift": "digest.config_drift",
    "output_value": "digest.output",
    # store/
    "storage": "store.location",
    "prefix_policy": "store.prefix_policy",
    "storage_probe": "store.probe",
    "records": "store.records",
    "lease": "store.lease",  # a package: its modules move with it
    # pipeline/
    "lazy": "pipeline.handles",  # Marin's path stays: a thin lazy.py (THIN below)
    "step_spec": "pipeline.step_spec",  # likewise
    "canonical": "pipeline.canonical",
    "context": "pipeline.context",
    "graph": "pipeline.graph",
    "fingerprint": "pipeline.fingerprint",
    "resources": "pipeline.resources",
    "provenance": "pipeline.provenance",
    "artifact": "pipeline.artifact",
    "isolation": "pipeline.isolation",
    "isolated_child": "pipeline.isolated_child",
    "targets": "pipeline.targets",
    # plan/
    "options": "plan.options",
    "decide": "plan.decide",
    "inspect": "plan.read",
    # build/
    "build": "build.commit",  # the package takes the module's name: it forwards (SHADOWED)
    "output_digest": "build.output_tree",
    "step_logs": "build.step_logs",
    "lineage": "build.lineage",  # the module becomes the package's __init__
    "lineage_model": "build.lineage.model",
    "lineage_sender": "build.lineage.sender",
    "lineage_events": "build.lineage.openlineage",
    "lineage_http": "build.lineage.http",
    "artifact_names": "build.lineage.names",
    # run/
    "scheduler": "run.scheduler",
    "orchestrate": "run.loop",
    "executors": "run.executors",
    "report": "run.report",
    "step_runner": "run.runner",  # Marin's path stays: a thin step_runner.py
    "run_api": "run.api",
}
"""Old module (under ``marin.execution``) -> its new dotted name, relative to the same."""

THIN = {"lazy", "step_spec", "step_runner"}
"""Marin's public modules: they stay real modules at their paths, re-exporting the moved code."""

SPLIT_NAMES = {"lazy": {"run": "run.api", "resolve": "run.api", "materialized_config": "run.api"}}
"""Names a thin module takes from somewhere other than its ``MOVES`` target."""

THIN_MARK = "# relayout: thin public module (tools/relayout.py)"
STRIP_BEGIN = "# relayout: public re-exports begin"
STRIP_END = "# relayout: public re-exports end"

CODE_DIRS = ("src", "adapters", "tests", "benchmarks", "dags")
DOC_DIRS = ("docs", "examples")
DOC_FILES = ("README.md",)
SKIP = {
    "src/marin/execution/_moved.py",  # the old names themselves
    "tests/test_moved_modules.py",  # written for the new layout: it names old paths on purpose
    "tests/test_layering.py",
    "tests/test_relayout.py",  # its inputs are old names
}

OLD_NAMES = sorted(MOVES, key=len, reverse=True)
SHADOWED = {old for old, new in MOVES.items() if old in LAYERS}
"""Old modules whose name a layer package now has (``build``): the package forwards their
attributes instead of an alias."""


THIN_WRITTEN: list[Path] = []


class RelayoutError(Exception):
    """Something the mapping does not cover: nothing has been changed."""


# --- the file moves ----------------------------------------------------------------------------


def _path(dotted: str) -> Path:
    """``build.lineage`` -> ``build/lineage/__init__.py`` when it is a package target, else
    ``build/lineage.py`` (relative to ``execution/``)."""
    parts = dotted.split(".")
    if any(new.startswith(dotted + ".") for new in MOVES.values()):
        return EXEC.joinpath(*parts, "__init__.py")
    if dotted == MOVES.get("lease"):
        return EXEC.joinpath(*parts)
    return EXEC.joinpath(*parts).with_suffix(".py")


def _old_path(old: str) -> Path:
    return EXEC / old if old == "lease" else EXEC / f"{old}.py"


def _exists(path: Path) -> bool:
    """A module file, or a package folder holding modules (not one git emptied)."""
    return any(path.glob("*.py")) if path.is_dir() else path.exists()


def _is_thin(path: Path) -> bool:
    return path.exists() and THIN_MARK in path.read_text()


def check_flat_folder() -> None:
    """Refuse a module or folder in ``execution/`` the mapping does not know."""
    known = GROUND | set(MOVES) | {"__init__", "_moved"}
    unknown = []
    for entry in sorted(EXEC.iterdir()):
        if entry.name == "__pycache__" or entry.name in LAYERS:
            continue
        name = entry.stem if entry.suffix == ".py" else entry.name
        if entry.is_dir() and not _exists(entry):
            continue  # a folder git emptied (only caches left)
        if name not in known or (entry.is_dir() and name != "lease"):
            unknown.append(str(entry))
    if unknown:
        raise RelayoutError(
            "no mapping for: "
            + ", ".join(unknown)
            + ". Add each to MOVES in tools/relayout.py (old name -> 'layer.module'), or to"
            " GROUND if it belongs on the ground floor, then run again."
        )


def planned_moves() -> list[tuple[str, Path, Path]]:
    """The moves still to make; raises on a module found at both paths or at neither."""
    todo = []
    for old, new in MOVES.items():
        src, dst = _old_path(old), _path(new)
        at_old = _exists(src) and not (old in THIN and _is_thin(src))
        if at_old and _exists(dst):
            raise RelayoutError(f"{src} and {dst} both exist: merge them by hand, then run again")
        if not at_old and not _exists(dst):
            raise RelayoutError(f"{old}: neither {src} nor {dst} exists; fix MOVES")
        if at_old:
            todo.append((old, src, dst))
    return todo


def git(*args: str) -> None:
    subprocess.run(["git", *args], check=True)


def move(old: str, src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    git("mv", str(src), str(dst))
    print(f"moved   {src} -> {dst}")
    if old in THIN:
        text = dst.read_text()
        if STRIP_BEGIN in text:
            head, rest = text.split(STRIP_BEGIN, 1)
            if STRIP_END not in rest:
                raise RelayoutError(f"{dst}: {STRIP_BEGIN!r} without {STRIP_END!r}")
            text = head.rstrip() + "\n" + rest.split(STRIP_END, 1)[1].split("\n", 1)[1]
        # the notes that only the flat layout needed
        text = "".join(line for line in text.splitlines(True) if not line.startswith("# relayout:"))
        dst.write_text(text.rstrip() + "\n")
        src.write_text(thin_module(old))
        THIN_WRITTEN.append(src)
        git("add", str(src))
        print(f"wrote   {src} (thin: Marin's import path)")


def _public_names(path: Path) -> list[str]:
    """A module's ``__all__``, else the public names it defines itself."""
    tree = ast.parse(path.read_text())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return [n for n in names if not n.startswith("_")]


def thin_exports(old: str) -> dict[str, list[str]]:
    """The names a thin module re-exports, by the module they come from."""
    sources: dict[str, list[str]] = {}
    moved = _path(MOVES[old])
    for name in _public_names(moved if moved.exists() else _old_path(old)):
        sources.setdefault(MOVES[old], []).append(name)
    for name, new in SPLIT_NAMES.get(old, {}).items():
        sources.setdefault(new, []).append(name)
    return sources


def thin_module(old: str) -> str:
    sources = thin_exports(old)
    # ruff's order for __all__ (RUF022): constants, then classes, then the rest
    every = sorted(
        (n for names in sources.values() for n in names),
        key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n),
    )
    where = " and ".join(f"``{PKG}.{m}``" for m in sources)
    doc = f"Marin's import path, a real module (not deprecated): the code is in {where}."
    lines = ['"""' + textwrap.fill(doc, 96) + '\n"""', "", THIN_MARK, ""]
    lines += [f"from {PKG}.{m} import {', '.join(sorted(n))}" for m, n in sources.items()]
    lines += ["", "__all__ = [" + ", ".join(f'"{n}"' for n in every) + "]", ""]
    return "\n".join(lines)


# --- the packages and the alias table ----------------------------------------------------------


def write_packages() -> list[Path]:
    written = []
    for layer, owns in LAYERS.items():
        init = EXEC / layer / "__init__.py"
        if init.exists():
            continue
        text = '"""' + textwrap.fill(f"The {layer} layer: {owns}.", 96) + '\n"""\n'
        for old in SHADOWED:
            if old == layer:
                text += shadow_forwarder(old)
        init.write_text(text)
        git("add", str(init))
        print(f"wrote   {init}")
        written.append(init)
    return written


def shadow_forwarder(old: str) -> str:
    subs = sorted({new.split(".")[1] for new in MOVES.values() if new.startswith(old + ".")})
    return f'''
from __future__ import annotations

import importlib
import warnings
from typing import Any

_SUBMODULES = {tuple(subs)!r}
_TO = __name__ + ".{MOVES[old].split(".", 1)[1]}"


def __getattr__(name: str) -> Any:
    """This package's name was a module's (now ``_TO``): that module's attributes, for one
    release, with a ``DeprecationWarning``."""
    if name.startswith("__") or name in _SUBMODULES:
        raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")
    warnings.warn(
        f"{{__name__}}.{{name}} moved to {{_TO}}.{{name}}; import it from there",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(_TO), name)
'''


def write_alias_table() -> list[Path]:
    path = EXEC / "_moved.py"
    moved = sorted((old, new) for old, new in MOVES.items() if old not in THIN)
    rows = "".join(f'    "{PKG}.{old}": "{PKG}.{new}",\n' for old, new in moved)
    shadowed = ", ".join(f'"{PKG}.{old}"' for old in sorted(SHADOWED))
    template = (Path(__file__).parent / "moved_template.py").read_text()
    text = template.replace("    # ROWS\n", rows).replace('"__SHADOWED__"', shadowed)
    written = []
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        git("add", str(path))
        print(f"wrote   {path} ({rows.count(chr(10))} old names)")
        written.append(path)
    init = EXEC / "__init__.py"
    hook = "from marin.execution import _moved  # noqa: E402  old paths, for one release\n"
    text = init.read_text()
    if hook not in text:
        init.write_text(text.rstrip() + "\n\n" + hook + "\n_moved.install()\n")
        print(f"wrote   {init} (installs the old paths)")
        written.append(init)
    return written


# --- the import rewrite ------------------------------------------------------------------------

_SUBMODULES_OF = {
    layer: {new.split(".")[1] for new in MOVES.values() if new.startswith(layer + ".")}
    for layer in LAYERS
}
_OLD = "|".join(OLD_NAMES)
# a dotted name anywhere (strings, docs, ``import x``), not a ``from x import`` (done above)
_DOTTED = re.compile(r"(?<![\w.])marin\.execution\.(" + _OLD + r")(?!\w)((?:\.\w+)*)(?![\w.])")
_PATHS = re.compile(r"(?<!\w)marin/execution/(?:(" + _OLD + r")\.py(?!\w)|(lease)/)")
_FROM = re.compile(r"^([ \t]*)from marin\.execution import (\([^)]*\)|[^\n]*)", re.M)
_FROM_MOD = re.compile(
    r"^([ \t]*)from marin\.execution\.(\w+)((?:\.\w+)*) import (\([^)]*\)|[^\n(]+)", re.M
)


def _names(clause: str) -> list[tuple[str, str | None]] | None:
    """``a, b as c`` -> ``[(a, None), (b, c)]``; None when it is not plain names (the
    statement is inside a string, say), so that it is left as it is."""
    clause = re.sub(r"#[^\n]*", "", clause).strip().strip("()")
    out: list[tuple[str, str | None]] = []
    for part in clause.split(","):
        bits = part.split()
        if not bits:
            continue
        ok = len(bits) == 1 or (len(bits) == 3 and bits[1] == "as")
        if not ok or not all(b.isidentifier() for b in bits):
            return None
        out.append((bits[0], bits[2] if len(bits) == 3 else None))
    return out


def _target(old: str, attr: str | None, doc: bool) -> str | None:
    """The new module for ``old`` (and one of its attributes), or None to leave it."""
    if old in THIN and (doc or attr is None):
        return None
    if attr is not None and attr in SPLIT_NAMES.get(old, {}):
        return SPLIT_NAMES[old][attr]
    return MOVES[old]


def _rewrite_dotted(match: re.Match[str], doc: bool) -> str:
    line_start = match.string.rfind("\n", 0, match.start()) + 1
    if match.string[line_start : match.start()].strip() == "from":
        return match.group(0)  # a from-import statement: done by _rewrite_from_module
    old, rest = match.group(1), match.group(2)
    attrs = [a for a in rest.split(".") if a]
    if old in SHADOWED and attrs and attrs[0] in _SUBMODULES_OF[old]:
        return match.group(0)  # already the new package's module
    new = _target(old, attrs[0] if attrs else None, doc)
    if new is None:
        return match.group(0)
    return f"marin.execution.{new}" + rest


def _rewrite_from_package(match: re.Match[str], doc: bool) -> str:
    indent, clause = match.group(1), match.group(2)
    names = _names(clause)
    if not names:
        return match.group(0)
    keep, lines = [], []
    for name, alias in names:
        # a module object is for patching or reading internals: the code's own module
        new = MOVES.get(name) if not (doc and name in THIN) else None
        if new is None:
            keep.append(name + (f" as {alias}" if alias else ""))
            continue
        parent, leaf = (PKG + "." + new).rsplit(".", 1)
        local = alias or name
        rename = f" as {local}" if local != leaf else ""
        lines.append(f"{indent}from {parent} import {leaf}{rename}")
    if not lines:
        return match.group(0)
    if keep:
        lines.insert(0, f"{indent}from {PKG} import {', '.join(keep)}")
    return "\n".join(lines)


def _rewrite_from_module(match: re.Match[str], doc: bool, in_engine: bool) -> str:
    indent, old, sub, clause = match.groups()
    if old not in MOVES:
        return match.group(0)
    names = _names(clause)  # None: not plain names (inline code in a doc, say)
    if old in SHADOWED and not sub and names and all(n in _SUBMODULES_OF[old] for n, _ in names):
        return match.group(0)  # the new package's own modules
    if sub or old not in THIN:
        if old in SHADOWED and sub and sub.split(".")[1] in _SUBMODULES_OF[old]:
            return match.group(0)
        return f"{indent}from {PKG}.{MOVES[old]}{sub} import {clause}"
    if doc or not names:
        return match.group(0)
    public = {n for ns in thin_exports(old).values() for n in ns}
    groups: dict[str, list[str]] = {}
    for name, alias in names:
        module = old if (name in public and not in_engine) else _target(old, name, False)
        assert module is not None
        groups.setdefault(module, []).append(name + (f" as {alias}" if alias else ""))
    if list(groups) == [old]:
        return match.group(0)  # Marin's public names, at Marin's path
    return "\n".join(
        f"{indent}from {PKG}.{m} import {', '.join(ns)}" for m, ns in sorted(groups.items())
    )


def _rewrite_paths(text: str) -> str:
    """``marin/execution/storage.py`` -> ``marin/execution/store/location.py`` (and ``lease/``)."""

    def one(match: re.Match[str]) -> str:
        old = match.group(1) or match.group(2)
        if old in THIN:
            return match.group(0)
        new = _path(MOVES[old]).relative_to(EXEC.parent.parent)
        return f"{new}/" if old == "lease" else str(new)

    return _PATHS.sub(one, text)


def rewrite_text(text: str, doc: bool, in_engine: bool) -> str:
    text = _FROM.sub(lambda m: _rewrite_from_package(m, doc), text)
    text = _FROM_MOD.sub(lambda m: _rewrite_from_module(m, doc, in_engine), text)
    text = _DOTTED.sub(lambda m: _rewrite_dotted(m, doc), text)
    return _rewrite_paths(text)


def _prose_lines(text: str) -> set[int]:
    """The (0-based) lines of ``text`` inside a docstring or a comment: safe to re-wrap."""
    lines: set[int] = set()
    previous = tokenize.NEWLINE
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            docstring = tok.type == tokenize.STRING and previous in (
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.NL,
            )
            whole_line_comment = tok.type == tokenize.COMMENT and tok.line.lstrip()[:1] == "#"
            if docstring or whole_line_comment:
                lines.update(range(tok.start[0] - 1, tok.end[0]))
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                previous = tok.type
    except (tokenize.TokenError, SyntaxError):
        return set()
    return lines


def wrap_long_prose(text: str, before: str, limit: int = 100) -> str:
    """Break a docstring or comment line that a longer module name pushed past ``limit`` (a
    line that was long ``before`` the rewrite is left as it was)."""
    prose, out = _prose_lines(text), []
    old = set(before.split("\n"))
    for number, line in enumerate(text.split("\n")):
        while number in prose and line not in old and len(line) > limit and " " in line.strip():
            cut = line.rfind(" ", 0, limit + 1)
            indent = len(line) - len(line.lstrip())
            if cut <= indent:
                break
            lead = line[:indent] + ("# " if line.lstrip().startswith("#") else "")
            out.append(line[:cut].rstrip())
            line = lead + line[cut + 1 :]
        out.append(line)
    return "\n".join(out)


def candidate_files() -> list[Path]:
    files: list[Path] = []
    for folder in CODE_DIRS + DOC_DIRS:
        if Path(folder).is_dir():
            files += [p for p in Path(folder).rglob("*") if p.suffix in (".py", ".md", ".txt")]
    files += [Path(f) for f in DOC_FILES if Path(f).exists()]
    return sorted(p for p in files if str(p) not in SKIP and "__pycache__" not in p.parts)


def rewrite_all() -> list[Path]:
    touched = []
    for path in candidate_files():
        text = path.read_text()
        doc = path.suffix == ".md" or path.parts[0] in DOC_DIRS
        in_engine = str(path).startswith(str(EXEC)) or path.parts[0] == "adapters"
        new = rewrite_text(text, doc, in_engine)
        if path.suffix == ".py" and new != text:
            new = wrap_long_prose(new, text)
        if new != text:
            path.write_text(new)
            touched.append(path)
            print(f"rewrote {path}")
    return touched


def tidy(paths: list[Path]) -> None:
    """Sort the rewritten imports; format the touched engine code (as the project formats it:
    ``ruff format src adapters``, so that a test's other lines are left as they are)."""
    py = [str(p) for p in paths if p.suffix == ".py"]
    engine = [p for p in py if p.startswith(("src/", "adapters/"))]
    found = shutil.which("ruff")
    ruff = [found] if found else [sys.executable, "-m", "ruff"]
    if py:
        subprocess.run([*ruff, "check", "--fix", "--select", "I", "--quiet", *py], check=True)
    if engine:
        subprocess.run([*ruff, "format", "--quiet", *engine], check=True)
    print(f"ruff    import order on {len(py)} files, format on {len(engine)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="say what would move; change nothing")
    parser.add_argument(
        "--allow-dirty", action="store_true", help="run on a tree with uncommitted changes"
    )
    args = parser.parse_args(argv)
    if not EXEC.is_dir():
        print(f"error: no {EXEC} here: run from the repository's root", file=sys.stderr)
        return 2
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    if dirty and not (args.allow_dirty or args.check):
        print("error: uncommitted changes (commit them, or --allow-dirty)", file=sys.stderr)
        return 2
    try:
        check_flat_folder()
        todo = planned_moves()
        if args.check:
            for _, src, dst in todo:
                print(f"would move {src} -> {dst}")
            return 0
        for old, src, dst in todo:
            move(old, src, dst)
        touched = [*THIN_WRITTEN, *write_packages(), *write_alias_table()]
        touched += rewrite_all()
        tidy(touched)
    except (RelayoutError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done: {len(todo)} moved, {len(touched)} files written or rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
