"""The code digest (issue 25): normalised syntax, same-project callees, unknown said, what changed.

Each version of a little project is written to its own folder and imported under fresh module
names, so two versions live side by side in one process, as a stored record and the code of
today do.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import linecache
import os
import subprocess
import sys
import textwrap
import threading
import types
import uuid
import zipfile
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from marin.execution.digest import code as cd
from marin.execution.digest.code import CodeDigest, code_digest
from marin.execution.digest.code_drift import code_drifted, explain_code_drift
from marin.execution.digest.source import is_project_module
from marin.execution.lazy import OUT, apply, lower


class Project:
    """Writes versions of a small project under ``tmp_path`` and imports each one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = 0

    def load(self, **sources: str) -> dict[str, types.ModuleType]:
        """Write ``name.py`` for each source (in order) into a new folder and import them.

        A source may import an earlier one as ``{name}``; it is imported under a fresh module
        name, so versions never share a module.
        """
        self.count += 1
        folder = self.root / f"v{self.count}"
        folder.mkdir(parents=True)
        names = {name: f"{name}_{uuid.uuid4().hex[:8]}" for name in sources}
        modules = {}
        for name, source in sources.items():
            path = folder / f"{name}.py"
            path.write_text(textwrap.dedent(source).format(**names))
            modules[name] = import_file(names[name], path)
        return modules


def import_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


HELPERS = """\
SCALE = 3


def tokenize(text):
    words = text.split()
    return [w.lower() for w in words]


def weight(x):
    return x * SCALE
"""

PIPE = """\
import json
from {helpers} import tokenize, weight


def train_model(text, out_path):
    tokens = tokenize(text)
    return json.dumps([weight(len(tokens))])
"""


def test_comments_and_formatting_do_not_count(project: Project) -> None:
    before = project.load(helpers=HELPERS, pipe=PIPE)
    after = project.load(
        helpers='''\
        """A module docstring, new."""
        SCALE = 3  # a comment


        def tokenize(text):
            # a comment line
            words = text.split(   )
            return [w.lower()
                    for w in words]


        def weight(x):
            return (x * SCALE)
        ''',
        pipe="""\
        import json
        from {helpers} import tokenize, weight


        def train_model(text, out_path):  # trailing comment
            tokens = tokenize(text)

            return json.dumps(
                [weight(len(tokens))],
            )
        """,
    )
    old = code_digest(before["pipe"].train_model)
    new = code_digest(after["pipe"].train_model)
    assert old.digest is not None
    assert [p.name for p in new.parts] == ["train_model", "tokenize", "weight"]
    assert new.digest == old.digest
    assert not code_drifted(old, new)
    assert explain_code_drift(old, new) == []


def test_a_docstring_is_code(project: Project) -> None:
    """Red team r24-2: docstrings did not count, but code reads them (a DSPy signature's
    docstring is the instruction sent to the model, ``inspect.getdoc``, a tool's description):
    an edited prompt in one was served under ``--on-code-drift error``. Added, edited or
    removed, a function's or a class's docstring is drift naming it."""
    pipe = '''\
        import inspect


        class Signature:
            """Answer the question in one word."""


        def evaluate(question, out_path):
            """Ask the model."""
            return inspect.getdoc(Signature) + question
        '''
    before = code_digest(project.load(pipe=pipe)["pipe"].evaluate)
    edits = {
        "class": pipe.replace("in one word.", "in French, in one full sentence."),
        "function": pipe.replace("Ask the model.", "Ask the model twice."),
        "removed": pipe.replace('"""Ask the model."""', "pass"),
    }
    for what, edited in edits.items():
        after = code_digest(project.load(pipe=edited)["pipe"].evaluate)
        assert code_drifted(before, after), what
        named = "Signature" if what == "class" else "evaluate"
        assert any(named in line for line in explain_code_drift(before, after)), what
    # The docstring's own line is named, not line 0.
    after = code_digest(project.load(pipe=edits["function"])["pipe"].evaluate)
    assert [line for line in explain_code_drift(before, after) if "line 9)" in line], (
        explain_code_drift(before, after)
    )


def test_a_docstrings_layout_is_not_code(project: Project) -> None:
    """Red team r25-7: re-indenting a docstring's lines or stripping their trailing spaces
    (what formatters do) was drift; its text, cleaned as ``inspect.cleandoc`` does, counts."""
    pipe = '''\
        def evaluate(question):
            """Answer in one word.
                Be brief.
            """
            return question
        '''.replace("Be brief.", "Be brief." + " " * 3)
    before = code_digest(project.load(pipe=pipe)["pipe"].evaluate)
    reflowed = pipe.replace("    Be brief.   ", "Be brief.")
    assert not code_drifted(before, code_digest(project.load(pipe=reflowed)["pipe"].evaluate))
    reworded = pipe.replace("Be brief.", "Be long.")
    assert code_drifted(before, code_digest(project.load(pipe=reworded)["pipe"].evaluate))


def test_what_a_computed_module_name_reads_is_code(project: Project) -> None:
    """Red team r26-1: a module-level name set by an expression counted by its own line only:
    ``K = cfg.BASE`` missed an edit of ``BASE``, ``PROMPT = __doc__`` one of the docstring,
    ``CARD = helpers.card()`` one of ``card``. What the expression reads counts as the step's
    own reads (by value, or as code)."""
    cfg = "BASE = 3\n\n\ndef card():\n    return 'one'\n"
    pipe = '''\
        """Answer in one word."""
        import {cfg} as cfg

        K = cfg.BASE * 2
        PROMPT = __doc__.strip()
        CARD = cfg.card()


        def step(out_path):
            return K, PROMPT, CARD
        '''
    before = code_digest(project.load(cfg=cfg, pipe=pipe)["pipe"].step)
    assert not code_drifted(before, code_digest(project.load(cfg=cfg, pipe=pipe)["pipe"].step))
    for edited in (
        {"cfg": cfg.replace("BASE = 3", "BASE = 5"), "pipe": pipe},
        {"cfg": cfg, "pipe": pipe.replace("one word", "French")},
        {"cfg": cfg.replace("'one'", "'two'"), "pipe": pipe},
    ):
        after = code_digest(project.load(**edited)["pipe"].step)
        assert code_drifted(before, after), edited


def test_the_class_of_an_object_a_partial_binds_is_code(project: Project) -> None:
    """Red team r33-3: ``partial(gen, cfg=Cfg(1))`` (also positional, also nested): an edit of
    ``Cfg.tag`` was neither drift nor "code not compared", though ``apply(..., cfg=Cfg(1))``
    counted it."""
    cfg = "class Cfg:\n    def __init__(self, n):\n        self.n = n\n\n    def tag(self):\n        return 'old'\n"
    pipe = """\
        import functools
        from {cfg} import Cfg


        def gen(out_path, cfg, extra=None):
            return cfg.tag()


        keyword = functools.partial(gen, cfg=Cfg(1))
        nested = functools.partial(functools.partial(gen, None, Cfg(1)))
        """
    before = project.load(cfg=cfg, pipe=pipe)["pipe"]
    after = project.load(cfg=cfg.replace("'old'", "'new'"), pipe=pipe)["pipe"]
    for name in ("keyword", "nested"):
        old, new = code_digest(getattr(before, name)), code_digest(getattr(after, name))
        assert [p.name for p in old.parts] == ["gen", "Cfg"], name
        assert code_drifted(old, new), name


def test_the_class_of_an_object_a_partial_build_config_binds_is_code(project: Project) -> None:
    """Red team r34-1: a hand-made step's ``build_config=partial(bc, cfg=Cfg(1))``: an edit of
    ``Cfg.tag``, which ``bc`` calls, was not drift (``run=`` partials were, round 33)."""
    cfg = "class Cfg:\n    def tag(self):\n        return 'old'\n"
    pipe = """\
        import functools
        from {cfg} import Cfg


        def run(config):
            return config


        def bc(ctx, cfg):
            return {{"tag": cfg.tag()}}


        build = functools.partial(bc, cfg=Cfg())
        """
    before = project.load(cfg=cfg, pipe=pipe)["pipe"]
    after = project.load(cfg=cfg.replace("'old'", "'new'"), pipe=pipe)["pipe"]
    old = code_digest(before.run, (), (before.build,))
    new = code_digest(after.run, (), (after.build,))
    assert "Cfg" in [p.name for p in old.parts]
    assert code_drifted(old, new)


_READS_CARD = {
    "attribute": """\
        import {cfg} as cfg


        def step(out_path, CARD=None, BASE=None):
            return cfg.CARD
        """,
    "imported": """\
        from {cfg} import CARD


        def step(out_path):
            return CARD
        """,
}


@pytest.mark.parametrize("spelling", sorted(_READS_CARD))
def test_what_another_modules_computed_name_reads_is_code(project: Project, spelling: str) -> None:
    """Red team round 28: ``cfg.CARD`` read by the step, or ``from cfg import CARD``, with
    ``CARD`` computed in cfg from ``helpers.card()``, missed an edit of ``card`` (only the step's
    own module's computed names were followed); the step's own parameter of that name shadows
    nothing in cfg."""
    helpers = "def card():\n    return 'one'\n"
    cfg = "import {helpers} as helpers\n\nBASE = helpers.card()\nCARD = BASE.upper()\n"
    pipe = _READS_CARD[spelling]
    before = code_digest(project.load(helpers=helpers, cfg=cfg, pipe=pipe)["pipe"].step)
    same = project.load(helpers=helpers, cfg=cfg, pipe=pipe)["pipe"].step
    assert not code_drifted(before, code_digest(same))
    edited = helpers.replace("'one'", "'two'")
    after = project.load(helpers=edited, cfg=cfg, pipe=pipe)["pipe"].step
    assert code_drifted(before, code_digest(after))


def test_computed_names_reading_each_other_across_modules_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two modules importing each other, each computing a name from the other's: following
    what they read ends, and an edit of either is seen."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def load(seed: int) -> CodeDigest:
        a, b = f"cyc_a_{uuid.uuid4().hex[:8]}", f"cyc_b_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{a}.py").write_text(
            f"import {b} as b\n\nX = b.Y if hasattr(b, 'Y') else 1\n\n\n"
            "def step(out_path):\n    return X\n"
        )
        (tmp_path / f"{b}.py").write_text(
            f"import {a} as a\n\nY = a.X if hasattr(a, 'X') else {seed}\n"
        )
        return code_digest(importlib.import_module(a).step)

    before = load(2)
    assert not code_drifted(before, load(2))
    assert code_drifted(before, load(3))


def test_a_parameter_named_like_a_computed_global_does_not_read_its_value(
    project: Project,
) -> None:
    """A step function's parameter that shadows a module-level handle (``def read(src)``
    beside ``src = apply("src", make, ...)``): following what that global's value reads put
    the other step's ``make`` in this step's digest, so editing ``make`` was code drift of the
    reader too (the full suite's registered-reader test caught it)."""
    cfg = "def make():\n    return 'one'\n"
    pipe = """\
        import {cfg} as cfg

        src = cfg.make()


        def read(src):
            return src + "!"
        """
    before = code_digest(project.load(cfg=cfg, pipe=pipe)["pipe"].read)
    edited = project.load(cfg=cfg.replace("'one'", "'two'"), pipe=pipe)["pipe"].read
    assert not code_drifted(before, code_digest(edited))


def test_a_name_bound_in_a_nested_scope_shadows_nothing_in_the_step(project: Project) -> None:
    """Red team r27-1: a nested function's parameter, a lambda's or a comprehension's variable
    named like a computed global turned off following that global's reads, though the step's
    own body reads the global."""
    cfg = "def card():\n    return 'one'\n"
    pipe = """\
        import {cfg} as cfg

        prompt = cfg.card()


        def step(out_path):
            def render(prompt):
                return "[" + prompt + "]"

            upper = [prompt.upper() for prompt in ("a",)]
            return render(prompt), upper, (lambda prompt: prompt)(1)
        """
    before = code_digest(project.load(cfg=cfg, pipe=pipe)["pipe"].step)
    edited = project.load(cfg=cfg.replace("'one'", "'two'"), pipe=pipe)["pipe"].step
    assert code_drifted(before, code_digest(edited))


def test_a_global_read_by_name_through_globals_is_never_shadowed(project: Project) -> None:
    """Red team r27-1's variant: a step with a parameter ``prompt`` whose nested function reads
    ``globals()["prompt"]`` reads the module's computed ``prompt``: its reads are followed."""
    cfg = "def card():\n    return 'one'\n"
    pipe = """\
        import {cfg} as cfg

        prompt = cfg.card()


        def step(out_path, prompt=None):
            def render():
                return "[" + globals()["prompt"] + globals().get("prompt", "") + "]"

            return render()
        """
    before = code_digest(project.load(cfg=cfg, pipe=pipe)["pipe"].step)
    assert before.unseen == [], before.unseen  # ``globals().get("prompt")``: a constant name
    edited = project.load(cfg=cfg.replace("'one'", "'two'"), pipe=pipe)["pipe"].step
    assert code_drifted(before, code_digest(edited))


def test_a_relative_import_inside_a_step_is_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r28-3: ``from .cfg import BASE`` (and ``from . import cfg``) inside a step of a
    package was always unseen, "not in this process", though the process had ``pk.cfg``."""
    monkeypatch.syspath_prepend(str(tmp_path))
    steps = """\
def gen(out_path):
    from .cfg import BASE
    from . import cfg

    return BASE, cfg.SCALE
"""

    def load(base: int, scale: int) -> CodeDigest:
        package = f"relpk_{uuid.uuid4().hex[:8]}"
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "cfg.py").write_text(f"BASE = {base}\nSCALE = {scale}\n")
        (tmp_path / package / "steps.py").write_text(steps)
        importlib.import_module(f"{package}.cfg")
        return code_digest(importlib.import_module(f"{package}.steps").gen)

    before = load(3, 1)
    assert before.unseen == [] and before.unknown is None, before
    assert not code_drifted(before, load(3, 1))
    assert code_drifted(before, load(5, 1))
    assert code_drifted(before, load(3, 2))


def test_a_relative_import_module_with_its_package_is_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r33-4: ``importlib.import_module("..cfg", __package__)`` inside a step was
    unseen, "not in this process", though ``pk.cfg`` was imported; a relative name against
    any other package is unseen as a computed name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    steps = """\
import importlib


def gen(out_path):
    return importlib.import_module("..cfg", __package__).BASE


def other(out_path, package):
    return importlib.import_module("..cfg", package).BASE
"""

    def load(base: int) -> tuple[CodeDigest, CodeDigest]:
        package = f"relim_{uuid.uuid4().hex[:8]}"
        (tmp_path / package / "sub").mkdir(parents=True)
        for init in (
            tmp_path / package / "__init__.py",
            tmp_path / package / "sub" / "__init__.py",
        ):
            init.write_text("")
        (tmp_path / package / "cfg.py").write_text(f"BASE = {base}\n")
        (tmp_path / package / "sub" / "steps.py").write_text(steps)
        importlib.import_module(f"{package}.cfg")
        module = importlib.import_module(f"{package}.sub.steps")
        return code_digest(module.gen), code_digest(module.other)

    before, other = load(3)
    assert before.unseen == [] and before.unknown is None, before
    assert not code_drifted(before, load(3)[0])
    assert code_drifted(before, load(5)[0])
    assert [u.split(" ", 1)[1] for u in other.unseen] == [
        "(it imports a module of the project by a computed name)"
    ], other.unseen


def test_a_module_docstring_read_as_data_is_code(project: Project) -> None:
    """Red team r25-3: a module docstring read as ``__doc__`` (a model card, a prompt), its
    own module's or a project module's, was not in the digest."""
    helpers = '''\
        """Answer in one word."""
        '''
    pipe = '''\
        """Model card: English only."""
        import {helpers} as helpers


        def card(out_path):
            return __doc__ + helpers.__doc__
        '''
    before = code_digest(project.load(helpers=helpers, pipe=pipe)["pipe"].card)
    again = code_digest(project.load(helpers=helpers, pipe=pipe)["pipe"].card)
    assert not code_drifted(before, again)
    for edited in (
        {"helpers": helpers, "pipe": pipe.replace("English", "French")},
        {"helpers": helpers.replace("one word", "French"), "pipe": pipe},
    ):
        after = code_digest(project.load(**edited)["pipe"].card)
        assert code_drifted(before, after), edited


def test_a_changed_constant_in_a_same_project_helper_is_drift_naming_the_helper(
    project: Project,
) -> None:
    before = project.load(helpers=HELPERS, pipe=PIPE)
    after = project.load(
        helpers=HELPERS.replace(
            "return [w.lower() for w in words]", "return [w.lower() for w in words[:2]]"
        ),
        pipe=PIPE,
    )
    old = code_digest(before["pipe"].train_model)
    new = code_digest(after["pipe"].train_model)
    assert code_drifted(old, new)
    file = new.parts[1].file
    assert file.endswith("v2/helpers.py")
    assert explain_code_drift(old, new) == [
        f"code: tokenize changed ({file}, line 6), called by train_model"
    ]


def test_a_changed_step_function_names_its_line(project: Project) -> None:
    before = project.load(helpers=HELPERS, pipe=PIPE)
    after = project.load(helpers=HELPERS, pipe=PIPE.replace("len(tokens)", "len(tokens) + 1"))
    old = code_digest(before["pipe"].train_model)
    new = code_digest(after["pipe"].train_model)
    assert explain_code_drift(old, new) == [
        f"code: train_model changed ({new.parts[0].file}, line 7)"
    ]


def test_a_module_constant_a_helper_reads_is_code(project: Project) -> None:
    before = project.load(helpers=HELPERS, pipe=PIPE)
    after = project.load(helpers=HELPERS.replace("SCALE = 3", "SCALE = 4"), pipe=PIPE)
    old = code_digest(before["pipe"].train_model)
    new = code_digest(after["pipe"].train_model)
    file = new.parts[2].file
    assert explain_code_drift(old, new) == [
        f"code: weight changed ({file}, line 9: a module- or class-level value it reads), "
        "called by train_model"
    ]


def test_a_constant_imported_by_name_from_a_project_module_is_code(project: Project) -> None:
    config = "SCALE = 3\n"
    pipe = """\
    from {config} import SCALE


    def step(x):
        return x * SCALE
    """
    before = project.load(config=config, pipe=pipe)
    same = project.load(config="SCALE = 3  # unchanged\n", pipe=pipe)
    after = project.load(config="SCALE = 4\n", pipe=pipe)
    old = code_digest(before["pipe"].step)
    assert code_digest(same["pipe"].step).digest == old.digest
    new = code_digest(after["pipe"].step)
    assert explain_code_drift(old, new) == [
        f"code: step changed ({new.parts[0].file}, line 4: a module- or class-level value it reads)"
    ]


def test_a_value_computed_at_import_is_data_not_code(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = HELPERS.replace("SCALE = 3", "import os\nSCALE = int(os.environ['CD_SCALE'])")
    monkeypatch.setenv("CD_SCALE", "3")
    before = project.load(helpers=source, pipe=PIPE)
    monkeypatch.setenv("CD_SCALE", "4")
    after = project.load(helpers=source, pipe=PIPE)
    assert after["helpers"].SCALE == 4
    old = code_digest(before["pipe"].train_model)
    assert code_digest(after["pipe"].train_model).digest == old.digest


def test_installed_packages_and_the_standard_library_are_not_followed(project: Project) -> None:
    modules = project.load(
        pipe="""\
        import json
        import fsspec


        def write(value, out_path):
            with fsspec.open(out_path, "w") as f:
                f.write(json.dumps(value))
        """
    )
    digest = code_digest(modules["pipe"].write)
    assert [p.name for p in digest.parts] == ["write"]
    assert not is_project_module("json", json.__file__)
    assert fsspec.__file__ is not None and not is_project_module("fsspec", fsspec.__file__)
    assert not is_project_module(cd.__name__, cd.__file__)  # the engine itself
    pipe = modules["pipe"]
    assert pipe.__file__ is not None and is_project_module(pipe.__name__, pipe.__file__)
    assert not is_project_module("made", "<string>")


def test_unknown_is_said_never_guessed(project: Project) -> None:
    namespace: dict[str, Any] = {}
    exec("def made(x):\n    return x\n", namespace)
    cases = {
        len: "len is a builtin or C function: no Python source",
        namespace["made"]: "made: defined at run time (<string>)",
        json.dumps: "dumps is in an installed package or the standard library",
    }
    for fn, reason in cases.items():
        digest = code_digest(fn)
        assert digest.digest is None
        assert digest.unknown is not None and digest.unknown.startswith(reason), digest.unknown
    known = code_digest(project.load(helpers=HELPERS, pipe=PIPE)["pipe"].train_model)
    assert not code_drifted(code_digest(len), known)
    assert not code_drifted(known, code_digest(len))
    assert explain_code_drift(CodeDigest.from_record(None), known) == []


def test_a_callee_made_at_run_time_is_named_unseen(project: Project) -> None:
    modules = project.load(
        helpers='exec("def made(x):\\n    return x\\n")\n',
        pipe="""\
        from {helpers} import made


        def step(x):
            return made(x)
        """,
    )
    digest = code_digest(modules["pipe"].step)
    assert digest.digest is not None
    assert digest.unseen == ["made (defined at run time (<string>))"]


# --- red team round one, finding 7: what the digest could not see was "unchanged" -------------

_PIPELINE = Path(__file__).parent / "reliability/code_registry_pipeline.py"
"""test_resumable.py's project: ``TOKENIZERS``, filled by a decorator (braces kept from
``Project.load``'s ``str.format``), and a dispatch table beside it."""
REGISTRY = (
    _PIPELINE.read_text().replace("{", "{{").replace("}", "}}")
    + """

def up(x):
    return x.upper()


TABLE = {{"up": up, "nested": [up]}}


def step(text):
    return TOKENIZERS["words"](text), TABLE["up"](text)
"""
)


def test_functions_in_a_module_level_registry_or_dispatch_dict_are_code(project: Project) -> None:
    """Finding 7: ``TOKENIZERS[name](text)`` (filled by a decorator) and ``TABLE = {"up": fn}``
    were invisible: an edit of ``words`` or ``up`` was "unchanged"."""
    before = code_digest(project.load(pipe=REGISTRY)["pipe"].step)
    assert {p.name for p in before.parts} >= {"step", "words", "up"}
    edited = REGISTRY.replace('text.split(" ")', 'text.replace(",", " ").split(" ")')
    after = code_digest(project.load(pipe=edited)["pipe"].step)
    assert [line.split(" (")[0] for line in explain_code_drift(before, after)] == [
        "code: words changed"
    ]
    table = code_digest(project.load(pipe=REGISTRY.replace("x.upper()", "x.lower()"))["pipe"].step)
    assert code_drifted(before, table)


def test_a_module_imported_inside_the_step_function_is_followed_or_unseen(
    project: Project,
) -> None:
    """Finding 7: ``import helpers2`` inside the function (heavy imports kept off the driver)
    was invisible. Imported in this process: followed. Not imported: unseen, so the digest
    compares as unknown, never "unchanged"."""
    pipe = """\
    def step(x):
        import {helpers}
        from {helpers} import h as other

        return {helpers}.h(x) + other(x)
    """
    before = code_digest(
        project.load(helpers="def h(x):\n    return x + 1\n", pipe=pipe)["pipe"].step
    )
    after = code_digest(
        project.load(helpers="def h(x):\n    return x + 2\n", pipe=pipe)["pipe"].step
    )
    assert [p.name for p in before.parts] == ["step", "h"] and code_drifted(before, after)
    lazy = project.load(
        pipe="""\
        def step(x):
            import never_imported_helpers_7f3a

            return never_imported_helpers_7f3a.h(x)
        """
    )
    digest = code_digest(lazy["pipe"].step)
    assert digest.unseen == [
        "never_imported_helpers_7f3a (imported inside the function, not in this process: "
        "never_imported_helpers_7f3a is not seen)"
    ]
    from marin.execution.store.identity import _code_unknown

    assert _code_unknown(digest, digest).startswith("unseen: never_imported_helpers_7f3a")


def test_star_imported_constants_and_non_literal_module_values_are_code(project: Project) -> None:
    """Finding 7: a constant taken with ``from config import *``, ``P = partial(h, 2)`` and
    ``PROD = 2 * 3`` were "unchanged" after an edit. Their source counts (their value may
    still be run-time data: ``int(os.environ[...])`` stays a blind spot)."""
    pipe = """\
    import functools
    from {config} import *


    def h(a, b):
        return a * b


    P = functools.partial(h, 2)
    PROD = 2 * 3


    def step(x):
        return SC + P(x) + PROD
    """
    base = code_digest(project.load(config="SC = 3\n", pipe=pipe)["pipe"].step)
    assert (
        code_digest(project.load(config="SC = 3\n", pipe=pipe)["pipe"].step).digest == base.digest
    )
    for config, edited in [
        ("SC = 4\n", pipe),
        ("SC = 3\n", pipe.replace("partial(h, 2)", "partial(h, 5)")),
        ("SC = 3\n", pipe.replace("2 * 3", "2 * 4")),
    ]:
        after = code_digest(project.load(config=config, pipe=edited)["pipe"].step)
        assert code_drifted(base, after), (config, edited)


def test_callees_are_followed_transitively_and_named_with_their_caller(project: Project) -> None:
    inner = "def normalise(w):\n    return w.strip()\n"
    middle = """\
    from {inner} import normalise


    def tokenize(text):
        return [normalise(w) for w in text.split()]
    """
    pipe = """\
    from {middle} import tokenize


    def train_model(text):
        return tokenize(text)
    """
    before = project.load(inner=inner, middle=middle, pipe=pipe)
    after = project.load(inner=inner.replace("w.strip()", "w.strip('.')"), middle=middle, pipe=pipe)
    old = code_digest(before["pipe"].train_model)
    new = code_digest(after["pipe"].train_model)
    assert [(p.name, p.via) for p in new.parts] == [
        ("train_model", None),
        ("tokenize", "train_model"),
        ("normalise", "tokenize"),
    ]
    assert explain_code_drift(old, new) == [
        f"code: normalise changed ({new.parts[2].file}, line 2), called by tokenize"
    ]


def test_added_and_removed_callees(project: Project) -> None:
    helpers = "def a(x):\n    return x\n\n\ndef b(x):\n    return -x\n"
    before = project.load(
        helpers=helpers, pipe="from {helpers} import a, b\n\ndef f(x):\n    return a(x)\n"
    )
    after = project.load(
        helpers=helpers, pipe="from {helpers} import a, b\n\ndef f(x):\n    return b(x)\n"
    )
    old = code_digest(before["pipe"].f)
    new = code_digest(after["pipe"].f)
    lines = explain_code_drift(old, new)
    assert lines == [
        f"code: f changed ({new.parts[0].file}, line 4)",
        f"code: f now calls b ({new.parts[1].file}, line 5)",
        "code: f no longer calls a",
    ]


def test_a_changed_method_names_the_class_and_the_method(project: Project) -> None:
    helpers = """\
    class Tokenizer:
        lower = True

        def split(self, text):
            return text.split()
    """
    pipe = """\
    from {helpers} import Tokenizer


    def step(text):
        return Tokenizer().split(text)
    """
    before = project.load(helpers=helpers, pipe=pipe)
    after = project.load(helpers=helpers.replace("text.split()", "text.split(',')"), pipe=pipe)
    old = code_digest(before["pipe"].step)
    new = code_digest(after["pipe"].step)
    assert explain_code_drift(old, new) == [
        f"code: Tokenizer changed ({new.parts[1].file}, line 4), called by step"
    ]


def test_decorators_are_followed_and_the_step_function_is_the_root(project: Project) -> None:
    helpers = """\
    import functools


    def logged(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs)
        return wrapper
    """
    pipe = """\
    from {helpers} import logged


    @logged
    def train_model(x):
        return x + 1
    """
    before = project.load(helpers=helpers, pipe=pipe)
    after = project.load(
        helpers=helpers.replace("return fn(*args, **kwargs)", "return fn(*args, **kwargs) or 0"),
        pipe=pipe,
    )
    old = code_digest(before["pipe"].train_model)
    new = code_digest(after["pipe"].train_model)
    assert new.name == "train_model"
    assert [p.name for p in new.parts] == ["train_model", "logged.<locals>.wrapper", "logged"]
    assert explain_code_drift(old, new) == [  # the wrapper is code of its own (round 3)
        f"code: logged.<locals>.wrapper changed ({new.parts[1].file}, line 7), "
        "called by train_model",
        f"code: logged changed ({new.parts[1].file}, line 6), called by train_model",
    ]


def test_two_lambdas_on_one_line_are_told_apart(project: Project) -> None:
    modules = project.load(pipe="STEPS = (lambda a: a + 1, lambda b: b + 2)\n")
    first, second = modules["pipe"].STEPS
    one, two = code_digest(first), code_digest(second)
    assert one.digest is not None and two.digest is not None
    assert one.digest != two.digest


def test_the_step_function_behind_apply_partial_and_methods(project: Project) -> None:
    modules = project.load(
        pipe="""\
        class Trainer:
            def __call__(self, x):
                return x

            def fit(self, x):
                return x * 2


        def train(x, out_path):
            return x
        """
    )
    pipe = modules["pipe"]
    digest = code_digest(pipe.train)
    handle = apply("train", pipe.train, version="v1", x=1, out_path=OUT)
    assert code_digest(handle.run) is digest
    assert code_digest(functools.partial(pipe.train, 1)) is digest
    bound = code_digest(pipe.Trainer().fit)  # with its object's fields and class (round 3)
    assert bound.parts[0] == code_digest(pipe.Trainer.fit).parts[0]
    assert [p.name for p in bound.parts] == ["Trainer.fit", "Trainer.<self>", "Trainer"]
    assert code_digest(pipe.Trainer()).name == "Trainer"


def test_computed_once_per_function_object_and_again_after_an_edit(project: Project) -> None:
    modules = project.load(pipe="def step(x):\n    return x\n")
    path = Path(modules["pipe"].__file__ or "")
    first = code_digest(modules["pipe"].step)
    assert code_digest(modules["pipe"].step) is first  # cached by the object
    path.write_text("def step(x):\n    return x + 1\n")
    os.utime(path, ns=(0, 0))  # a modification time the first version surely did not have
    assert code_digest(modules["pipe"].step) is first  # this object still runs the old code
    edited = import_file(f"pipe_{uuid.uuid4().hex[:8]}", path)
    again = code_digest(edited.step)
    assert again.digest is not None and again.digest != first.digest


def test_closures_of_one_factory_share_their_syntax_not_their_callees(project: Project) -> None:
    """The syntax of a factory's closures is hashed once (one code object); what each one's
    names refer to is still its own, so a closure over another helper digests otherwise."""
    modules = project.load(
        helpers=HELPERS,
        pipe="""\
        from {helpers} import tokenize, weight


        def make(helper):
            def step(x, out_path):
                return helper(x)
            return step


        BY_TOKENIZE, BY_WEIGHT, AGAIN = make(tokenize), make(weight), make(tokenize)
        """,
    )
    pipe = modules["pipe"]
    by_tokenize, by_weight = code_digest(pipe.BY_TOKENIZE), code_digest(pipe.BY_WEIGHT)
    assert [p.name for p in by_tokenize.parts] == ["make.<locals>.step", "tokenize"]
    assert [p.name for p in by_weight.parts] == ["make.<locals>.step", "weight"]
    one, other = by_tokenize.parts[0], by_weight.parts[0]
    assert (one.header, one.statements) == (other.header, other.statements)
    assert one.constants != other.constants  # the cell names its own helper
    assert by_tokenize.digest is not None and by_tokenize.digest != by_weight.digest
    assert code_digest(pipe.AGAIN).digest == by_tokenize.digest


def test_the_providers_of_a_module_are_what_packages_distributions_says() -> None:
    """Asked one module at a time, the installed distributions that provide it are exactly
    the standard library's whole map's (a sample of it, and modules nobody provides)."""
    from marin.execution.digest.source import _normalise, _providers

    everything = importlib.metadata.packages_distributions()
    tops = sorted(everything)
    sample = [*tops[:: max(1, len(tops) // 40)], "fsspec", "_pytest", "no_such_module_xyz"]
    for top in sample:
        expected = frozenset(_normalise(name) for name in everything.get(top, []))
        assert _providers(top) == expected, top


def test_a_source_edited_since_import_is_unknown(project: Project) -> None:
    modules = project.load(pipe="def step(x):\n    return x\n")
    path = Path(modules["pipe"].__file__ or "")
    path.write_text("# the function moved down\n\n\ndef step(x):\n    return x\n")
    os.utime(path, ns=(0, 0))
    cd.clear_cache()
    digest = code_digest(modules["pipe"].step)
    assert digest.digest is None
    assert digest.unknown == (
        "step: its source does not match the running code (edited since it was imported?)"
    )


def test_another_scheme_is_not_drift(project: Project) -> None:
    digest = code_digest(project.load(pipe="def step(x):\n    return x\n")["pipe"].step)
    stored = digest.to_record()
    stored["scheme"] = "ast0"
    old = CodeDigest.from_record(stored)
    assert old.digest is None and old.unknown is not None and "another scheme" in old.unknown
    assert not code_drifted(old, digest)


# --- stored digests are untrusted data ----------------------------------------------------------


def _valid_record(project_root: Path) -> dict[str, Any]:
    project = Project(project_root)
    modules = project.load(helpers=HELPERS, pipe=PIPE)
    return code_digest(modules["pipe"].train_model).to_record()


def test_a_stored_digest_round_trips(project: Project) -> None:
    digest = code_digest(project.load(helpers=HELPERS, pipe=PIPE)["pipe"].train_model)
    stored = json.loads(json.dumps(digest.to_record(), sort_keys=True))
    loaded = CodeDigest.from_record(stored)
    assert loaded == digest
    assert loaded.parts[1].via == "train_model"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
_FIELDS = ("scheme", "digest", "unknown", "parts")
_PART_FIELDS = (
    "name",
    "file",
    "line",
    "digest",
    "header",
    "statements",
    "constants",
    "unknown",
    "via",
)


def _corrupt(record: dict[str, Any], where: str, field: str, value: Any) -> dict[str, Any]:
    record = json.loads(json.dumps(record))
    target = record if where == "top" or not record["parts"] else record["parts"][0]
    target[field] = value
    return record


def _check_corrupt(record: dict[str, Any], where: str, field: str, value: Any) -> None:
    loaded = CodeDigest.from_record(_corrupt(record, where, field, value))
    assert isinstance(loaded, CodeDigest)
    # Whatever loaded, reporting on it never raises, and a digest it keeps is a hex string.
    assert loaded.digest is None or all(c in "0123456789abcdef" for c in loaded.digest)
    explain_code_drift(loaded, CodeDigest.from_record(record))
    assert loaded.unseen is not None


@pytest.fixture(scope="module")
def valid_record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _valid_record(tmp_path_factory.mktemp("valid"))


_corruptions = given(
    where=st.sampled_from(["top", "part"]),
    field=st.sampled_from(_FIELDS + _PART_FIELDS),
    value=_JSON,
)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@_corruptions
@example(where="part", field="line", value=True)  # bool is an int in Python: not a line number
@example(where="part", field="statements", value=["zz"])
@example(where="top", field="parts", value=[None])
def test_a_corrupt_stored_digest_loads_as_unknown_or_valid(
    valid_record: dict[str, Any], where: str, field: str, value: Any
) -> None:
    _check_corrupt(valid_record, where, field, value)


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@_corruptions
def test_a_corrupt_stored_digest_random_run(
    valid_record: dict[str, Any], where: str, field: str, value: Any
) -> None:
    _check_corrupt(valid_record, where, field, value)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(_JSON)
def test_any_json_loads_without_raising(value: Any) -> None:
    assert isinstance(CodeDigest.from_record(value), CodeDigest)


# --- the property: layout never counts ----------------------------------------------------------

BODY = '''\
def step(text, n=3):
    """Docstring."""
    words = [w for w in text.split() if len(w) > n]
    total = 0
    for i, w in enumerate(words):
        if i % 2:
            total += len(w)
        else:
            total -= 1
    return {"total": total, "first": words[:1]}
'''


def _relayout(source: str, comments: list[int], blank: list[int]) -> str:
    """``source`` re-printed by ``ast.unparse`` (all its own layout), with comments and blank
    lines inserted at the given statement lines."""
    lines = ast.unparse(ast.parse(source)).splitlines()
    out = []
    for i, line in enumerate(lines):
        if i in blank:
            out.append("")
        out.append(line + ("  # note" if i in comments else ""))
    return "\n".join(out) + "\n"


_layouts = given(
    comments=st.lists(st.integers(0, 12), max_size=6),
    blank=st.lists(st.integers(1, 12), max_size=4),
)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@_layouts
def test_relayout_and_comments_never_change_the_digest(
    tmp_path: Path, comments: list[int], blank: list[int]
) -> None:
    _check_layout(tmp_path, comments, blank)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@_layouts
def test_relayout_and_comments_never_change_the_digest_random_run(
    tmp_path: Path, comments: list[int], blank: list[int]
) -> None:
    _check_layout(tmp_path, comments, blank)


def _check_layout(tmp_path: Path, comments: list[int], blank: list[int]) -> None:
    path = tmp_path / f"p_{uuid.uuid4().hex[:8]}.py"
    path.write_text(BODY)
    original = code_digest(import_file(path.stem, path).step)
    other = tmp_path / f"q_{uuid.uuid4().hex[:8]}.py"
    other.write_text(_relayout(BODY, comments, blank))
    assert code_digest(import_file(other.stem, other).step).digest == original.digest


# --- never crash, hang, recurse or run user code (issue 43) -------------------------------------


def elif_chain(branches: int) -> str:
    """A generated dispatch function: each ``elif`` nests one level deeper in the syntax tree."""
    lines = ["def dispatch(x):"]
    for i in range(branches):
        lines += [f"    {'if' if i == 0 else 'elif'} x == {i}:", f"        return {i}"]
    return "\n".join([*lines, "    return -1", ""])


def test_a_600_branch_elif_helper_is_digested_without_recursing(project: Project) -> None:
    modules = project.load(
        helpers=elif_chain(600),
        pipe="from {helpers} import dispatch\n\n\ndef step(x, out_path):\n    return dispatch(x)\n",
    )
    digest = code_digest(modules["pipe"].step)
    assert [p.name for p in digest.parts] == ["step", "dispatch"]
    assert digest.digest is not None and all(p.digest is not None for p in digest.parts)
    spec = lower(apply("gen/dispatch", modules["pipe"].step, version="v1", x=3, out_path=OUT))
    assert spec.code == digest


LAZY_GLOBALS = """\
import lazy_object_proxy

RESOLVED = []


def _load_model():
    RESOLVED.append("model")  # a lazy model load: never at plan time
    {model}


def _load_settings():
    RESOLVED.append("settings")
    import json

    return json


MODEL = lazy_object_proxy.Proxy(_load_model)
SETTINGS = lazy_object_proxy.Proxy(_load_settings)  # a lazy module


def step(x, out_path):
    return MODEL(x) + SETTINGS.dumps(x)
"""


@pytest.mark.parametrize(
    "model",
    [
        "return lambda x: x",  # resolves to a function (what isinstance would ask about)
        "raise ConnectionError('no model store on the planning machine')",  # cannot resolve
    ],
)
def test_lazy_proxy_globals_are_never_resolved(project: Project, model: str) -> None:
    modules = project.load(pipe=LAZY_GLOBALS.replace("{model}", model))
    pipe = modules["pipe"]
    digest = code_digest(pipe.step)
    spec = lower(apply("lazy/step", pipe.step, version="v1", x=1, out_path=OUT))
    assert pipe.RESOLVED == []  # no factory ran
    # The factories are code the module-level names read (red team r26-1), never called.
    names = [p.name for p in digest.parts]
    assert digest.digest is not None and names == ["step", "_load_model", "_load_settings"]
    assert spec.code == digest


def test_a_fifo_named_py_is_unknown_with_one_warning_never_read(
    project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    modules = project.load(helpers=HELPERS, pipe=PIPE)
    path = Path(modules["helpers"].__file__ or "")
    path.unlink()
    os.mkfifo(path)  # opening it for reading blocks until a writer comes: forever
    cd.clear_cache()
    done, found = threading.Event(), []

    def digest() -> None:
        found.append(code_digest(modules["pipe"].train_model))
        found.append(code_digest(modules["helpers"].weight))
        done.set()

    threading.Thread(target=digest, daemon=True).start()
    try:
        assert done.wait(60), "the code digest blocked on a FIFO"
    finally:
        while not done.wait(0.05):  # code that opened the FIFO: let each open() return
            with contextlib.suppress(OSError):  # ENXIO: no reader waiting at this moment
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        path.unlink()  # tools that read every loaded module's file (Hypothesis) must not block
        for module in modules.values():
            sys.modules.pop(module.__name__, None)
    step, helper = found
    assert step.digest is not None
    assert [u.split(" ", 1)[0] for u in step.unseen] == ["tokenize", "weight"]
    assert all(u.endswith("helpers.py is not a regular file: not read)") for u in step.unseen)
    assert helper.digest is None
    warnings = [r.getMessage() for r in caplog.records if "code digest" in r.getMessage()]
    assert len(warnings) == 1 and "helpers.py is not a regular file" in warnings[0]


def test_a_part_that_fails_is_unknown_with_one_warning(
    project: Project, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = project.load(helpers=HELPERS, pipe=PIPE)
    real = cd.split_definition

    def broken(node: Any, refs: Any) -> Any:
        if getattr(node, "name", "") == "tokenize":
            raise RecursionError("maximum recursion depth exceeded")
        return real(node, refs)

    monkeypatch.setattr(cd, "split_definition", broken)
    digest = code_digest(modules["pipe"].train_model)
    assert digest.digest is not None
    assert digest.unseen == ["tokenize (its digest failed (RecursionError))"]
    again = code_digest(
        apply("x", modules["pipe"].train_model, version="v1", text="a", out_path=OUT).run
    )
    assert again is digest
    warnings = [r.getMessage() for r in caplog.records if "code digest" in r.getMessage()]
    assert warnings == ["code digest: tokenize: its digest failed (RecursionError); "
                        "code drift is not checked there"]  # fmt: skip


def test_a_notebook_cell_registered_in_linecache_is_digested() -> None:
    filename = f"/nonexistent/ipykernel_{uuid.uuid4().hex[:8]}/cell.py"  # as IPython names cells
    source = "def cell_step(x):\n    return x + 1\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        namespace: dict[str, Any] = {"__name__": "__main__"}
        exec(compile(source, filename, "exec"), namespace)
        digest = code_digest(namespace["cell_step"])
        assert digest.digest is not None and [p.name for p in digest.parts] == ["cell_step"]
    finally:
        linecache.cache.pop(filename, None)


def build_wheel(folder: Path, name: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``files`` (what any build backend makes, without needing one)."""
    info = f"{name}-0.1.dist-info"
    members = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{member},,\n" for member in members) + f"{info}/RECORD,,\n"
    wheel = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for member, text in {**members, f"{info}/RECORD": record}.items():
            archive.writestr(member, text)
    return wheel


def test_a_package_from_a_checkout_and_from_its_installed_wheel_digest_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = {
        "tinypkg/__init__.py": "",
        "tinypkg/helpers.py": "def tokenize(text):\n    return text.split()\n",
    }
    checkout = tmp_path / "checkout"
    for member, text in package.items():
        (checkout / "src" / member).parent.mkdir(parents=True, exist_ok=True)
        (checkout / "src" / member).write_text(text)
    (checkout / "pyproject.toml").write_text('[project]\nname = "tinypkg"\nversion = "0.1"\n')
    (checkout / "pipe.py").write_text(
        "from tinypkg.helpers import tokenize\n\n\ndef step(text, out_path):\n"
        "    return tokenize(text)\n"
    )
    site_packages = tmp_path / "venv" / "lib" / "site-packages"
    wheel = build_wheel(tmp_path, "tinypkg", package)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--target", str(site_packages), str(wheel)],
        check=True,
    )  # fmt: skip

    def digest_with(where: Path) -> CodeDigest:
        for name in [m for m in sys.modules if m.split(".")[0] == "tinypkg"]:
            del sys.modules[name]
        monkeypatch.setattr(sys, "path", [str(where), *sys.path])
        cd.clear_cache()
        pipe = import_file(f"pipe_{uuid.uuid4().hex[:8]}", checkout / "pipe.py")
        assert (sys.modules["tinypkg.helpers"].__file__ or "").startswith(str(where))
        return code_digest(pipe.step)

    try:
        monkeypatch.chdir(checkout)  # the project's pyproject.toml names its distribution
        from_checkout = digest_with(checkout / "src")
        installed = digest_with(site_packages)
        assert [p.name for p in from_checkout.parts] == ["step", "tokenize"]
        assert installed.digest == from_checkout.digest
        monkeypatch.chdir(tmp_path)  # elsewhere, tinypkg is an installed package like any other
        assert [p.name for p in digest_with(site_packages).parts] == ["step"]
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "tinypkg"]:
            del sys.modules[name]
        cd.clear_cache()


CLI_PIPELINE = """\
import types

import lazy_object_proxy

from dispatch import dispatch
from fifo_helper import scale
from marin.execution.lazy import OUT, apply


def _load_model():
    open({marker!r}, "w").close()  # a side effect that must never happen while planning
    return types.SimpleNamespace(size=1)


MODEL = lazy_object_proxy.Proxy(_load_model)


def first(x, out_path):
    return dispatch(x) + scale(x)


def second(x, out_path):
    return scale(x) + MODEL.size


pipeline = [
    apply("cd/first", first, version="v1", x=1, out_path=OUT),
    apply("cd/second", second, version="v1", x=2, out_path=OUT),
]
"""


def marin_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_marin_plan_run_and_export_work_with_one_warning(tmp_path: Path) -> None:
    """A 600-branch helper, a lazy proxy whose factory fails, and a helper whose ``.py`` is a
    FIFO (its code imported from a ``.pyc`` beside it)."""
    import py_compile

    folder = tmp_path / "pipeline"
    folder.mkdir()
    marker = tmp_path / "the-factory-ran"
    (folder / "dispatch.py").write_text(elif_chain(600))
    helper = folder / "fifo_helper.py"
    helper.write_text("def scale(x):\n    return 3 * x\n")
    py_compile.compile(str(helper), cfile=str(folder / "fifo_helper.pyc"), doraise=True)
    helper.unlink()
    os.mkfifo(helper)  # its code names it as its source; reading it would block forever
    (folder / "pipe.py").write_text(CLI_PIPELINE.format(marker=str(marker)))
    target, prefix = f"{folder / 'pipe.py'}:pipeline", str(tmp_path / "prefix")

    def marin_ok(*args: str) -> None:
        done = marin_cli(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        warnings = [line for line in done.stderr.splitlines() if "code digest" in line]
        assert len(warnings) == 1, done.stderr  # once per run, not once per step
        assert "fifo_helper.py is not a regular file" in warnings[0]
        assert "Traceback" not in done.stderr

    policies = ("warn", "rebuild", "error")
    for policy in policies:
        marin_ok("plan", target, "--prefix", prefix, "--on-code-drift", policy)
    marin_ok("export", "airflow", target, "--output", str(tmp_path / "dags"))
    assert not marker.exists()  # the proxy's factory never ran while planning
    for policy in policies:  # the steps' records now hold their code digests
        marin_ok("run", target, "--prefix", prefix, "--on-code-drift", policy)
        marin_ok("plan", target, "--prefix", prefix, "--on-code-drift", policy)
    assert marker.exists()  # running a step resolves the proxy, as it should


def _patched_add(self: Any, other: Any) -> Any:
    return NotImplemented


def test_a_library_class_patched_after_it_was_read_is_read_again() -> None:
    """A library class's reading is kept only while its namespace holds the same names and
    objects: a project function patched onto it later is followed by the next digest."""
    import fractions

    from marin.execution.digest.code import code_digest

    def before() -> Any:
        return fractions.Fraction(1, 2)

    def after() -> Any:
        return fractions.Fraction(1, 2)

    assert not any(p.name.endswith(".<patched>") for p in code_digest(before).parts)
    fractions.Fraction._marin_probe = _patched_add  # type: ignore[attr-defined]
    try:
        parts = code_digest(after).parts
    finally:
        del fractions.Fraction._marin_probe  # type: ignore[attr-defined]
    assert any(p.name == "Fraction.<patched>" for p in parts), [p.name for p in parts]


def test_a_registry_keyed_by_an_enum_member_or_a_dataclass_is_read_by_value(
    project: Project,
) -> None:
    """Red team r35-1: a module-level registry filled by calls (``register(Size.S, 0.1)``) was
    plain data only while every key was: an enum member or a dataclass key dropped it from the
    digest, so an edit of ``0.1`` was served under ``--on-code-drift error``."""
    sizes = """\
        import dataclasses
        import enum


        class Size(enum.Enum):
            S = "s"


        @dataclasses.dataclass(frozen=True)
        class Spec:
            name: str


        LRS = {{}}
        BY_SPEC = {{}}


        def register(size, spec, lr):
            LRS[size] = lr
            BY_SPEC[spec] = lr


        register(Size.S, Spec("s"), 0.1)


        def gen(out_path):
            return LRS[Size.S], BY_SPEC[Spec("s")]
        """
    before = code_digest(project.load(sizes=sizes)["sizes"].gen)
    assert not code_drifted(before, code_digest(project.load(sizes=sizes)["sizes"].gen))
    after = code_digest(project.load(sizes=sizes.replace("0.1)", "0.2)"))["sizes"].gen)
    assert code_drifted(before, after)


def test_a_changed_object_in_a_registry_names_what_changed_not_a_line_0(
    project: Project,
) -> None:
    """Red team r35-2: the drift of an object's state held in a module-level registry was
    located at ``(?, line 0: ...)``, a placeholder, not a file and line."""
    from marin.execution.digest.code_drift import explain_code_drift

    boxes = """\
        class Box:
            def __init__(self, lr):
                self.lr = lr

            def scaled(self):
                return self.lr * 2


        BOXES = {{}}


        def register(name, lr):
            BOXES[name] = Box(lr)


        register("s", 0.1)


        def gen(out_path):
            return BOXES["s"].scaled()
        """
    before = code_digest(project.load(boxes=boxes)["boxes"].gen)
    after = code_digest(project.load(boxes=boxes.replace("0.1)", "0.2)"))["boxes"].gen)
    lines = explain_code_drift(before, after)
    assert lines == [
        "code: Box.<carried> changed (the state of an object a module-level value holds)"
        ", called by gen"
    ], lines
