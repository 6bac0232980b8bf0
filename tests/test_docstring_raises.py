"""The public API's docstrings say what it raises (issue 44, item 6).

Each function or method below has a ``Raises:`` section, and every name in it is an exception
class the code can raise: a typed error of ``marin.execution.errors`` (or of the function's own
module), or a built-in one. A renamed error, or a section lost in an edit, fails here.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import re

import pytest

from marin.execution import errors

PUBLIC = {
    "marin.execution.lazy": [
        "apply", "lower", "run", "resolve", "materialized_config", "register_fingerprint",
        "current_context", "ArtifactStep", "ArtifactStep.lower", "ArtifactStep.fingerprint",
        "ArtifactStep.fingerprint_payload", "ArtifactStep.path", "ArtifactStep.resolve",
        "ArtifactStep.adopt", "ArtifactStep.with_options", "VersionCodex",
        "VersionCodex.version_for", "VersionCodex.check_used", "VersionCodex.from_data",
    ],
    "marin.execution.step_runner": [
        "StepRunner.__init__", "StepRunner.plan", "StepRunner.run", "RunReport.raise_failures",
    ],
    "marin.execution.pipeline.lower": ["lower_graph"],
    "marin.execution.plan.options": [
        "RunOptions", "RunOptions.from_params", "RunOptions.policy", "resolve_force",
    ],
    "marin.execution.plan.read": ["plan_run"],
    "marin.execution.plan.decide": ["decide", "plan_graph"],
    "marin.execution.pipeline.graph": ["collect_steps", "Graph.of", "as_graph"],
    "marin.execution.store.location": [
        "open_prefix", "resolve_prefix", "with_retries", "Location.check_no_links",
        "Location.read_file", "Location.rm_file", "Location.has_file", "Location.put_file",
        "Location.exists", "Location.list_tree", "Location.remove_tree",
        "Location.check_writable",
    ],
    "marin.execution.store.records": [
        "load_record", "read_record", "write_atomic", "write_record", "metadata_files",
        "read_status_file", "read_attempt", "read_status", "write_status",
        "ArtifactRecord.from_json", "parse_json",
    ],
    "marin.gc": ["collect_garbage"],
}  # fmt: skip
"""Module -> the public functions, methods and classes (raising when made) it documents."""

RAISED = re.compile(r"^ {4}(\w+):", re.M)
"""An entry of the section: four spaces in (its continuation lines, eight), a name, a colon."""


def raises_section(doc: str) -> str:
    """The text of the docstring's ``Raises:`` section (up to the next blank line)."""
    _, found, rest = doc.partition("Raises:\n")
    assert found, "no Raises: section"
    return rest.split("\n\n")[0]


def exception_named(name: str, module: object) -> type | None:
    for where in (errors, module, builtins):
        found = getattr(where, name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
    return None


CASES = [(module, name) for module, names in PUBLIC.items() for name in names]


@pytest.mark.parametrize(("module_name", "qualname"), CASES)
def test_public_docstrings_name_what_they_raise(module_name: str, qualname: str) -> None:
    module = importlib.import_module(module_name)
    target: object = module
    for part in qualname.split("."):
        target = getattr(target, part)
    target = getattr(target, "__func__", target)  # classmethods
    doc = inspect.getdoc(target) or ""
    named = RAISED.findall(raises_section(doc))
    assert named, f"{module_name}.{qualname}: an empty Raises: section"
    home = importlib.import_module(getattr(target, "__module__", module_name))
    unknown = [n for n in named if exception_named(n, home) is None]
    assert not unknown, f"{module_name}.{qualname}: no such exception: {unknown}"
