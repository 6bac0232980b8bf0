"""Red team round six (findings 1, 2, 3, 6, 7, 8, 9): code the digest did not see, so an edit
was served as "unchanged" under ``--on-code-drift rebuild``.

1. A value captured from a module name bound more than once (``K = 3``, ``def h(k=K)``,
   ``K = 5``): every binding statement of such a name counts.
2. A function assigned onto a project class after its definition is followed.
3, 7. A module-level instance's fields: plain data by value, the code they hold followed (also
   through a ``defaultdict``'s factory and a ``deque``).
6. A project module used as a value (a local, a class attribute, a dict) is unseen, never
   "unchanged".
8, 9. A config object's class and a hand-made ``build_config`` are in the step's code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from marin.execution.digest.code import CodeDigest, code_digest
from marin.execution.digest.code_drift import code_drifted
from marin.execution.lazy import OUT, ArtifactStep, apply, lower
from marin.execution.store.identity import _code_unknown
from tests.test_code_digest import Project


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


def unchanged(before: CodeDigest, after: CodeDigest) -> bool:
    """What the plan would call "unchanged": comparable and equal."""
    return not code_drifted(before, after) and not _code_unknown(before, after)


def versions(project: Project, old: str, new: str, **sources: str) -> list[CodeDigest]:
    """The digests of ``pipe.step`` before, again (a fresh load of the same code), and after
    ``old`` -> ``new`` in every source."""

    def step(edit: bool) -> CodeDigest:
        loaded = {k: v.replace(old, new) if edit else v for k, v in sources.items()}
        return code_digest(project.load(**loaded)["pipe"].step)

    return [step(False), step(False), step(True)]


# --- finding 1: a value captured from a name bound more than once -------------------------------

ROUND6_CAPTURED = {
    "default": "def helper(x, k=K):\n    return x * k\n\n\nK = 5\n\n\n"
               "def step(x):\n    return helper(x)\n",
    "enum": "import enum\n\n\nclass Color(enum.Enum):\n    RED = K\n\n\nK = 5\n\n\n"
            "def step(x):\n    return x * Color.RED.value\n",
    "class_attr_instance": "class Box:\n    def __init__(self, v):\n        self.v = v\n\n\n"
                           "class Cfg:\n    box = Box(K)\n\n\nK = 5\n\n\n"
                           "def step(x):\n    return x * Cfg.box.v\n",
    "module_instance": "class Box:\n    def __init__(self, v):\n        self.v = v\n\n\n"
                       "B = Box(K)\nK = 5\n\n\ndef step(x):\n    return x * B.v\n",
    "dataclass_default": "import dataclasses\n\n\n@dataclasses.dataclass\nclass Cfg:\n"
                         "    k: int = K\n\n\nK = 5\n\n\ndef step(x):\n    return x * Cfg().k\n",
    "partial": "import functools\nimport operator\n\nP = functools.partial(operator.mul, K)\n"
               "K = 5\n\n\ndef step(x):\n    return P(x)\n",
    "global": "def helper(x, k=K):\n    return x * k\n\n\ndef _setup():\n    global K\n"
              "    K = 5\n\n\n_setup()\n\n\ndef step(x):\n    return helper(x)\n",
    "globals_item": "def helper(x, k=K):\n    return x * k\n\n\nglobals()['K'] = 5\n\n\n"
                    "def step(x):\n    return helper(x)\n",
    "derived": "J = K + 1\n\n\ndef helper(x, j=J):\n    return x * j\n\n\nK = 5\n\n\n"
               "def step(x):\n    return helper(x)\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND6_CAPTURED))
def test_round6_finding_1_a_value_captured_before_a_rebinding_is_code(
    project: Project, case: str
) -> None:
    """``r6-repro-1*.sh``: ``K = 3`` -> ``K = 4`` changes what a default, an enum member, a
    class attribute, an instance, a dataclass default or a partial captured, while ``K``'s
    value at lowering (5) and the capturing statement are unchanged: drift."""
    before, again, after = versions(
        project, "K = 3", "K = 4", pipe="K = 3\n" + ROUND6_CAPTURED[case]
    )
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after), case


def test_round6_finding_1_a_function_captured_before_its_name_is_redefined(
    project: Project,
) -> None:
    """``def impl`` twice, a default capturing the first: an edit of the first is drift."""
    source = "def impl(x):\n    return x * 30\n\n\ndef helper(x, f=impl):\n    return f(x)\n\n\n"
    source += "def impl(x):\n    return x\n\n\ndef step(x):\n    return helper(x)\n"
    before, again, after = versions(project, "x * 30", "x * 40", pipe=source)
    assert not before.unseen and unchanged(before, again)
    assert code_drifted(before, after)


def test_round6_finding_1_a_name_bound_once_still_counts_by_its_value(project: Project) -> None:
    """The rule adds the statements of a name bound more than once only: a name bound once is
    compared by its value, as before (``LIMITS["a"] = 2`` still counts)."""
    source = "K = 3\nLIMITS = {{'a': 1}}\n\n\ndef step(x, k=K):\n    return x * k * LIMITS['a']\n"
    before, again, after = versions(project, "K = 3", "K = 4", pipe=source)
    assert not before.unseen and unchanged(before, again)
    assert code_drifted(before, after)


# --- finding 2: a method assigned onto a class after it -----------------------------------------

MODEL = "class Model:\n    def compute(self):\n        return 1\n"
PATCHES = "from {model} import Model\n\n\ndef _compute(self):\n    return 30\n\n\n"
PATCHES += "Model.compute = _compute\n"
PATCHED_STEP = "import {patches}\nfrom {model} import Model\n\n\ndef step():\n"
PATCHED_STEP += "    return Model().compute()\n"


def test_round6_finding_2_a_method_assigned_from_another_module_is_followed(
    project: Project,
) -> None:
    """``r6-repro-2.sh``: ``Model.compute = _compute`` in another module; ``_compute`` edited."""
    before, again, after = versions(
        project, "return 30", "return 40", model=MODEL, patches=PATCHES, pipe=PATCHED_STEP
    )
    assert "_compute" in {p.name for p in before.parts}
    assert not before.unseen and unchanged(before, again)
    assert code_drifted(before, after)


def test_round6_finding_2_a_static_method_assigned_in_the_same_module_is_followed(
    project: Project,
) -> None:
    """``r6-repro-2b.sh``, through ``staticmethod`` too: the function it holds is followed."""
    source = MODEL + "\n\ndef _compute():\n    return 30\n\n\n"
    source += (
        "Model.compute = staticmethod(_compute)\n\n\ndef step():\n    return Model.compute()\n"
    )
    before, again, after = versions(project, "return 30", "return 40", pipe=source)
    assert not before.unseen and unchanged(before, again)
    assert code_drifted(before, after)


# --- findings 3 and 7: a module-level instance's fields ------------------------------------------

HELPER_A = "def a():\n    return 30\n"
ROUND6_HELD = {
    "instance_field": "class Reg:\n    pass\n\n\nR = Reg()\nR.f = helpers.a\n\n\n"
                      "def step():\n    return R.f()\n",
    "dataclass_field": "import dataclasses\nfrom typing import Any\n\n\n@dataclasses.dataclass\n"
                       "class Cfg:\n    fn: Any\n\n\nCFG = Cfg(fn=helpers.a)\n\n\n"
                       "def step():\n    return CFG.fn()\n",
    "method_type": "import types\n\n\nclass O:\n    pass\n\n\nO_ = O()\n"
                   "O_.compute = types.MethodType(lambda self: helpers.a(), O_)\n\n\n"
                   "def step():\n    return O_.compute()\n",
    "defaultdict": "import collections\n\nD = collections.defaultdict(lambda: helpers.a)\n\n\n"
                   "def step():\n    return D['x']()\n",
    "deque": "import collections\n\nPIPE = collections.deque([helpers.Scale(10)])\n\n\n"
             "def step():\n    return [s(1) for s in PIPE]\n",
    "partialmethod": "import functools\n\n\nclass M:\n    pass\n\n\n"
                     "M.c = functools.partialmethod(lambda self: helpers.a())\n\n\n"
                     "def step():\n    return M().c()\n",
    "library_instance": "import argparse\n\nNS = argparse.Namespace(f=helpers.a)\n\n\n"
                        "def step():\n    return NS.f()\n",
    "held_instance": "class Holder:\n    def __init__(self, f):\n        self.f = f\n\n\n"
                     "H = Holder(helpers.Scale(10))\n\n\ndef step():\n    return H.f(1)\n",
}  # fmt: skip
SCALE = HELPER_A + "\n\nclass Scale:\n    def __init__(self, k):\n        self.k = k\n\n"
SCALE += "    def __call__(self, x):\n        return x * self.k + a()\n"


@pytest.mark.parametrize("case", sorted(ROUND6_HELD))
def test_round6_finding_3_code_held_by_a_module_level_object_is_followed(
    project: Project, case: str
) -> None:
    """``r6-repro-3*.sh``: a function (or an instance whose class calls it) held by a module-level
    instance, a dataclass field, a ``MethodType``, a ``defaultdict``'s factory or a ``deque``:
    an edit of ``helpers.a`` is drift."""
    pipe = "import {helpers} as helpers\n\n" + ROUND6_HELD[case]
    before, again, after = versions(project, "return 30", "return 40", helpers=SCALE, pipe=pipe)
    assert "a" in {p.name for p in before.parts}, [p.name for p in before.parts]
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after), case


BOX = "class Box:\n    def __init__(self, v):\n        self.v = v\n\n\nB = Box(1)\n"
BOX_STEP = "\n\ndef step():\n    return B.v\n"
ROUND6_FIELDS = {
    "setattr": "setattr(B, 'v', 30)\n",
    "dict_update": "B.__dict__.update(v=30)\n",
    "another_module": "import {helpers} as helpers\n\nhelpers.configure(B)\n",
}
CONFIGURE = "def configure(b):\n    b.v = 30\n"


@pytest.mark.parametrize("case", sorted(ROUND6_FIELDS))
def test_round6_finding_7_a_module_level_instances_fields_count_by_value(
    project: Project, case: str
) -> None:
    """``r6-repro-7*.sh``: a field set by ``setattr``, ``__dict__.update`` or another module's
    function counts by its value at lowering."""
    pipe = BOX + ROUND6_FIELDS[case] + BOX_STEP
    before, again, after = versions(project, "30", "40", helpers=CONFIGURE, pipe=pipe)
    assert not before.unseen and unchanged(before, again)
    assert code_drifted(before, after), case


def test_round6_finding_7_an_instance_in_a_library_object_counts_by_value(
    project: Project,
) -> None:
    """A project instance held by a library's object (``argparse.Namespace``): its fields."""
    pipe = BOX + "import argparse\n\nNS = argparse.Namespace(b=B)\nsetattr(NS.b, 'v', 30)\n"
    pipe += "\n\ndef step():\n    return NS.b.v\n"
    before, again, after = versions(project, "30", "40", pipe=pipe)
    assert not before.unseen and unchanged(before, again)
    assert code_drifted(before, after)


# --- finding 6: a project module used as a value -------------------------------------------------

ROUND6_MODULE_VALUES = {
    "local": "import {helpers} as helpers\nimport {other} as other\n\n\ndef step():\n"
             "    helpers = other\n    return helpers.a()\n",
    "class_attr": "import {other} as other\n\n\nclass C:\n    impl = other\n\n\n"
                  "def step():\n    return C.impl.a()\n",
    "dict": "import {other} as other\n\nMODS = {{'m': other}}\n\n\ndef step():\n"
            "    return MODS['m'].a()\n",
    "global": "import {helpers} as helpers\nimport {other} as helpers2\n\n\ndef step():\n"
              "    global helpers\n    helpers = helpers2\n    return helpers.a()\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND6_MODULE_VALUES))
def test_round6_finding_6_a_project_module_used_as_a_value_is_unseen(
    project: Project, case: str
) -> None:
    """``r6-repro-6*.sh``: what is read from a module reached as a value is not followed, so the
    step's code is unseen (``code not compared``), never "unchanged"."""
    before, _, after = versions(
        project, "return 30", "return 40", helpers=HELPER_A, other=HELPER_A,
        pipe=ROUND6_MODULE_VALUES[case],
    )  # fmt: skip
    assert any("a project module" in u for u in before.unseen), before.unseen
    assert not unchanged(before, after)


ORDINARY = """\
import dataclasses
import logging
import threading

import {helpers} as helpers

logging.basicConfig()
LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class Service:
    name: str
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


SERVICE = Service("s")
SERVICE.words = list(range(200_000))  # a vocabulary loaded at import: too large to compare


def step():
    LOG.info("start")
    with SERVICE.lock:
        return helpers.a(), SERVICE.name, len(SERVICE.words)
"""


def test_round6_ordinary_module_level_code_stays_comparable(project: Project) -> None:
    """A ``logging.basicConfig()`` call, a logger, an instance holding a lock or a large list
    and a module read by attribute neither make the step unseen nor read as drift."""
    before, again, after = versions(project, "return 30", "return 40", helpers=HELPER_A,
                                    pipe=ORDINARY)  # fmt: skip
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after)


# --- findings 8 and 9: the config's class and a hand-made build_config ---------------------------

CFGS = """\
import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Cfg:
    n: int
    SCALE: ClassVar[int] = 3

    def total(self):
        return self.n * 10
"""
WRITE = "def write(out_path, cfg):\n    return cfg.total() * cfg.SCALE\n"


@pytest.mark.parametrize(("old", "new"), [("= 3", "= 4"), ("* 10", "* 20")])
def test_round6_finding_8_a_config_objects_class_is_code(
    project: Project, old: str, new: str
) -> None:
    """``r6-repro-8.sh``, ``8b``: a ``ClassVar`` or a method of a config object's class is in
    neither the fingerprint nor ``write``'s source: it is the step's code."""

    def spec(edit: bool) -> CodeDigest:
        loaded = project.load(cfgs=CFGS.replace(old, new) if edit else CFGS, pipe=WRITE)
        step = apply("c/s", loaded["pipe"].write, version="v1", out_path=OUT,
                     cfg=loaded["cfgs"].Cfg(n=1))  # fmt: skip
        code = lower(step).code
        assert code is not None
        return code

    before, again, after = spec(False), spec(False), spec(True)
    assert "Cfg" in {p.name for p in before.parts}
    assert not before.unseen and unchanged(before, again)
    assert code_drifted(before, after)
    plain = apply("c/p", project.load(pipe=WRITE)["pipe"].write, version="v1", out_path=OUT, cfg=1)
    assert lower(plain).code == code_digest(plain.run.fn)  # type: ignore[attr-defined]


BUILD = """\
def build_config(ctx):
    if ctx.is_fingerprint:
        return {{"take": None}}
    return {{"take": 100 // 2}}


def run(config):
    return config["take"]
"""


def test_round6_finding_9_a_build_configs_code_is_the_steps_code(project: Project) -> None:
    """``r6-repro-9.sh``: the run-time branch of a hand-made ``build_config`` makes the config
    the step runs with, and the fingerprint sees only the other branch: its code counts."""

    def spec(edit: bool) -> CodeDigest:
        pipe = project.load(pipe=BUILD.replace("// 2", "// 4") if edit else BUILD)["pipe"]
        step = ArtifactStep(name="c/s", version="v1", run=pipe.run, build_config=pipe.build_config)
        code = lower(step).code
        assert code is not None
        return code

    before, again, after = spec(False), spec(False), spec(True)
    assert {"run", "build_config"} <= {p.name for p in before.parts}
    assert not before.unseen and unchanged(before, again)
    assert code_drifted(before, after)


DECORATED = """\
import logging

LOG = logging.getLogger("x")


def traced(logger):
    def deco(f):
        def wrapper(*a):
            logger.info("call")
            return f(*a)

        return wrapper

    return deco


class Model:
    @traced(LOG)
    def compute(self):
        return 30


def step():
    return Model().compute()
"""


def test_round6_finding_2_a_decorators_wrapper_in_the_class_body_is_not_a_patch(
    project: Project,
) -> None:
    """A method a decorator replaced (no ``functools.wraps``) is code of the class body and
    the decorator: its wrapper's closure (a logger) does not make the step unseen."""
    before, again, after = versions(project, "return 30", "return 40", pipe=DECORATED)
    assert not before.unseen and unchanged(before, again), before.unseen
    assert code_drifted(before, after)
