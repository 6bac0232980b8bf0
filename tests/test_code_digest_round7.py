"""Red team round seven (findings 1, 3, 4, 13, 15): code the digest did not see, so an edit was
served as "unchanged" under ``--on-code-drift rebuild``.

1. Module-level rebinding forms (a walrus, ``with ... as``, ``match``, ``setattr`` on the
   module, ``globals().update``...) are bindings; ``exec`` makes the module's globals unknown.
3. A function's defaults and attributes count by value; a ``__code__`` put into a class is
   followed.
4. A ``build_config`` given as a partial or a bound method: its arguments and object count.
13. A binding that imports a value (``from cfg import K``) follows it to that module.
15. A module-level partial or bound method counts by what it carries.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from marin.execution.digest.code import CodeDigest, code_digest
from marin.execution.digest.code_drift import code_drifted
from marin.execution.lazy import ArtifactStep, lower
from tests.test_code_digest import Project, import_file
from tests.test_code_digest_round6 import unchanged, versions


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


# --- finding 1: more module-level rebinding forms -----------------------------------------------

CAPTURE = "import fractions\n\nK = 3\nF = fractions.Fraction(K)\n"
"""A value captured in a library object (compared by the source that made it only)."""
USE = "\n\ndef step(x):\n    return x * F\n"
ROUND7_REBINDINGS = {
    "walrus": "if (K := 5):\n    pass\n",
    "comprehension_walrus": "_ = [(K := 5) for _ in range(1)]\n",
    "with": "import contextlib\nwith contextlib.nullcontext(5) as K:\n    pass\n",
    "match": "match 5:\n    case K:\n        pass\n",
    "setattr_module": "import sys\nsetattr(sys.modules[__name__], 'K', 5)\n",
    "module_attribute": "import sys\nsys.modules[__name__].K = 5\n",
    "globals_update": "globals().update(K=5)\n",
    "globals_update_dict": "globals().update({{'K': 5}})\n",
    "globals_setitem": "globals().__setitem__('K', 5)\n",
    "vars_item": "vars()['K'] = 5\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND7_REBINDINGS))
def test_round7_finding_1_every_rebinding_form_is_a_binding(project: Project, case: str) -> None:
    """``r7-repro-1.sh``: ``K = 3`` -> ``K = 4`` changes what ``F`` captured, while ``K``'s
    value at lowering (5, rebound by the form) and ``F``'s statement are unchanged: drift."""
    source = CAPTURE + ROUND7_REBINDINGS[case] + USE
    before, again, after = versions(project, "K = 3", "K = 4", pipe=source)
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after), case


@pytest.mark.parametrize(
    "form", ["exec('K = 5')\n", "_NAMES = {{'K': 5}}\nglobals().update(_NAMES)\n"]
)
def test_round7_finding_1_a_dynamic_rebinding_makes_the_globals_unseen(
    project: Project, form: str
) -> None:
    """``exec`` or ``globals().update`` of a computed mapping may bind any name: what reads
    the module's globals is unknown, never "unchanged"."""
    digest = code_digest(project.load(pipe=CAPTURE + form + USE)["pipe"].step)
    assert any("globals" in u for u in digest.unseen), digest.unseen


# --- finding 3: a function's defaults, attributes and code ---------------------------------------

HELPERS = "def configure(f):\n    f.v = 30\n\n\ndef a(n):\n    return n + 30\n"
ROUND7_FUNCTION_STATE = {
    "defaults": "def h(k=3):\n    return k\n\n\nh.__defaults__ = (helpers.a(0),)\n"
                "\n\ndef step():\n    return h()\n",
    "kwdefaults": "def h(*, k=3):\n    return k\n\n\nh.__kwdefaults__ = {{'k': helpers.a(0)}}\n"
                  "\n\ndef step():\n    return h()\n",
    "attribute": "def g():\n    pass\n\n\nhelpers.configure(g)\n"
                 "\n\ndef step():\n    return g.v\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND7_FUNCTION_STATE))
def test_round7_finding_3_a_functions_defaults_and_attributes_count_by_value(
    project: Project, case: str
) -> None:
    """``r7-repro-3.sh``: what another module's code set as a function's defaults or
    attributes changes with that module: drift."""
    before, again, after = versions(
        project,
        "30",
        "40",
        helpers=HELPERS,
        pipe="import {helpers} as helpers\n\n\n" + ROUND7_FUNCTION_STATE[case],
    )
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after), case


def test_round7_finding_3_code_swapped_into_a_class_is_followed(project: Project) -> None:
    """``Model.compute.__code__ = _other.__code__``: an edit of ``_other`` is drift."""
    source = (
        "class Model:\n    def compute(self, n):\n        return 0\n\n\n"
        "def _other(self, n):\n    return n + 30\n\n\n"
        "Model.compute.__code__ = _other.__code__\n\n\n"
        "def step(n):\n    return Model().compute(n)\n"
    )
    before, again, after = versions(project, "n + 30", "n + 40", pipe=source)
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after)


# --- finding 4: a build_config given as a partial or a bound method ------------------------------

BUILD = """\
import functools


def run(config):
    return config


def bc(ctx, extra=0):
    if ctx.is_fingerprint:
        return {{"k": 0}}
    return {{"k": 30 + extra}}


class Builder:
    def __init__(self, e):
        self.e = e

    def make(self, ctx):
        return bc(ctx, self.e)


PARTIAL = functools.partial(bc, extra=1)
BOUND = Builder(1).make
"""


@pytest.mark.parametrize("attr", ["PARTIAL", "BOUND"])
def test_round7_finding_4_a_build_configs_arguments_and_object_count(
    project: Project, attr: str
) -> None:
    """``r7-repro-4.sh``: ``extra=1`` -> ``2`` (``Builder(1)`` -> ``Builder(2)``) changes the
    config the step runs with: the fingerprint (a partial's arguments, as ``fn``'s) or the
    code digest (the object's fields) differs, never both unchanged."""

    def spec(edit: bool) -> tuple[str, CodeDigest]:
        source = BUILD.replace("extra=1", "extra=2").replace("(1)", "(2)") if edit else BUILD
        pipe = project.load(pipe=source)["pipe"]
        step = ArtifactStep(
            name="c/s", version="v1", run=pipe.run, build_config=getattr(pipe, attr)
        )
        lowered = lower(step)
        assert lowered.code is not None
        return lowered.fingerprint, lowered.code

    (fp1, before), (fp2, again), (fp3, after) = spec(False), spec(False), spec(True)
    assert fp1 == fp2 and not before.unseen and unchanged(before, again)
    assert fp3 != fp1 or code_drifted(before, after)


# --- finding 13: a binding that imports a value --------------------------------------------------


@pytest.mark.parametrize("first", ["from cfg7 import K", "import cfg7\nK = cfg7.K"])
def test_round7_finding_13_an_imported_binding_is_followed(tmp_path: Path, first: str) -> None:
    """``r7-repro-13.sh``: ``K`` imported from cfg, captured, then rebound from cfg2: an edit
    of cfg.py is drift. (Fixed module names: an import statement's text names its module.)"""
    pipe = first + "\nimport fractions\nF = fractions.Fraction(K)\nfrom cfg7b import K\n" + USE

    def step(folder: str, k: int) -> CodeDigest:
        root = tmp_path / folder
        root.mkdir()
        sources = {"cfg7": f"K = {k}\n", "cfg7b": "K = 5\n", "pipe7": pipe}
        for name, source in sources.items():
            (root / f"{name}.py").write_text(source)
            import_file(name, root / f"{name}.py")
        return code_digest(sys.modules["pipe7"].step)

    try:
        before, again, after = step("a", 3), step("b", 3), step("c", 4)
    finally:
        for name in ("cfg7", "cfg7b", "pipe7"):
            sys.modules.pop(name, None)
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after)


# --- finding 15: module-level partials and bound methods ----------------------------------------

HELD = """\
K = 30


class Box:
    def __init__(self):
        self.v = 0

    def get(self):
        return self.v


def make():
    b = Box()
    b.v = 30
    return b


def add(a, b):
    return a + b
"""
ROUND7_CARRIED = {
    "partial": "P = functools.partial(helpers.add, helpers.K)\n\n\ndef step(n):\n    return P(n)\n",
    "partial_in_tuple": "PS = (functools.partial(helpers.add, helpers.K),)\n\n\n"
                        "def step(n):\n    return PS[0](n)\n",
    "bound_method": "G = helpers.make().get\n\n\ndef step(n):\n    return G()\n",
    "bound_method_in_dict": "H = {{'x': helpers.make().get}}\n\n\ndef step(n):\n    return H['x']()\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND7_CARRIED))
def test_round7_finding_15_what_a_partial_or_bound_method_carries_counts(
    project: Project, case: str
) -> None:
    """``r7-repro-15.sh``: another module's value captured by a module-level partial or bound
    method changes with that module: drift."""
    pipe = "import functools\nimport {helpers} as helpers\n" + ROUND7_CARRIED[case]
    before, again, after = versions(project, "30", "40", helpers=HELD, pipe=pipe)
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after), case


# --- findings 2, 9, 10: state the digest neither followed nor called unseen ----------------------

STATE_HELPERS = "def configure(b):\n    b.v = 30\n\n\ndef configure2(r):\n    r['v'] = 30\n\n\n"
STATE_HELPERS += "def a(n):\n    return n + 30\n"
ROUND7_HELD_STATE = {
    "instance_as_class_attr": "class Box:\n    pass\n\n\nclass Cfg:\n    b = Box()\n\n\n"
                              "helpers.configure(Cfg.b)\n\n\ndef step(n):\n    return Cfg.b.v\n",
    "instance_in_module_list": "class Box:\n    pass\n\n\nL = [Box()]\nhelpers.configure(L[0])\n"
                               "\n\ndef step(n):\n    return L[0].v\n",
    "dict_subclass_value": "class Reg(dict):\n    pass\n\n\nR = Reg()\nhelpers.configure2(R)\n"
                           "\n\ndef step(n):\n    return R['v']\n",
    "list_subclass_code": "class Seq(list):\n    pass\n\n\nR = Seq()\nR.append(helpers.a)\n"
                          "\n\ndef step(n):\n    return R[0](n)\n",
    "library_class_patched": "import fractions\n\n\ndef _add(self, other):\n    return 30\n\n\n"
                             "fractions.Fraction.__add__ = _add\n\n\n"
                             "def step(n):\n    return fractions.Fraction(n) + 1\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND7_HELD_STATE))
def test_round7_findings_2_10_held_state_and_patched_library_classes_count(
    project: Project, case: str
) -> None:
    """``r7-repro-2.sh``, ``r7-repro-10.sh``: a project instance held as a class attribute or
    in a list, a project dict/list subclass's items, a project function patched onto a
    library class: an edit of what they hold is drift."""
    pipe = "import {helpers} as helpers\n" + ROUND7_HELD_STATE[case]
    before, again, after = versions(project, "30", "40", helpers=STATE_HELPERS, pipe=pipe)
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after), case


@pytest.mark.parametrize(
    "holder",
    [
        "class Ctx:\n    pass\n\n\nC = Ctx()\nC.mod = helpers\n\n\ndef step(n):\n    return C.mod.a(n)\n",
        "class Ctx:\n    pass\n\n\nsetattr(Ctx, 'mod', helpers)\n\n\n"
        "def step(n):\n    return Ctx.mod.a(n)\n",
        "def carrier():\n    pass\n\n\ncarrier.m = helpers\n\n\ndef step(n):\n    return carrier.m.a(n)\n",
    ],
)
def test_round7_finding_9_a_project_module_held_as_a_field_is_followed_and_unseen(
    project: Project, holder: str
) -> None:
    """``r7-repro-9.sh``: a project module held by an instance, a class or a function: what
    a chain reads from it (``C.mod.a``) is followed, so its edit is drift; the holder's field
    itself is unseen (an alias of it is not followed), never "unchanged"."""
    pipe = "import {helpers} as helpers\n" + holder
    before, _, after = versions(project, "n + 30", "n + 40", helpers=STATE_HELPERS, pipe=pipe)
    assert any("project module held" in u for u in before.unseen), before.unseen
    assert code_drifted(before, after)
