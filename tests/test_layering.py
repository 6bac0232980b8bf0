"""The layers of ``marin.execution`` are folders, and every import points down (issue 44).

An AST reading of ``src/marin``: a module may import its own layer or one below it, never one
above; and no import circle, between any two modules, at any depth (``graphlib``). Imports
inside functions and under ``TYPE_CHECKING`` count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
EXECUTION = SRC / "marin" / "execution"

LAYERS = ("digest", "store", "pipeline", "remote", "plan", "builder", "run")
"""Bottom first. Below them all is the ground floor (the modules directly in ``execution/``)."""

GROUND = {"errors", "vocabulary", "ids", "suggest", "heap", "faults", "atomic_file", "names"}
GROUND |= {"printable"}
PUBLIC = {"marin.execution", "marin.execution.lazy", "marin.execution.step_spec"}
PUBLIC |= {"marin.execution.step_runner"}
"""Marin's public modules and the front door: thin, above every layer."""

UPWARD_ALLOWED = {
    ("marin.execution.pipeline.handles", "marin.execution"): (
        "ArtifactStep.lower and .resolve, Marin's method forms of lower(handle) and"
        " resolve(handle), reach the lowering and the runner at call time through the front"
        " door"
    ),
}
"""The one climb, inside a function: each entry says why."""


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / "marin").rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """The ``marin`` modules ``name`` imports, each with whether the import is module-level."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports the module; ``from mod import name``, the module
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for target in targets:
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name:
                found.append((target, id(node) in top))
    return found


def rank(name: str) -> int:
    """The floor a module stands on: 0 the ground, then the layers, then the public modules,
    then the rest of ``marin`` (the CLI and its views)."""
    if name in PUBLIC:
        return len(LAYERS) + 1
    if name == "marin" or name.startswith("marin.execution."):
        layer = name.split(".")[2] if name.count(".") >= 2 else ""
        return LAYERS.index(layer) + 1 if layer in LAYERS else 0
    return len(LAYERS) + 2


def graph() -> dict[str, list[tuple[str, bool]]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_no_import_circle() -> None:
    deps = {name: {target for target, _ in edges} for name, edges in graph().items()}
    try:
        graphlib.TopologicalSorter(deps).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def test_every_import_points_down() -> None:
    upward = []
    for name, edges in graph().items():
        for target, module_level in edges:
            if rank(target) <= rank(name):
                continue
            if (name, target) in UPWARD_ALLOWED and not module_level:
                continue
            upward.append(f"{name} imports {target} (a floor above)")
    assert upward == [], "\n".join(upward)


def test_the_allowed_climbs_still_exist() -> None:
    """A climb that was removed comes off the list, so that it cannot come back unnoticed."""
    edges = {(name, target) for name, found in graph().items() for target, _ in found}
    assert set(UPWARD_ALLOWED) <= edges


def test_layers_are_folders_and_the_ground_floor_is_declared() -> None:
    for layer in LAYERS:
        assert (EXECUTION / layer / "__init__.py").is_file(), f"execution/{layer}/ is missing"
    flat = {p.stem for p in EXECUTION.glob("*.py")} - {"__init__", "_moved"}
    thin = {name.rpartition(".")[2] for name in PUBLIC}
    assert flat - GROUND - thin == set(), (
        "a module directly in execution/ must be on the ground floor (GROUND here) or move into"
        " its layer's folder"
    )


def test_the_core_never_imports_an_adapter() -> None:
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names.append(getattr(node, "module", None) or "")
                assert not any(n.startswith(("marin_airflow", "marin_prefect")) for n in names), (
                    name
                )


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The reading itself: a lazy import from a lower floor to a higher one is found."""
    lower = tmp_path / "low.py"
    lower.write_text("def f():\n    from marin.execution.run.api import run\n")
    known = {"marin.execution.run.api", "marin.execution.run"}
    found = imports("marin.execution.store.low", lower, known)
    assert found == [("marin.execution.run.api", False)]
    assert rank("marin.execution.run.api") > rank("marin.execution.store.low")
