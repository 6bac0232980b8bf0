"""Red team r36-2: a module-level value the code digest reads by value (a registry filled by
calls, an object's field, a class attribute, a function's default) silently dropped out of
the digest once it held a value of a type it could not read (a numpy number, a ``Path``, a
``date``): an edit was served under ``--on-code-drift error``. Such values are read by value;
any other is unseen, never unchanged, and never hides the plain values beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin.execution.digest.code import code_digest
from marin.execution.digest.code_drift import code_drifted
from tests.test_code_digest import Project


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


VALUES = [
    ("np.float64(0.1)", "np.float64(0.2)"),
    ("np.float32(0.1)", "np.float32(0.2)"),
    ("np.int64(3)", "np.int64(4)"),
    ("np.array([1.0, 2.0])", "np.array([1.0, 3.0])"),
    ("np.logspace(-4, -2, 3)[1]", "np.logspace(-4, -2, 5)[1]"),
    ("{'lr': np.float64(0.1)}", "{'lr': np.float64(0.2)}"),
    ("(1, np.float64(0.1))", "(1, np.float64(0.2))"),
    ("pathlib.Path('corpus/v1')", "pathlib.Path('corpus/v2')"),
    ("pathlib.PurePosixPath('a')", "pathlib.PurePosixPath('b')"),
    ("datetime.date(2026, 1, 1)", "datetime.date(2026, 1, 2)"),
    ("datetime.timedelta(hours=1)", "datetime.timedelta(hours=2)"),
    ("decimal.Decimal('0.1')", "decimal.Decimal('0.2')"),
    ("fractions.Fraction(1, 3)", "fractions.Fraction(1, 4)"),
    ("range(3)", "range(4)"),
    ("slice(1, 3)", "slice(1, 4)"),
    ("Name('s')", "Name('t')"),
    ("collections.OrderedDict(a=1)", "collections.OrderedDict(a=2)"),
    ("collections.deque([1])", "collections.deque([2])"),
]
"""A value before and after an edit, registered through a call, so no statement's source
changes: ``Name`` is a ``str`` subclass of the project."""

def _escaped(value: str) -> str:
    return value.replace("{", "{{").replace("}", "}}")  # (``Project.load`` formats sources)


HEADER = """\
    import collections, datetime, decimal, fractions, pathlib
    import numpy as np


    class Name(str):
        pass


"""


@pytest.mark.parametrize(("before", "after"), VALUES)
@pytest.mark.parametrize("registry", ["{{}}", "dict()", "collections.OrderedDict()"])
def test_a_registry_filled_by_a_call_is_read_by_value(
    project: Project, registry: str, before: str, after: str
) -> None:
    """A value, and a plain float beside it in the same registry: each edit is drift."""
    source = HEADER + f"""\
    TABLE = {registry}


    def register(key, value):
        TABLE[key] = value


    register("v", VALUE_)
    register("lr", LR_)


    def gen(out_path):
        return TABLE["v"], TABLE["lr"]
    """

    def digest(value: str, lr: str) -> object:
        text = source.replace("VALUE_", _escaped(value)).replace("LR_", lr)
        return code_digest(project.load(hp=text)["hp"].gen)

    first = digest(before, "0.1")
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest(before, "0.1"))
    assert code_drifted(first, digest(after, "0.1")), (before, after)
    assert code_drifted(first, digest(before, "0.2")), before


@pytest.mark.parametrize(("before", "after"), VALUES)
@pytest.mark.parametrize("holder", ["field", "class", "default"])
def test_a_value_another_module_sets_is_read_by_value(
    project: Project, holder: str, before: str, after: str
) -> None:
    """An object's field, a class attribute and a function's default set by a ``configure``
    call elsewhere: each edit is drift."""
    hp = HEADER + """\
    class Box:
        v = None


    BOX = Box()


    def scale(x, v=None):
        return x, v


    def gen(out_path):
        return BOX.v, Box.v, scale(1)
    """
    set_it = {
        "field": "hp.BOX.v = VALUE_",
        "class": "hp.Box.v = VALUE_",
        "default": "hp.scale.__defaults__ = (VALUE_,)",
    }[holder]
    pipe = HEADER + "    import {hp} as hp\n\n    " + set_it + "\n"

    def digest(value: str) -> object:
        modules = project.load(hp=hp, pipe=pipe.replace("VALUE_", _escaped(value)))
        return code_digest(modules["hp"].gen)

    first = digest(before)
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest(before))
    assert code_drifted(first, digest(after)), (holder, before, after)


def test_a_value_the_digest_cannot_read_is_unseen_and_hides_nothing(project: Project) -> None:
    """A lock in a registry filled by calls cannot be compared: the registry is unseen (not
    unchanged), and its plain values still count."""
    source = """\
    import threading

    TABLE = {{}}


    def register(key, value):
        TABLE[key] = value


    register("lock", threading.Lock())
    register("lr", LR)


    def gen(out_path):
        return TABLE["lr"]
    """
    first = code_digest(project.load(hp=source.replace("LR", "0.1"))["hp"].gen)
    assert len(first.unseen) == 1 and "TABLE" in first.unseen[0], first.unseen
    assert "lock" in first.unseen[0] or "Lock" in first.unseen[0], first.unseen
    second = code_digest(project.load(hp=source.replace("LR", "0.2"))["hp"].gen)
    assert code_drifted(first, second)
