"""Red team r36-2: a module-level value the code digest reads by value (a registry filled by
calls, an object's field, a class attribute, a function's default) silently dropped out of
the digest once it held a value of a type it could not read (a numpy number, a ``Path``, a
``date``): an edit was served under ``--on-code-drift error``. Such values are read by value;
any other is unseen, never unchanged, and never hides the plain values beside it."""

from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from marin.execution.digest.code import code_digest, new_lowering
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
    # Round 37: an array's memory order and write flag (r37-3), a NaN's sign (r37-4).
    ("np.arange(6.0).reshape(2, 3).T", "np.ascontiguousarray(np.arange(6.0).reshape(2, 3).T)"),
    ("np.zeros(2)", "_read_only(np.zeros(2))"),
    ("float('nan')", "-float('nan')"),
    ("np.float64('nan')", "-np.float64('nan')"),
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


    def _read_only(array):
        array.setflags(write=False)
        return array


"""


REGISTRIES = [
    "{{}}",
    "dict()",
    "collections.OrderedDict()",
    # Round 37 (r37-2): a registry however it was made, filled by a function's items.
    "collections.defaultdict(lambda: 0.0)",
    "_new()",
    "{{}}.copy()",
    "{{**BASE}}",
    "{{}} if True else None",
]


def _registry(registry: str) -> str:
    return (
        HEADER
        + f"""\
    BASE = {{{{}}}}


    def _new():
        return {{{{}}}}


    TABLE = {registry}


    def register(key, value):
        TABLE[key] = value


    register("v", VALUE_)
    register("lr", LR_)


    def gen(out_path):
        return TABLE["v"], TABLE["lr"]
    """
    )


@pytest.mark.parametrize(("before", "after"), VALUES)
@pytest.mark.parametrize("registry", REGISTRIES)
def test_a_registry_filled_by_a_call_is_read_by_value(
    project: Project, registry: str, before: str, after: str
) -> None:
    """A value, and a plain float beside it in the same registry: each edit is drift."""
    source = _registry(registry)

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
    hp = (
        HEADER
        + """\
    class Box:
        v = None


    BOX = Box()


    def scale(x, v=None):
        return x, v


    def gen(out_path):
        return BOX.v, Box.v, scale(1)
    """
    )
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


@pytest.mark.parametrize(
    "configure",
    [
        "global LR\n        LR = value",
        "global LR\n        LR += value",
        "global TABLE\n        TABLE |= {{'lr': value}}",
        "global TABLE\n        TABLE = {{**TABLE, 'lr': value}}",
    ],
)
def test_a_name_a_function_sets_under_global_is_read_by_value(
    project: Project, configure: str
) -> None:
    """Red team r37-1: ``configure(0.1)`` setting ``LR`` under ``global`` counted by the source
    of ``LR = value`` only, so ``configure(0.2)`` was served. Set from what the function is
    called with, its value counts (one computed there alone, ``RUN = uuid4().hex``, does not:
    another in every process)."""
    hp = f"""\
    LR = 0.0
    TABLE = {{{{}}}}


    def configure(value):
        {configure}


    def gen(out_path):
        return LR, TABLE
    """
    pipe = "import {hp} as hp\n\nhp.configure(VALUE_)\n"

    def digest(value: str) -> object:
        return code_digest(project.load(hp=hp, pipe=pipe.replace("VALUE_", value))["hp"].gen)

    first = digest("0.1")
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest("0.1"))
    assert code_drifted(first, digest("0.2")), configure


def test_a_nans_sign_is_its_own_fingerprint_and_the_usual_nan_keeps_its_form() -> None:
    """Red team r37-4: ``nan`` and ``-nan`` had one fingerprint; ``fn`` writes their bytes."""
    import numpy as np

    from marin.execution.pipeline.canonical import to_canonical

    assert to_canonical(float("nan")) == {"__float__": "nan"}  # stored fingerprints hold
    assert to_canonical(-float("nan")) == {"__float__": "nan:fff8000000000000"}
    assert to_canonical(np.float64("nan")) != to_canonical(-np.float64("nan"))
    assert to_canonical(float("inf")) == {"__float__": "inf"}


def test_a_collections_namedtuple_in_a_registry_is_read_by_its_fields(project: Project) -> None:
    """Red team r37-5: a ``collections.namedtuple`` in a registry was unseen on every plan,
    "edited since it was imported?"; its fields are read by value, its class is the library's."""
    source = """\
    import collections

    NT = collections.namedtuple("NT", "a b")
    TABLE = {{}}


    def register(key, value):
        TABLE[key] = value


    register("lr", NT(1, LR_))


    def gen(out_path):
        return TABLE["lr"].b, NT(3, 4)
    """
    first = code_digest(project.load(hp=source.replace("LR_", "0.1"))["hp"].gen)
    assert first.unseen == [], first.unseen
    assert not code_drifted(
        first, code_digest(project.load(hp=source.replace("LR_", "0.1"))["hp"].gen)
    )
    assert code_drifted(first, code_digest(project.load(hp=source.replace("LR_", "0.2"))["hp"].gen))


@pytest.mark.parametrize("made", ["{{}}", "dict()", "_new()", "collections.defaultdict(float)"])
def test_a_class_level_registry_however_made_is_read_by_value(project: Project, made: str) -> None:
    """Round 37's r37-2 on a class: ``Model.REG = _new()`` filled by ``register()`` counted by
    that call's source only."""
    source = f"""\
    import collections


    def _new():
        return {{{{}}}}


    class Model:
        REG = {made}


    def register(key, value):
        Model.REG[key] = value


    register("lr", LR_)


    def gen(out_path):
        return Model.REG["lr"]
    """

    def digest(lr: str) -> object:
        return code_digest(project.load(hp=source.replace("LR_", lr))["hp"].gen)

    first = digest("0.1")
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest("0.1"))
    assert code_drifted(first, digest("0.2")), made


def test_a_typing_namedtuple_class_keeps_its_methods_followed(project: Project) -> None:
    """A ``typing.NamedTuple`` class is made by ``collections.namedtuple`` too, but has a
    definition: its methods are code (only a class with no definition is the library's)."""
    source = """\
    from typing import NamedTuple


    class Cfg(NamedTuple):
        k: int

        def scaled(self):
            return self.k * 10


    def gen(out_path):
        return Cfg(1).scaled()
    """
    first = code_digest(project.load(hp=source)["hp"].gen)
    assert first.unseen == [] and [p.name for p in first.parts] == ["gen", "Cfg"], first.parts
    edited = code_digest(project.load(hp=source.replace("* 10", "* 20"))["hp"].gen)
    assert code_drifted(first, edited)


def test_two_lambdas_on_one_line_and_a_class_in_two_branches_are_told_apart(
    project: Project,
) -> None:
    """Red team r39-1: two lambdas on one line (a one-line table ``{"inc": lambda x: x + 1,
    "dbl": lambda x: x * 2}``) and a class defined in two branches were hashed together, so
    choosing the other one was no change."""
    source = """\
    ACT = {{"inc": lambda x: x + 1, "dbl": lambda x: x * 2}}
    FAST = True
    if FAST:
        class Model:
            def out(self):
                return "fast"
    else:
        class Model:
            def out(self):
                return "slow"


    def gen(out_path):
        return ACT["inc"](1), Model().out()
    """

    def digest(text: str) -> object:
        module = project.load(hp=text)["hp"]
        return code_digest(module.ACT["inc"]), code_digest(module.Model)

    (inc, fast) = digest(source)
    slow = digest(source.replace("FAST = True", "FAST = False"))[1]
    assert inc.unseen == [] and fast.unseen == [], (inc, fast)
    assert code_drifted(inc, code_digest(project.load(hp=source)["hp"].ACT["dbl"]))
    assert code_drifted(fast, slow)
    assert not code_drifted(fast, digest(source)[1])


def test_two_objects_state_in_a_registry_are_named_without_a_placeholder(
    project: Project,
) -> None:
    """Red team r39-2: the second of two objects' states in a registry was named
    ``E.<carried> (?)``, a placeholder, in drift messages."""
    source = """\
    import enum


    class E(enum.Enum):
        A = 1
        B = 2


    REG = []


    def register(member):
        REG.append(member)


    register(E.A)
    register(E.B)


    def gen(out_path):
        return REG
    """
    names = [p.name for p in code_digest(project.load(hp=source)["hp"].gen).parts]
    assert len(names) == len(set(names)) and not any("(?)" in n for n in names), names


def test_a_class_a_function_makes_counts_its_values_bases_and_cells(project: Project) -> None:
    """Red team r40-1, r40-2: a class made inside a function (a factory, a decorator returning
    a subclass) was its ``class`` statement's source alone: the arguments it was made from (a
    class attribute, a method's closure cell) and its base (a parameter) were not compared."""
    hp = """\
    def make_cls(k):
        class C:
            K = k

            def f(self):
                return self.K * k

        return C


    def with_scale(s):
        def deco(cls):
            class Scaled(cls):
                S = s

            return Scaled

        return deco


    CLASSES = [make_cls(1), make_cls(2)]
    TABLE = {{}}


    def register(key, value):
        TABLE[key] = value
    """
    pipe = """\
    import {hp} as hp

    hp.register("c", hp.CLASSES[PICK_])


    @hp.with_scale(SCALE_)
    class Model:
        S = 0

        def f(self):
            return self.S * 10


    def gen(out_path):
        return hp.TABLE["c"]().f(), Model().f()
    """

    def digest(pick: str = "0", scale: str = "1", body: str = "* 10") -> object:
        text = pipe.replace("PICK_", pick).replace("SCALE_", scale).replace("* 10", body)
        return code_digest(project.load(hp=hp, pipe=text)["pipe"].gen)

    first = digest()
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest())
    assert code_drifted(first, digest(pick="1"))  # the other class the factory made
    assert code_drifted(first, digest(scale="2"))  # the decorator's argument
    assert code_drifted(first, digest(body="* 100"))  # the decorated class's own body


def test_an_imported_alias_of_library_code_and_an_abc_registration_are_compared(
    project: Project,
) -> None:
    """Red team r42-1: ``from hp import act`` with ``act = math.floor`` in hp was not followed
    back to hp's statement (only to what it reads, and math is not the project's). r42-2:
    ``Marker.register(float)`` (whom ``isinstance`` accepts) was in no digest."""
    hp = """\
    import abc
    import math

    act = math.floor
    Num = int


    class Marker(abc.ABC):
        pass


    Marker.register(int)
    """
    pipe = """\
    from {hp} import Marker, Num, act


    def gen(out_path):
        return act(1.5), Num(1), [isinstance(v, Marker) for v in (1, 2.0)]
    """

    def digest(text: str) -> object:
        return code_digest(project.load(hp=text, pipe=pipe)["pipe"].gen)

    first = digest(hp)
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest(hp))
    assert code_drifted(first, digest(hp.replace("math.floor", "math.ceil")))
    assert code_drifted(first, digest(hp.replace("Num = int", "Num = float")))
    registered = "Marker.register(int)\n    Marker.register(float)"
    assert code_drifted(first, digest(hp.replace("Marker.register(int)", registered)))


@pytest.mark.parametrize(
    ("layers", "edit"),
    [
        ("FAST = True\nif FAST:\n    act = math.floor\nelse:\n    act = math.ceil\n",
         ("FAST = True", "FAST = False")),
        ("from {ops} import act\n", ("math.floor", "math.ceil")),
        ("from {ops} import *\n", ("math.floor", "math.ceil")),
    ],
)  # fmt: skip
def test_which_library_function_a_project_name_holds_is_compared(
    project: Project, layers: str, edit: tuple[str, str]
) -> None:
    """Red team r43-1, r43-2: a library function chosen by a branch, re-exported by another
    project module or star-imported: what decides it was no statement the digest read."""
    ops = "import math\n\nact = math.floor\n"
    pipe = "import math\n\nfrom {layers} import act\n\n\ndef gen(out_path):\n    return act(1.5)\n"

    def digest(ops_text: str, layers_text: str) -> object:
        modules = project.load(ops=ops_text, layers="import math\n" + layers_text, pipe=pipe)
        return code_digest(modules["pipe"].gen)

    first = digest(ops, layers)
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest(ops, layers))
    old, new = edit
    edited = digest(ops.replace(old, new), layers.replace(old, new))
    assert code_drifted(first, edited), layers


@pytest.mark.parametrize(
    ("ops", "edit"),
    [
        ("FAST = True\nif FAST:\n    act = np.floor\nelse:\n    act = np.ceil\n",
         ("FAST = True", "FAST = False")),
        ("FAST = True\nif FAST:\n    act = str.upper\nelse:\n    act = str.lower\n",
         ("FAST = True", "FAST = False")),
        ("DT = np.dtype('float16')\n", ("float16", "float32")),
        ("FAST = True\nif FAST:\n    act = re.compile('a')\nelse:\n    act = re.compile('b')\n",
         ("FAST = True", "FAST = False")),
    ],
)  # fmt: skip
def test_library_objects_a_branch_or_a_re_export_picks_are_compared(
    project: Project, ops: str, edit: tuple[str, str]
) -> None:
    """Red team r44-1, r44-2: a ufunc or a C class's method picked by a branch, a library object
    re-exported through a second module or picked by a branch: what decides it (the ``if``'s
    test, the statement two imports away) was read by no digest."""
    name = "DT" if "DT" in ops else "act"
    pipe = f"from {{layers}} import {name}\n\n\ndef gen(out_path):\n    return {name}\n"

    def digest(text: str) -> object:
        modules = project.load(
            ops="import re\n\nimport numpy as np\n\n" + text,
            layers=f"from {{ops}} import {name}\n",
            pipe=pipe,
        )
        return code_digest(modules["pipe"].gen)

    first = digest(ops)
    assert not code_drifted(first, digest(ops))
    assert code_drifted(first, digest(ops.replace(*edit))), ops


@pytest.mark.parametrize(
    ("source", "name", "module"),
    [
        ("def h(x):\n    return x * SCALE_\n", "h", None),
        ("class Scaler:\n    def f(self, x):\n        return x * SCALE_\n", "Scaler", "builtins"),
    ],
)
def test_code_a_file_exec_into_a_bare_namespace_makes_is_followed(
    tmp_path: Path, source: str, name: str, module: str | None
) -> None:
    """Red team r41-1, r44-3: ``exec(compile(src, path, "exec"), {})`` (a plugin or config
    loader) makes functions with no module name and classes whose module is ``builtins``: taken
    for library code or the interpreter's, never compared."""

    def loaded(scale: int) -> Any:
        path = tmp_path / f"plugin_{name}_{scale}.py"
        path.write_text(source.replace("SCALE_", str(scale)))
        namespace: dict[str, Any] = {}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        return namespace[name]

    three = loaded(3)
    assert three.__module__ == module
    digest = code_digest(three)
    assert digest.digest is not None and digest.unseen == [], digest
    assert code_drifted(digest, code_digest(loaded(5)))


def _dtype_package(tmp_path: Path, init: str, dtype: str) -> tuple[str, Path]:
    """A fresh package whose ``pkg/impl.py`` binds ``DT`` and whose ``pkg/__init__.py`` is
    ``init``: its name and folder."""
    package = f"digest_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / package
    (folder / "pkg").mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "pkg" / "__init__.py").write_text(init)
    (folder / "pkg" / "impl.py").write_text(f"import numpy as np\n\nDT = np.dtype('{dtype}')\n")
    return package, folder


def test_a_match_case_a_star_import_and_a_relative_re_export_are_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r45: which ``case`` of a module-level ``match`` binds a name (r45-1), a library
    object reached through ``from hp import *`` (r45-2) or re-exported by a package's
    ``__init__`` with ``from .impl import DT`` (r45-3): what decides it was read by no digest."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def digest(mode: str, dtype: str) -> Any:
        package, folder = _dtype_package(tmp_path, "from .impl import DT\n", dtype)
        (folder / "hp.py").write_text(
            f"import re\n\nMODE = '{mode}'\nmatch MODE:\n    case 'digits':\n"
            "        PAT = re.compile('[0-9]')\n    case _:\n        PAT = re.compile('[0-9]+')\n"
        )
        (folder / "star.py").write_text(f"from {package}.pkg import DT\n")
        (folder / "pipe.py").write_text(
            f"from {package}.hp import PAT\nfrom {package}.star import *\n\n\n"
            "def gen(out_path):\n    return PAT, DT\n"
        )
        return code_digest(importlib.import_module(f"{package}.pipe").gen)

    first = digest("digits", "float16")
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest("digits", "float16"))
    assert code_drifted(first, digest("numbers", "float16"))
    assert code_drifted(first, digest("digits", "float32"))


def test_a_match_guard_a_relative_star_import_and_a_library_module_alias_are_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r46: the guard of a module-level ``match`` case (r46-1), a library object a
    package ``__init__`` exposes with ``from .impl import *`` (r46-2), and which library module
    a project name holds (``import numpy as xp`` in ``backend``, r46-3) were in no digest."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def digest(guard: str, dtype: str, backend: str) -> Any:
        package, folder = _dtype_package(tmp_path, "from .impl import *\n", dtype)
        (folder / "backend.py").write_text(f"import {backend} as xp\n")
        (folder / "hp.py").write_text(
            f"GUARD = {guard}\nmatch 'fast':\n    case 'fast' if GUARD:\n        K = 1\n"
            "    case _:\n        K = 2\n"
        )
        (folder / "pipe.py").write_text(
            f"from {package} import backend\nfrom {package}.hp import K\n"
            f"from {package}.pkg import DT\n\n\n"
            "def gen(out_path):\n    return K, DT, backend.xp.sqrt(4)\n"
        )
        return code_digest(importlib.import_module(f"{package}.pipe").gen)

    first = digest("True", "float16", "math")
    assert first.unseen == [], first.unseen  # nothing changed DT after its statement: r46-4
    assert not code_drifted(first, digest("True", "float16", "math"))
    assert code_drifted(first, digest("False", "float16", "math"))
    assert code_drifted(first, digest("True", "float32", "math"))
    assert code_drifted(first, digest("True", "float16", "cmath"))


def test_an_import_inside_a_function_adds_nothing_only_this_process_can_see(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full suite's finding on round 46's fix: a library module or function a step imports
    inside its body resolves only where that library is loaded (the driver, not an isolated
    process), so naming it made the two digests differ and every isolated check fail."""
    import json.decoder

    from marin.execution.digest.code import clear_cache

    source = """\
    def gen(out_path):
        from json import decoder
        from json.decoder import scanstring

        return decoder.JSONDecoder, scanstring
    """
    loaded = code_digest(project.load(hp=source)["hp"].gen)
    monkeypatch.delitem(sys.modules, "json.decoder")
    clear_cache()
    unloaded = code_digest(project.load(hp=source)["hp"].gen)
    assert json.decoder is not None and unloaded.digest == loaded.digest, (loaded, unloaded)


R47_STATE = [
    ("PARSER = argparse.ArgumentParser()\nPARSER.add_argument('--lr', default=0.1)\n",
     "vars(PARSER.parse_args([]))", ("0.1", "0.2")),
    ("RNG = random.Random(1)\nRNG.seed(2)\n", "RNG.random()", ("seed(2)", "seed(3)")),
    ("H = hashlib.sha256()\nH.update(b'salt-v1')\n", "H.copy().hexdigest()", ("v1", "v2")),
    ("VAR = contextvars.ContextVar('v', default=3)\nVAR.set(4)\n", "VAR.get()", ("4", "5")),
    ("P = argparse.ArgumentParser()\nP.add_argument_group('g').add_argument('--x', default=1)\n",
     "vars(P.parse_args([]))", ("default=1", "default=2")),
    ("FAST = True\nP = argparse.ArgumentParser()\nif FAST:\n    P.add_argument('--x')\n",
     "vars(P.parse_args([]))", ("FAST = True", "FAST = False")),
]  # fmt: skip


@pytest.mark.parametrize(("state", "read", "edit"), R47_STATE)
@pytest.mark.parametrize("where", ["own", "other"])
def test_a_module_level_call_that_sets_a_library_objects_state_is_its_source(
    project: Project, state: str, read: str, edit: tuple[str, str], where: str
) -> None:
    """Red team r47-1: ``PARSER.add_argument(...)``, ``RNG.seed(2)``, ``H.update(salt)`` at
    module level change what the name holds after its statement (an attribute store did count):
    a method call on a module-level name counts as its source, so does the ``if`` around it."""
    imports = "import argparse, contextvars, hashlib, random\n"
    step = f"\n\ndef gen(out_path):\n    return {read}\n"

    def digest(text: str) -> object:
        if where == "own":
            return code_digest(project.load(pipe=imports + text + step)["pipe"].gen)
        pipe = imports + "from {state} import *\n" + step  # (a star import of the holder)
        return code_digest(project.load(state=imports + text, pipe=pipe)["pipe"].gen)

    first = digest(state)
    assert not code_drifted(first, digest(state))
    assert code_drifted(first, digest(state.replace(*edit))), (state, edit)


def test_a_project_function_a_module_level_call_hands_a_library_object_is_followed(
    project: Project,
) -> None:
    """Red team r47-2: ``P.add_argument("--x", type=helpers.parse)`` keeps ``parse`` deep in
    the parser's state, where the digest does not look; the call's source reads it, so it is
    followed from there."""
    pipe = """\
    import argparse

    import {helpers} as helpers

    P = argparse.ArgumentParser()
    P.add_argument("--x", type=helpers.parse)


    def gen(out_path):
        return vars(P.parse_args(["--x", "3"]))
    """

    def digest(body: str) -> object:
        helpers = f"def parse(s):\n    return {body}\n"
        return code_digest(project.load(helpers=helpers, pipe=pipe)["pipe"].gen)

    first = digest("int(s) * 2")
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest("int(s) * 2"))
    assert code_drifted(first, digest("int(s) * 3"))


@pytest.mark.parametrize("init", ["from .impl import *\n", "from .impl import act\n"])
def test_a_library_function_a_package_re_exports_is_compared_not_unseen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, init: str
) -> None:
    """Red team r46-4: ``act = np.floor`` re-exported by a package ``__init__`` (a relative
    import, star or not) was read by value, as if a later statement had changed it, so it was
    unseen ("changed after its statement holds ufunc"): it is followed to its statement."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def digest(act: str) -> Any:
        package, folder = _dtype_package(tmp_path, init, "float16")
        (folder / "pkg" / "impl.py").write_text(f"import numpy as np\n\nact = np.{act}\n")
        (folder / "pipe.py").write_text(
            f"from {package}.pkg import act\n\n\ndef gen(out_path):\n    return act(1.5)\n"
        )
        return code_digest(importlib.import_module(f"{package}.pipe").gen)

    first = digest("floor")
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest("floor"))
    assert code_drifted(first, digest("ceil"))


def test_a_registry_of_library_functions_filled_by_calls_is_compared(project: Project) -> None:
    """Red team r44-4: ``reg("floor", math.floor)`` filled a registry a step reads with C
    functions the digest could not read, so the step was never compared ("changed after its
    statement"); one its module holds under its own name compares by that name. A bound
    method of a library object (``random.random``) holds that object's state: still unseen."""
    source = """\
    import math
    import random

    import numpy as np

    REG = dict()


    def reg(name, f):
        REG[name] = f


    reg("act", math.{act})
    reg("u", np.{act})
    reg("m", str.upper)
    {extra}


    def gen(out_path):
        return REG["act"](1.5), REG["u"](1.5)
    """

    def digest(act: str, extra: str = "") -> Any:
        return code_digest(project.load(hp=source.format(act=act, extra=extra))["hp"].gen)

    first = digest("floor")
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest("floor"))
    assert code_drifted(first, digest("ceil"))
    bound = digest("floor", 'reg("r", random.random)')
    assert len(bound.unseen) == 1 and "REG" in bound.unseen[0], bound.unseen


def test_a_class_type_makes_is_not_said_to_be_edited(project: Project) -> None:
    """Red team r45-4: ``Dyn = type("Dyn", (), {...})`` has no ``class`` statement, which
    read as "edited since it was imported?" with nothing edited; its statement counts."""
    helpers = "def fwd(x):\n    return x * {k}\n"
    pipe = """\
    import {helpers} as helpers

    Dyn = type("Dyn", (), {{"forward": staticmethod(helpers.fwd)}})


    def gen(out_path):
        return Dyn().forward(2)
    """

    def digest(k: int) -> Any:
        return code_digest(project.load(helpers=helpers.format(k=k), pipe=pipe)["pipe"].gen)

    first = digest(2)
    assert len(first.unseen) == 1 and "not by a class statement" in first.unseen[0], first.unseen
    assert "edited" not in first.unseen[0]
    assert code_drifted(first, digest(3))


@pytest.mark.parametrize(
    ("state", "read"),
    [
        ("BUF = bytearray(3)\n\n\ndef _fill():\n    BUF[0] = {v}\n", "bytes(BUF)"),
        ("A = array.array('i', [0])\n\n\ndef _fill():\n    A[0] = {v}\n", "A[0]"),
        ("CM = collections.ChainMap({{}}, {{'k': 0}})\n\n\ndef _fill():\n    CM['k'] = {v}\n",
         "CM['k']"),
        ("U = collections.UserList()\n\n\ndef _fill():\n    U.append({v})\n", "U[0]"),
    ],
)  # fmt: skip
def test_a_container_a_function_fills_at_import_is_read_by_value(
    project: Project, state: str, read: str
) -> None:
    """Red team r49-2: a ``bytearray``, ``array.array``, ``ChainMap`` or ``UserList`` a function
    fills at import was neither compared nor unseen (a ``list`` filled so is read by value)."""
    head = "import array\nimport collections\n\n"
    step = f"\n\n_fill()\n\n\ndef gen(out_path):\n    return {read}\n"

    def digest(v: int) -> Any:
        source = head + state.format(v=v) + step
        return code_digest(project.load(hp=source.replace("{", "{{").replace("}", "}}"))["hp"].gen)

    first = digest(202)
    assert first.unseen == [], first.unseen
    assert not code_drifted(first, digest(202))
    assert code_drifted(first, digest(203))


def test_a_module_made_at_run_time_is_unseen(project: Project) -> None:
    """Red team r49-1: ``sys.modules["m"] = types.ModuleType("m")`` and ``m.K = 2`` in a
    project module: a module with no file read as a library's, so ``K`` was compared nowhere."""
    name = f"made_{uuid.uuid4().hex[:8]}"
    maker = f"import sys, types\n\n_m = types.ModuleType({name!r})\n_m.K = 202\nsys.modules[{name!r}] = _m\n"
    pipe = f"import {{maker}}\n\n\ndef gen(out_path):\n    import {name}\n\n    return {name}.K\n"
    try:
        modules = project.load(maker=maker.replace("{", "{{").replace("}", "}}"), pipe=pipe)
        digest = code_digest(modules["pipe"].gen)
    finally:
        sys.modules.pop(name, None)
    assert len(digest.unseen) == 1 and "made at run time" in digest.unseen[0], digest.unseen


def test_what_a_module_puts_into_builtins_is_followed_or_compared(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r50-1, r51-2: ``builtins.K = 202``, ``builtins.abs = _abs`` and ``builtins.print
    = partial(print, flush=True)`` in a project module, read as bare names by a step: a function
    is followed, plain data compared by value (they were neither), an object unseen."""
    import builtins

    patch = (
        "import builtins, functools, threading\n\nbuiltins.R50_K = {k}\n"
        "builtins.print = functools.partial(print, flush=True)\n"
        "builtins.R50_LOCK = threading.Lock()\n\n\n"
        "def _abs(x):\n    return x + {k}\n\n\nbuiltins.abs = _abs\n"
    )
    pipe = "import {patch}\n\n\ndef gen(out_path):\n    print(R50_LOCK)\n    return R50_K, abs(1)\n"
    for name in ("abs", "print"):
        monkeypatch.setattr(builtins, name, getattr(builtins, name))  # restored after the test
    for name in ("R50_K", "R50_LOCK"):
        monkeypatch.setattr(builtins, name, None, raising=False)

    def digest(k: int) -> Any:
        text = patch.replace("{k}", str(k))
        return code_digest(project.load(patch=text, pipe=pipe)["pipe"].gen)

    first = digest(1)
    assert len(first.unseen) == 1 and "builtins.R50_LOCK" in first.unseen[0], first.unseen
    assert not code_drifted(first, digest(1))
    assert code_drifted(first, digest(2))


def test_a_project_module_imported_from_a_zip_is_unseen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r50-2: a project module imported from a zip archive: its functions were unseen,
    but a value read from it was compared nowhere (taken for a library's)."""
    import zipfile

    name = f"zipped_{uuid.uuid4().hex[:8]}"
    with zipfile.ZipFile(tmp_path / "lib.zip", "w") as archive:
        archive.writestr(f"{name}.py", "K = 202\n")
    (tmp_path / "pipe_zip.py").write_text(
        f"import {name}\n\n\ndef gen(out_path):\n    return {name}.K\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "lib.zip"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        digest = code_digest(importlib.import_module("pipe_zip").gen)
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop("pipe_zip", None)
    assert len(digest.unseen) == 1 and "cannot be read" in digest.unseen[0], digest.unseen


def test_a_submodule_a_step_imports_from_a_loaded_package_is_unseen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r51-1: ``from pkg import sub`` inside a step, with ``pkg`` loaded and ``sub``
    not: nothing was said, so an edit of ``sub`` was served (``import sub`` was unseen)."""
    package = f"subpkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "sub.py").write_text("K = 202\n")
    (tmp_path / package / "pipe.py").write_text(
        "def gen(out_path):\n    from . import sub\n\n    return sub.K\n\n\n"
        f"def gen2(out_path):\n    from {package} import sub as s\n\n    return s.K\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    pipe = importlib.import_module(f"{package}.pipe")
    for gen in (pipe.gen, pipe.gen2):
        digest = code_digest(gen)
        assert len(digest.unseen) == 1 and f"{package}.sub" in digest.unseen[0], digest.unseen


def test_a_second_lowering_in_one_process_digests_reloaded_code_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r52-1: the digest was cached per function object for the whole process, so a
    second run in one interpreter (a notebook) served a step after ``importlib.reload`` of its
    helper, or after its code was swapped in place (``%autoreload``), as unchanged."""
    import os
    import time

    from marin.execution.lazy import OUT, apply, lower

    name = f"reloaded_{uuid.uuid4().hex[:8]}"
    helper = tmp_path / f"{name}.py"
    helper.write_text("K = 202\n\n\ndef f():\n    return K\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)

    def step(out: str) -> int:
        return module.f()

    def other(out: str) -> int:
        return 1

    handle = apply("rt/reloaded", step, version="v1", out=OUT)
    swapped = apply("rt/swapped", other, version="v1", out=OUT)
    first, first_swapped = lower([handle, swapped])
    helper.write_text("K = 303\n\n\ndef f():\n    return K\n")
    os.utime(helper, ns=(time.time_ns() + 10**9,) * 2)  # (a new version, even within a tick)
    importlib.reload(module)
    other.__code__ = (lambda out: 2).__code__
    try:
        again, again_swapped = lower([handle, swapped])
    finally:
        sys.modules.pop(name, None)
    assert first.code is not None and again.code is not None
    assert code_drifted(first.code, again.code), (first.code, again.code)
    assert first_swapped.code is not None and again_swapped.code is not None
    assert code_drifted(first_swapped.code, again_swapped.code)


@pytest.mark.parametrize(
    ("before", "after", "read"),
    [
        ("def f():\n    return 202\n", "def f():\n    return 303\n", "f()"),
        ("if True:\n    def f():\n        return 202\nelse:\n    def f():\n        return 303\n",
         "if True:\n    def f():\n        return 303\nelse:\n    def f():\n        return 202\n",
         "f()"),
        ("K = int('202')\n", "K = int('303')\n", "K"),
    ],
)  # fmt: skip
def test_what_a_module_holds_from_before_a_reload_is_unseen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str, after: str, read: str
) -> None:
    """Red team r53-1, r54: ``from helper import f`` (or ``K``), then ``helper.py`` edited and
    reloaded: the old ``f`` the step still runs was digested by the new source (r53-1), or
    matched the file's other ``def f`` (bodies of an ``if`` swapped: r54-1), and a computed
    ``K`` was compared by the new source (r54-2); each is unseen."""
    import os
    import time

    name = f"held_{uuid.uuid4().hex[:8]}"
    helper = tmp_path / f"{name}.py"
    helper.write_text(before)
    (tmp_path / f"{name}_pipe.py").write_text(
        f"from {name} import {read.rstrip('()')}\n\n\ndef gen(out_path):\n    return {read}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    pipe = importlib.import_module(f"{name}_pipe")
    try:
        assert code_digest(pipe.gen).unseen == []
        helper.write_text(after)
        os.utime(helper, ns=(time.time_ns() + 10**9,) * 2)
        importlib.reload(sys.modules[name])
        new_lowering()
        digest = code_digest(pipe.gen)
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop(f"{name}_pipe", None)
    reason = "does not match the running code" if read == "f()" else "before it was reloaded"
    assert any(reason in unseen for unseen in digest.unseen), digest.unseen


def test_a_project_module_imported_between_two_lowerings_starts_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r53-2: a notebook cell's ``import patches`` rebinds what another module holds
    (``helper.f = g``) with no file edited and no code swapped: the next lowering digests anew."""
    name = f"patched_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("def f():\n    return 202\n")
    (tmp_path / f"{name}_patch.py").write_text(
        f"import {name}\n\n\ndef g():\n    return 303\n\n\n{name}.f = g\n"
    )
    (tmp_path / f"{name}_pipe.py").write_text(
        f"import {name}\n\n\ndef gen(out_path):\n    return {name}.f()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    pipe = importlib.import_module(f"{name}_pipe")
    try:
        new_lowering()
        first = code_digest(pipe.gen)
        importlib.import_module(f"{name}_patch")
        new_lowering()
        again = code_digest(pipe.gen)
    finally:
        for module in (name, f"{name}_patch", f"{name}_pipe"):
            sys.modules.pop(module, None)
    assert code_drifted(first, again), (first, again)


def test_a_part_not_compared_when_built_is_named_as_such_once_it_is() -> None:
    """Red team r55-1: a record built while a name was held from before a reload (a part not
    compared) read, once that name was compared again, as ``code: gen no longer calls SEED``;
    the drift names what happened."""
    from marin.execution.digest.code import CodeDigest, CodePart
    from marin.execution.digest.code_drift import explain_code_drift

    root = CodePart("gen", "pipe.py", 4, "d1")
    held = CodePart("SEED", "?", 0, None, unknown="it holds what its module held before")
    stored = CodeDigest("a" * 64, (root, held))
    current = CodeDigest("b" * 64, (root,))
    assert explain_code_drift(stored, current) == [
        "code: SEED was not compared when it was built (it holds what its module held before)"
    ]
