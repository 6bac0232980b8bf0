"""Red team round two (findings 1, 2 and 5): what a step computes from that the code digest and
the fingerprint did not see, so an edit was served as "unchanged".

1. A ``functools.partial``'s bound values are in the fingerprint (``fn``), and a closure's cell
   values in the code digest; a value with no stable form is refused, or unseen.
2. Code reached through a string (``getattr``, ``import_module``, ``globals()``,
   ``sys.modules``), an instance held in a module-level dict and a ``SimpleNamespace`` are
   followed, or unseen: never "unchanged".
5. A project module whose name an installed distribution also claims is the project's when it
   is loaded from the project, not from where that distribution is installed.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from marin.execution.digest import code as cd
from marin.execution.digest.code import CodeDigest, code_digest
from marin.execution.digest.code_drift import code_drifted, explain_code_drift
from marin.execution.digest.source import is_project_module
from marin.execution.errors import ConfigError
from marin.execution.lazy import OUT, apply, lower
from marin.execution.remote.code_check import check_code, expected_code
from marin.execution.store.identity import _code_unknown
from tests.test_code_digest import Project, build_wheel, import_file, marin_cli


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


def unchanged(before: CodeDigest, after: CodeDigest) -> bool:
    """What the plan would call "unchanged": comparable and equal."""
    return not code_drifted(before, after) and not _code_unknown(before, after)


# --- finding 1: partial keywords and closure cells ---------------------------------------------

FACTORY = """\
def train(out_path, lr):
    return {{"lr": lr}}


def make(lr):
    def fit(out_path):
        return train(out_path, lr)
    return fit
"""


def test_finding_1_partial_keywords_are_fingerprinted_as_config(project: Project) -> None:
    train = project.load(pipe=FACTORY)["pipe"].train

    def spec(fn: object) -> object:
        return lower(apply("p", fn, version="v1", out_path=OUT))

    low, high = spec(functools.partial(train, lr=0.1)), spec(functools.partial(train, lr=0.5))
    assert low.fingerprint != high.fingerprint  # type: ignore[attr-defined]
    assert '"fn":{"keywords":{"lr":0.1}}' in low.fingerprint_payload  # type: ignore[attr-defined]
    positional = lower(
        apply("p", functools.partial(functools.partial(train), "x"), version="v1", lr=1)
    )
    assert '"fn":{"args":["x"]}' in positional.fingerprint_payload  # type: ignore[attr-defined]
    plain = lower(apply("p", train, version="v1", out_path=OUT, lr=0.1))
    assert '"fn"' not in plain.fingerprint_payload  # a plain function's fingerprint is unchanged


def test_finding_1_a_partial_binding_a_function_is_refused_naming_step_field_and_fix(
    project: Project,
) -> None:
    train = project.load(pipe=FACTORY)["pipe"].train
    with pytest.raises(ConfigError) as caught:
        lower(apply("p", functools.partial(train, lr=print), version="v1", out_path=OUT))
    assert caught.value.step == "p@v1"
    assert "fn.keywords.lr" in caught.value.what and "functools.partial" in caught.value.what
    assert "apply() as an input" in caught.value.fix


def test_finding_1_closure_cell_values_are_in_the_code_digest(project: Project) -> None:
    make = project.load(pipe=FACTORY)["pipe"].make
    low, again, high = code_digest(make(0.1)), code_digest(make(0.1)), code_digest(make(0.5))
    assert low.digest == again.digest and unchanged(low, again)
    assert code_drifted(low, high)
    assert {"make.<locals>.fit", "train"} <= {
        p.name for p in low.parts
    }  # a cell holding a function: followed
    opaque = code_digest(make(object()))  # an object: its state cannot be compared
    assert opaque.unseen == [
        "make.<locals>.fit.<closure lr> (its closure holds a object (lr): a run-time value, "
        "not compared)"
    ]
    assert _code_unknown(opaque, opaque).startswith("unseen: make.<locals>.fit.<closure lr>")


def test_finding_1_through_the_cli_a_changed_partial_or_factory_value_is_rebuilt(
    tmp_path: Path,
) -> None:
    """The red team's ``r2-repro-1.sh``: ``lr`` 0.1 -> 0.5 was served ``{"lr": 0.1}``."""
    pipe = tmp_path / "pipe.py"
    source = (
        "import functools, json, os\nfrom marin.execution.lazy import OUT, apply\n"
        "def w(out_path, v):\n    os.makedirs(out_path, exist_ok=True)\n"
        "    open(os.path.join(out_path, 'r.json'), 'w').write(json.dumps(v))\n    return v\n"
        "def train(out_path, lr): return w(out_path, {'lr': lr})\n"
        "def make(lr):\n    def fit(out_path): return w(out_path, {'lr': lr})\n    return fit\n"
        "pipeline = [apply('n1/partial', functools.partial(train, lr=0.1), version='v1', "
        "out_path=OUT), apply('n1/closure', make(0.1), version='v1', out_path=OUT)]\n"
    )
    pipe.write_text(source)
    target, prefix = f"{pipe}:pipeline", str(tmp_path / "P")
    policies = ("--on-drift", "rebuild", "--on-code-drift", "rebuild")
    assert (
        marin_cli("run", target, "--prefix", prefix, "--no-progress", cwd=tmp_path).returncode == 0
    )
    pipe.write_text(source.replace("lr=0.1", "lr=0.5").replace("make(0.1)", "make(0.5)"))
    plan = marin_cli("plan", target, "--prefix", prefix, *policies, cwd=tmp_path)
    assert "record matches fingerprint" not in plan.stdout, plan.stdout
    done = marin_cli("run", target, "--prefix", prefix, "--no-progress", *policies, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for step in ("partial", "closure"):
        assert (tmp_path / "P" / "n1" / step / "v1" / "r.json").read_text() == '{"lr": 0.5}'


# --- finding 2: code reached dynamically -------------------------------------------------------

DYNAMIC = """\
import importlib
import sys
from types import SimpleNamespace

import {helpers}


class Model:
    def run(self, x):
        return x + 1


MODELS = {{"a": Model()}}


def f3(x):
    return x + 1


NS = SimpleNamespace(fn=f3)


def f18(x):
    return x + 1


def s_getattr(x):
    return getattr({helpers}, "h3")(x)


def s_importlib(x):
    return importlib.import_module("{helpers}").h12(x)


def s_modules(x):
    return sys.modules["{helpers}"].h12(x)


def s_instance(x):
    return MODELS["a"].run(x)


def s_namespace(x):
    return NS.fn(x)


def s_globals(x):
    return globals()["f18"](x)
"""
HELPERS = "def h3(x):\n    return x + 1\n\n\ndef h12(x):\n    return x + 1\n"
STEPS = {
    "s_getattr": "h3",
    "s_importlib": "h12",
    "s_modules": "h12",
    "s_instance": "Model",
    "s_namespace": "f3",
    "s_globals": "f18",
}


@pytest.mark.parametrize(("step", "callee"), STEPS.items())
def test_finding_2_code_reached_through_a_string_or_a_holder_is_followed(
    project: Project, step: str, callee: str
) -> None:
    """The red team's ``r2-repro-2.sh``: every edit was "built: record matches fingerprint"."""
    before = project.load(helpers=HELPERS, pipe=DYNAMIC)
    after = project.load(helpers=HELPERS.replace("+ 1", "+ 2"), pipe=DYNAMIC.replace("+ 1", "+ 2"))
    old, new = code_digest(getattr(before["pipe"], step)), code_digest(getattr(after["pipe"], step))
    assert old.digest is not None and not old.unseen, old.unseen
    held = ".<carried>"  # an instance's fields in the dict (round 7): a part of their own
    assert [p.name for p in old.parts if not p.name.endswith(held)] == [step, callee]
    changed = [p.name for p, q in zip(old.parts, new.parts, strict=True) if p.digest != q.digest]
    assert callee in changed and code_drifted(old, new)


@pytest.mark.parametrize(
    ("body", "unseen"),
    [
        ("getattr({helpers}, name)(1)", "{helpers}.*"),
        ("globals()[name](1)", "globals()[...]"),
        ("importlib.import_module('{helpers}')", "{helpers}.*"),
        ("importlib.import_module(f'{helpers}.{{name}}')", "{helpers}.*"),
        ("sys.modules[name].h3(1)", "sys.modules"),
    ],
)
def test_finding_2_what_cannot_be_followed_is_unseen_never_unchanged(
    project: Project, body: str, unseen: str
) -> None:
    pipe = f"import importlib\nimport sys\n\nimport {{helpers}}\n\n\ndef step(name):\n    return {body}\n"
    modules = project.load(helpers=HELPERS, pipe=pipe)
    digest = code_digest(modules["pipe"].step)
    helpers = modules["helpers"].__name__
    assert [u.split(" (")[0] for u in digest.unseen] == [unseen.format(helpers=helpers)]
    assert _code_unknown(digest, digest).startswith("unseen: ")


def test_finding_2_ordinary_code_and_data_imports_stay_comparable(project: Project) -> None:
    """No false "unknown": ``getattr`` on an argument or a library, a stdlib module imported by
    name as data (``examples/ngram.py``), ``sys.modules`` untouched."""
    pipe = """\
    import importlib
    import json


    def step(obj, names):
        mods = [importlib.import_module(n) for n in names]
        return getattr(obj, "x", None), getattr(json, "dumps"), len(mods)
    """
    digest = code_digest(project.load(pipe=pipe)["pipe"].step)
    assert digest.digest is not None and digest.unseen == []
    from examples import ngram

    for name in ("build_corpus", "tokenize_shard", "train_ngram", "evaluate"):
        example = code_digest(getattr(ngram, name))
        assert example.digest is not None and example.unseen == [], (name, example.unseen)


# --- finding 5: a project module named like an installed distribution's ------------------------


def test_finding_5_a_project_module_a_wheel_also_claims_is_the_projects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The red team's ``r2-repro-5.sh``: a project's ``tools.py`` (cron_descriptor's wheel
    declares top-level ``tools``) was taken for a library, its edits never drift."""
    name = f"claimed_{uuid.uuid4().hex[:8]}"
    site_packages = tmp_path / "site-packages"
    wheel = build_wheel(
        tmp_path, "otherdist", {f"{name}/__init__.py": "def up(x):\n    return x\n"}
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--target", str(site_packages), str(wheel)],
        check=True,
    )  # fmt: skip
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "0.1"\n')
    monkeypatch.setattr(sys, "path", [str(site_packages), *sys.path])
    monkeypatch.chdir(checkout)
    cd.clear_cache()
    try:
        installed = site_packages / name / "__init__.py"
        assert not is_project_module(name, str(installed))  # where the wheel put it: a library
        digests = []
        for body in ("x.lower()", "x.upper()"):
            (checkout / f"{name}.py").write_text(f"def up(x):\n    return {body}\n")
            module = import_file(name, checkout / f"{name}.py")
            assert is_project_module(name, module.__file__ or "")
            pipe = checkout / f"pipe_{uuid.uuid4().hex[:8]}.py"
            pipe.write_text(f"import {name}\n\n\ndef step(x):\n    return {name}.up(x)\n")
            digests.append(code_digest(import_file(pipe.stem, pipe).step))
            cd.clear_cache()
        assert [p.name for p in digests[0].parts] == ["step", "up"]
        assert code_drifted(digests[0], digests[1])
    finally:
        sys.modules.pop(name, None)
        cd.clear_cache()


# --- round 3 -----------------------------------------------------------------------------------

TRAINER = """\
import dataclasses
import functools


class Trainer:
    def __init__(self, scale):
        self.scale = scale

    def train(self, out_path):
        return self.scale

    def train_lr(self, out_path, lr):
        return [self.scale, lr]

    def __call__(self, out_path):
        return self.scale


@dataclasses.dataclass(frozen=True)
class Fit:
    lr: float

    def __call__(self, out_path):
        return self.lr


class Slotted:
    __slots__ = ("scale",)

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, out_path):
        return self.scale
"""


def fingerprint_and_code(fn: object) -> tuple[str, CodeDigest]:
    spec = lower(apply("p", fn, version="v1", out_path=OUT))
    return spec.fingerprint, spec.code  # type: ignore[attr-defined,return-value]


def test_round3_finding_1_an_objects_fields_are_in_the_code_digest_not_the_fingerprint(
    project: Project,
) -> None:
    """``r3-repro-1.sh``: ``Trainer(103) -> Trainer(903)`` was "record matches fingerprint".
    The object is run-time state (it may hold a lock, a counter): by the closure rule its
    fields are in the code digest, plain data by value, and the fingerprint stays as it was."""
    pipe = project.load(pipe=TRAINER)["pipe"]
    shapes = {
        "Trainer": lambda n: pipe.Trainer(n),
        "Trainer.train": lambda n: pipe.Trainer(n).train,
        "Trainer.train_lr": lambda n: functools.partial(pipe.Trainer(n).train_lr, lr=1),
        "Fit": lambda n: pipe.Fit(n),
        "Slotted": lambda n: pipe.Slotted(n),
    }
    for root, shape in shapes.items():
        (low_fp, low), (again_fp, again), (high_fp, high) = (
            fingerprint_and_code(shape(n)) for n in (103, 103, 903)
        )
        assert low_fp == again_fp == high_fp, root  # not config: never refused
        assert low.digest == again.digest and unchanged(low, again), root
        assert code_drifted(low, high), root
        owner = root.partition(".")[0]
        assert [p.name for p in low.parts][:2] == [root, f"{owner}.<self>"]
        assert owner in {p.name for p in low.parts}  # the class's code: every method
        field = "lr" if owner == "Fit" else "scale"
        assert explain_code_drift(low, high) == [
            f"code: {owner}.<self> changed (a field's value: {field}), the object of {root}"
        ]
    plain = code_digest(pipe.Trainer.train)  # the function alone: no object
    assert ".<self>" not in str([p.name for p in plain.parts])


OBJECTS = """\
import dataclasses
import threading


@dataclasses.dataclass
class Config:
    lr: float


class Guarded:
    def __init__(self, scale, config=None):
        self.scale = scale
        self.lock = threading.Lock()
        self.config = config

    def train(self, out_path):
        with self.lock:
            return self.scale


class Trap:
    \"\"\"Every way of reading it that runs its code fails.\"\"\"

    def __init__(self, scale):
        self.scale = scale

    def __getattribute__(self, name):
        raise RuntimeError(f"user code ran: {{name}}")

    def __getstate__(self):
        raise RuntimeError("user code ran: __getstate__")

    def __repr__(self):
        raise RuntimeError("user code ran: __repr__")

    def __call__(self, out_path):
        return 1
"""


def test_round3_finding_1_an_object_holding_a_lock_lowers_and_compares_as_unknown(
    project: Project,
) -> None:
    """A field without a plain form (a lock, an open file, a client, a nested object) is
    unseen, as a closure cell holding one is: the code compares as unknown, never as
    unchanged, and the object is never refused. Reading it runs no user code."""
    pipe = project.load(pipe=OBJECTS)["pipe"]
    _, code = fingerprint_and_code(pipe.Guarded(103).train)
    assert code.digest is not None and code.unseen == [
        "Guarded.<self lock> (its object holds a lock (lock): a run-time value, not compared)"
    ]
    assert _code_unknown(code, code).startswith("unseen: Guarded.<self lock>")
    assert not unchanged(code, fingerprint_and_code(pipe.Guarded(103).train)[1])
    nested = fingerprint_and_code(pipe.Guarded(103, pipe.Config(0.1)).train)[1]
    # A nested dataclass of plain fields is read by value (red team r35-1), no longer unseen:
    assert "Guarded.<self config>" not in str(nested.unseen)
    other = fingerprint_and_code(pipe.Guarded(103, pipe.Config(0.2)).train)[1]
    assert nested.parts != other.parts
    trapped = code_digest(pipe.Trap(5))  # (apply() itself inspects its signature)
    assert trapped.digest is not None and trapped.parts[1].name == "Trap.<self>"
    assert code_drifted(trapped, code_digest(pipe.Trap(6)))


def test_round3_finding_1_a_remote_jobs_code_check_ignores_its_objects_fields(
    project: Project,
) -> None:
    """A job runs the object as the submit pickled it: a field that moved since lowering (a
    counter) is no source edit, so the job's code check does not fail on it."""
    pipe = project.load(pipe=TRAINER)["pipe"]
    expected = expected_code("p@v1", code_digest(pipe.Trainer(103).train))
    check_code(pipe.Trainer(104).train, expected=expected)  # does not raise


CLI_TRAINER = """\
import functools, json, os, threading
from marin.execution.lazy import OUT, apply


def w(out_path, v):
    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, "r.json"), "w") as f:
        f.write(json.dumps(v))
    return v


class Trainer:
    def __init__(self, scale):
        self.scale = scale
        self.calls = 0

    def train(self, out_path):
        self.calls += 1  # a counter: it moves during a run
        return w(out_path, self.scale)

    def train_lr(self, out_path, lr):
        return w(out_path, [self.scale, lr])

    def __call__(self, out_path):
        self.calls += 1
        return w(out_path, self.scale)


class Slotted:
    __slots__ = ("scale",)

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, out_path):
        return w(out_path, self.scale)


class Guarded(Trainer):
    def __init__(self, scale):
        super().__init__(scale)
        self.lock = threading.Lock()


T = Trainer(103)
pipeline = [
    apply("t/instance", T, version="v1", out_path=OUT),
    apply("t/bound", Trainer(103).train, version="v1", out_path=OUT),
    apply("t/partial", functools.partial(Trainer(103).train_lr, lr=1), version="v1", out_path=OUT),
    apply("t/slots", Slotted(103), version="v1", out_path=OUT),
    apply("t/locked", Guarded(7).train, version="v1", out_path=OUT),
]
"""


def test_round3_finding_1_through_the_cli_a_changed_object_is_code_drift(tmp_path: Path) -> None:
    """``r3-repro-1.sh`` as the user meets it: 103 -> 903 is code drift (served with a note
    under ``warn``, rebuilt under ``rebuild``); a counter the run moved changes no later plan
    (each process reads the value at lowering); a lock makes the code unknown."""
    pipe = tmp_path / "pipe.py"
    pipe.write_text(CLI_TRAINER)
    target, prefix = f"{pipe}:pipeline", str(tmp_path / "P")
    first = marin_cli("run", target, "--prefix", prefix, "--no-progress", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    steps = ("instance", "bound", "partial", "slots")
    policy = ("--on-code-drift", "rebuild")
    again = marin_cli("plan", target, "--prefix", prefix, *policy, cwd=tmp_path)
    text = " ".join(again.stdout.split())  # the table wraps to the terminal's width
    assert text.count("built: record matches fingerprint") == 5, again.stdout
    assert "code changed" not in text  # the counters moved in the run: a fresh process reads 0
    assert text.count("code not compared (unseen: Guarded.<self lock>") == 1, again.stdout
    pipe.write_text(CLI_TRAINER.replace("103", "903"))
    served = marin_cli("run", target, "--prefix", prefix, "--no-progress", cwd=tmp_path)
    warned = " ".join((served.stdout + served.stderr).split())
    assert served.returncode == 0 and warned.count("WARNING code drift t/") == 4, warned
    assert (
        "code: Trainer.<self> changed (a field's value: scale), the object of Trainer.train"
        in warned
    ), warned
    assert (tmp_path / "P" / "t" / "bound" / "v1" / "r.json").read_text() == "103"  # warn
    plan = marin_cli("plan", target, "--prefix", prefix, *policy, cwd=tmp_path)
    text = " ".join(plan.stdout.split())
    assert text.count("code changed: rebuilding (on_code_drift=rebuild)") == 4, plan.stdout
    done = marin_cli("run", target, "--prefix", prefix, "--no-progress", *policy, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    built = {step: (tmp_path / "P" / "t" / step / "v1" / "r.json").read_text() for step in steps}
    assert built == {"instance": "903", "bound": "903", "partial": "[903, 1]", "slots": "903"}


ALIASES = """\
import importlib
import operator

import {helpers}

g = getattr
imp = importlib.import_module
G = globals


def s_alias_getattr(x):
    return g({helpers}, "h3")(x)


def s_alias_import(x):
    return imp("{helpers}").h3(x)


def s_alias_globals(x):
    return G()["{helpers}"].h3(x)


def s_attrgetter(x):
    return operator.attrgetter("h3")({helpers})(x)


def s_vars(x):
    return vars({helpers})["h3"](x)


def s_dict(x):
    return {helpers}.__dict__["h3"](x)


def s_eval(x):
    return eval("{helpers}.h3")(x)


def s_exec(x):
    exec(open("{helpers}.py").read())


def s_reload(x):
    return importlib.reload({helpers}).h3(x)


def s_map(xs):
    return list(map(getattr, [{helpers}], ["h3"]))
"""


@pytest.mark.parametrize(
    "step",
    [
        "s_alias_getattr", "s_alias_import", "s_alias_globals", "s_attrgetter", "s_vars",
        "s_dict", "s_eval", "s_exec", "s_reload", "s_map",
    ],
)  # fmt: skip
def test_round3_finding_2_a_dynamic_look_up_by_alias_or_equivalent_is_unseen(
    project: Project, step: str
) -> None:
    """``r3-repro-2.sh``: each of these was "unchanged" after the helper's edit."""
    modules = project.load(helpers=HELPERS, pipe=ALIASES)
    digest = code_digest(getattr(modules["pipe"], step))
    assert digest.digest is not None and digest.unseen, (step, [p.name for p in digest.parts])
    assert _code_unknown(digest, digest).startswith("unseen: ")


WRAPS = """\
import functools


def scaled(fn):
    @functools.wraps(fn)
    def wrapper(x):
        return fn(x) + 100
    return wrapper
"""
WRAPPED = """\
import {deco}


def plain(x):
    return x


fast = {deco}.scaled(plain)


def make(fn):
    def step(out_path):
        return fn(1)
    return step


def s_module_wrapped(out_path):
    return fast(1)
"""


def test_round3_finding_3_a_wraps_wrapper_applied_by_a_call_is_digested_with_its_code(
    project: Project,
) -> None:
    """``r3-repro-3.sh``: ``fast = scaled(plain)``: the decorator's body was not followed."""
    before = project.load(deco=WRAPS, pipe=WRAPPED)
    after = project.load(deco=WRAPS.replace("+ 100", "+ 900"), pipe=WRAPPED)
    for get in (
        lambda m: m.s_module_wrapped,
        lambda m: m.make(m.fast),
        lambda m: m.fast,  # the wrapper as the step's own function
    ):
        old, new = code_digest(get(before["pipe"])), code_digest(get(after["pipe"]))
        names = [p.name for p in old.parts]
        assert "scaled.<locals>.wrapper" in names and "plain" in names, names
        assert code_drifted(old, new), names
    assert code_digest(before["pipe"].fast).name == "plain"  # the wrapped function names it
    assert code_digest(before["pipe"].plain) != code_digest(before["pipe"].fast)


DISPATCH = """\
import functools


@functools.singledispatch
def proc(x):
    return "generic"


@proc.register
def _(x: int):
    return x + 1


@proc.register(str)
def _s(x):
    return x + "1"
"""


def test_round3_finding_4_singledispatch_overloads_are_followed(project: Project) -> None:
    """``r3-repro-4.sh``: editing the ``@proc.register`` overloads was "unchanged"."""
    pipe = "import {sd}\n\n\ndef s_int(x):\n    return {sd}.proc(1)\n"
    before = project.load(sd=DISPATCH, pipe=pipe)
    for edit in (("x + 1", "x + 2"), ('x + "1"', 'x + "2"')):
        after = project.load(sd=DISPATCH.replace(*edit), pipe=pipe)
        old, new = code_digest(before["pipe"].s_int), code_digest(after["pipe"].s_int)
        assert {"proc", "_", "_s"} <= {p.name for p in old.parts}
        assert not old.unseen and code_drifted(old, new), edit
    direct = code_digest(before["sd"].proc)  # the dispatcher as the step's own function
    assert direct.name == "proc" and {"_", "_s"} <= {p.name for p in direct.parts}


def test_round3_finding_5_a_project_module_with_a_standard_library_name_is_the_projects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``r3-repro-5.sh``: a project's ``tabnanny.py`` was taken for the standard library."""
    import tabnanny

    assert not is_project_module("tabnanny", tabnanny.__file__ or "")  # the real one
    (tmp_path / "tabnanny.py").write_text("def h(x):\n    return x + 1\n")
    monkeypatch.delitem(sys.modules, "tabnanny")
    cd.clear_cache()
    try:
        digests = []
        for body in ("x + 1", "x + 2"):
            (tmp_path / "tabnanny.py").write_text(f"def h(x):\n    return {body}\n")
            module = import_file("tabnanny", tmp_path / "tabnanny.py")
            assert is_project_module("tabnanny", module.__file__ or "")
            pipe = tmp_path / f"pipe_{uuid.uuid4().hex[:8]}.py"
            pipe.write_text("import tabnanny\n\n\ndef step(x):\n    return tabnanny.h(x)\n")
            digests.append(code_digest(import_file(pipe.stem, pipe).step))
            cd.clear_cache()
        assert [p.name for p in digests[0].parts] == ["step", "h"]
        assert code_drifted(digests[0], digests[1])
    finally:
        cd.clear_cache()


# --- red team round four: values set by later statements, look-ups by name, registries, caches --

STEP_OF = "from {helpers} import h\n\n\ndef step(x):\n    return h(x)\n"
"""A step calling ``h`` (its text does not name the module: each load imports another)."""

ROUND4_VALUES = {
    "subscript": ('LIMITS = {{"a": 1}}\nLIMITS["a"] = 2\n\n\ndef h(x):\n    return x * LIMITS["a"]\n',
                  'LIMITS["a"] = 2', 'LIMITS["a"] = 5'),
    "tuple": ("A, B = 2, 3\n\n\ndef h(x):\n    return x * A\n", "A, B = 2, 3", "A, B = 5, 3"),
    "try": ("try:\n    SCALE = 2\nexcept Exception:\n    SCALE = 3\n\n\ndef h(x):\n"
            "    return x * SCALE\n", "SCALE = 2", "SCALE = 5"),
    "global": ("SCALE = 1\n\n\ndef _setup():\n    global SCALE\n    SCALE = 2\n\n\n_setup()\n\n\n"
               "def h(x):\n    return x * SCALE\n", "SCALE = 2", "SCALE = 5"),
    "class_attr": ("class Cfg:\n    k = 1\n\n\nCfg.k = 2\n\n\ndef h(x):\n    return x * Cfg.k\n",
                   "Cfg.k = 2", "Cfg.k = 5"),
    "instance_attr": ("class Cfg:\n    k = 1\n\n\nCfg.k = 2\n\n\ndef h(x):\n"
                      "    return x * Cfg().k\n", "Cfg.k = 2", "Cfg.k = 5"),
    "setattr": ("import sys\n\nsetattr(sys.modules[__name__], 'SCALE', 2)\n\n\ndef h(x):\n"
                "    return x * SCALE  # noqa\n", "'SCALE', 2", "'SCALE', 5"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND4_VALUES))
def test_round4_finding_1_a_module_value_set_by_a_later_statement_is_code(
    project: Project, case: str
) -> None:
    """``r4-repro-1.sh``, ``1b``: a module-level (or class-level) plain value counts by its value
    at lowering, so a statement after its assignment that changes it is seen."""
    source, old, new = ROUND4_VALUES[case]
    before = code_digest(project.load(helpers=source, pipe=STEP_OF)["pipe"].step)
    again = code_digest(project.load(helpers=source, pipe=STEP_OF)["pipe"].step)
    after = code_digest(project.load(helpers=source.replace(old, new), pipe=STEP_OF)["pipe"].step)
    assert not before.unseen and unchanged(before, again), [p.name for p in before.parts]
    assert code_drifted(before, after), case


ROUND4_RUNTIME = """\
import uuid

START = uuid.uuid4().hex
CACHE = {{}}


PATHS = {{"root": "."}}
PATHS["root"] = uuid.uuid4().hex  # a path of this host, say
RUN = None


class Model:
    made = uuid.uuid4().hex
    seen = []


Model.tag = uuid.uuid4().hex


def _init():
    global RUN
    RUN = uuid.uuid4().hex


_init()


def h(x):
    CACHE[x] = START  # the step fills module- and class-level data while it runs
    Model.seen.append((Model.made, Model.tag, PATHS, RUN))
    return x
"""


def test_round4_finding_1_values_computed_at_import_or_moved_by_the_step_are_not_drift(
    project: Project,
) -> None:
    """A value computed at import (``uuid4()``: another in every process), also into an item, a
    class attribute or under ``global``, counts by its source; what the step puts in ``CACHE``
    while it runs is not in a later, fresh lowering's digest."""
    first = project.load(helpers=ROUND4_RUNTIME, pipe=STEP_OF)
    before = code_digest(first["pipe"].step)
    first["pipe"].step(1)
    again = code_digest(project.load(helpers=ROUND4_RUNTIME, pipe=STEP_OF)["pipe"].step)
    assert not before.unseen and unchanged(before, again)


def test_round4_finding_1_through_the_cli_a_later_statement_is_code_drift(tmp_path: Path) -> None:
    """``r4-repro-1.sh`` as the user meets it: the run that fills ``SEEN`` changes no later
    plan; ``LIMITS["a"] = 2`` -> ``5`` is rebuilt under ``rebuild``."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "r4"\nversion = "0"\n')
    helpers = 'LIMITS = {"a": 1}\nLIMITS["a"] = 2\nSEEN = []\n\n\ndef h(x):\n' + (
        "    SEEN.append(x)\n    return x * LIMITS['a']\n"
    )
    (tmp_path / "helpers.py").write_text(helpers)
    (tmp_path / "pipe.py").write_text(
        "import os\nfrom marin.execution.lazy import OUT, apply\nfrom helpers import h\n\n\n"
        "def step(out_path):\n    os.makedirs(out_path, exist_ok=True)\n"
        "    open(os.path.join(out_path, 'v.txt'), 'w').write(str(h(10)))\n\n\n"
        "pipeline = apply('c/step', step, version='v1', out_path=OUT)\n"
    )
    target, prefix = f"{tmp_path / 'pipe.py'}:pipeline", str(tmp_path / "P")
    policy = ("--on-code-drift", "error")
    assert (
        marin_cli("run", target, "--prefix", prefix, "--no-progress", cwd=tmp_path).returncode == 0
    )
    again = marin_cli("run", target, "--prefix", prefix, "--no-progress", *policy, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    (tmp_path / "helpers.py").write_text(helpers.replace('["a"] = 2', '["a"] = 5'))
    plan = marin_cli("plan", target, "--prefix", prefix, "--on-code-drift", "rebuild", cwd=tmp_path)
    assert "code changed: rebuilding" in " ".join(plan.stdout.split()), plan.stdout
    done = marin_cli("run", target, "--prefix", prefix, "--no-progress", "--on-code-drift",
                     "rebuild", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "P" / "c" / "step" / "v1" / "v.txt").read_text() == "50"


ROUND4_LOOKUPS = {
    "getattr_static": "import inspect\n\n\ndef step(x, name='g'):\n"
                      "    return inspect.getattr_static({helpers}, name)(x)\n",
    "resolve_name": "import pkgutil\n\n\ndef step(x, name='g'):\n"
                    "    return pkgutil.resolve_name('{helpers}:' + name)(x)\n",
    "fn_globals": "def step(x, name='g'):\n    return {helpers}.h.__globals__[name](x)\n",
    "object_getattribute": "def step(x, name='g'):\n"
                           "    return object.__getattribute__({helpers}, name)(x)\n",
    "module_getattribute": "def step(x, name='g'):\n    return {helpers}.__getattribute__(name)(x)\n",
    "getmembers": "import inspect\n\n\ndef step(x, name='g'):\n"
                  "    return dict(inspect.getmembers({helpers}))[name](x)\n",
    "subclasses_of_a_computed_class": "def step(x):\n"
                                      "    return [c for c in type(x).__subclasses__()]\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND4_LOOKUPS))
def test_round4_finding_2_more_look_ups_by_name_are_unseen(project: Project, case: str) -> None:
    """``r4-repro-2.sh``: each reached ``g`` by a computed name and was "unchanged"."""
    helpers = "def g(x):\n    return x * 2\n\n\ndef h(x):\n    return x\n"
    pipe = "import {helpers}\n" + ROUND4_LOOKUPS[case]
    digest = code_digest(project.load(helpers=helpers, pipe=pipe)["pipe"].step)
    assert digest.digest is not None and digest.unseen, [p.name for p in digest.parts]
    assert _code_unknown(digest, digest).startswith("unseen: ")


def test_round4_finding_2_a_modules_getattr_is_followed(project: Project) -> None:
    """A PEP 562 ``__getattr__`` decides what ``helpers.g`` is: its code (and ``_impl``) count."""
    helpers = (
        "def _impl(x):\n    return x * 2\n\n\ndef __getattr__(name):\n    if name == 'g':\n"
        "        return _impl\n    raise AttributeError(name)\n"
    )
    pipe = "import {helpers} as helpers\n\n\ndef step(x):\n    return helpers.g(x)\n"
    before = code_digest(project.load(helpers=helpers, pipe=pipe)["pipe"].step)
    again = code_digest(project.load(helpers=helpers, pipe=pipe)["pipe"].step)
    after = code_digest(project.load(helpers=helpers.replace("* 2", "* 5"), pipe=pipe)["pipe"].step)
    assert {"__getattr__", "_impl"} <= {p.name for p in before.parts}
    assert unchanged(before, again) and code_drifted(before, after)


ROUND4_REGISTRIES = {
    "subclasses": "class Base:\n    def f(self, x):\n        return x\n\n\nclass A(Base):\n"
                  "    def f(self, x):\n        return x * 2\n\n\ndef h(x):\n"
                  "    return sum(c().f(x) for c in Base.__subclasses__())\n",
    "init_subclass": "class Base:\n    REG = {{}}\n\n    def __init_subclass__(cls, **kw):\n"
                     "        Base.REG[cls.__name__] = cls\n\n\nclass A(Base):\n"
                     "    def f(self, x):\n        return x * 2\n\n\ndef h(x, name='A'):\n"
                     "    return Base.REG[name]().f(x)\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND4_REGISTRIES))
def test_round4_finding_3_a_classs_subclasses_are_followed(project: Project, case: str) -> None:
    """``r4-repro-3.sh``: ``Base.__subclasses__()`` and a registry ``__init_subclass__`` fills."""
    source = ROUND4_REGISTRIES[case]
    before = code_digest(project.load(helpers=source, pipe=STEP_OF)["pipe"].step)
    again = code_digest(project.load(helpers=source, pipe=STEP_OF)["pipe"].step)
    edited = source.replace("x * 2", "x * 5")
    after = code_digest(project.load(helpers=edited, pipe=STEP_OF)["pipe"].step)
    assert "A" in {p.name for p in before.parts} and not before.unseen
    assert unchanged(before, again) and code_drifted(before, after)


ROUND4_WRAPPERS = {
    "lru_cache": "import functools\n\n\n@functools.lru_cache(maxsize=None)\n",
    "cache": "import functools\n\n\n@functools.cache\n",
    "update_wrapper_class": "import functools\n\n\nclass Wrap:\n    def __init__(self, f):\n"
                            "        functools.update_wrapper(self, f)\n        self.f = f\n\n"
                            "    def __call__(self, *a):\n        return self.f(*a)\n\n\n@Wrap\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND4_WRAPPERS))
def test_round4_finding_4_a_cached_or_wrapped_helper_is_followed(
    project: Project, case: str
) -> None:
    """``r4-repro-4.sh``: ``__wrapped__`` of ``lru_cache``, ``cache`` and a class calling
    ``functools.update_wrapper`` is followed, as a ``functools.wraps`` function's is."""
    source = ROUND4_WRAPPERS[case] + "def g(x):\n    return x * 2\n\n\ndef h(x):\n    return g(x)\n"
    before = code_digest(project.load(helpers=source, pipe=STEP_OF)["pipe"].step)
    again = code_digest(project.load(helpers=source, pipe=STEP_OF)["pipe"].step)
    edited = source.replace("x * 2", "x * 5")
    after = code_digest(project.load(helpers=edited, pipe=STEP_OF)["pipe"].step)
    assert "g" in {p.name for p in before.parts} and not before.unseen
    assert unchanged(before, again) and code_drifted(before, after)


def test_round4_finding_4_a_wrapped_callable_without_source_is_unseen(project: Project) -> None:
    """What ``__wrapped__`` holds, made at run time, is named unseen, never "unchanged"."""
    helpers = (
        "import functools\n\nexec('def made(x):\\n    return x\\n')\n"
        "g = functools.lru_cache(made)  # noqa: F821\n\n\ndef h(x):\n    return g(x)\n"
    )
    digest = code_digest(project.load(helpers=helpers, pipe=STEP_OF)["pipe"].step)
    assert digest.unseen[0] == "made (defined at run time (<string>))", digest.unseen
    assert all("made" in u or "globals" in u for u in digest.unseen)  # (exec: its globals too)


# --- red team round five: a step function's object (class state, __dict__, classmethods) -------

ROUND5_CLASS_STATE = {
    "type_self": ("class Trainer:\n    K = 0\n\n    def __init__(self, k):\n"
                  "        type(self).K = k\n\n    def train(self, out_path):\n        return self.K\n\n\n"
                  "FN = Trainer(103).train\n", "Trainer(103)"),
    "classmethod": ("class Trainer:\n    K = 0\n\n    @classmethod\n    def configure(cls, k):\n"
                    "        cls.K = k\n\n    @classmethod\n    def train(cls, out_path):\n"
                    "        return cls.K\n\n\nTrainer.configure(103)\nFN = Trainer.train\n",
                    "configure(103)"),
    "subclass_literal": ("class Base:\n    K = 0\n\n    @classmethod\n    def train(cls, out_path):\n"
                         "        return cls.K\n\n\nclass Sub(Base):\n    pass\n\n\nSub.K = 103\n"
                         "FN = Sub.train\n", "Sub.K = 103"),
    "subclass_computed": ("class Base:\n    K = 0\n\n    @classmethod\n    def train(cls, out_path):\n"
                          "        return cls.K\n\n\nclass Sub(Base):\n    pass\n\n\n"
                          "Sub.K = int('103')\nFN = Sub.train\n", "int('103')"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ROUND5_CLASS_STATE))
def test_round5_finding_1_3_state_kept_on_the_class_is_compared(
    project: Project, case: str
) -> None:
    """``r5-repro-1.sh``, ``r5-repro-3.sh``: state an object keeps on its class, and a bound
    classmethod's class (its object), count: ``103 -> 903`` is drift, a fresh lowering of the
    same code is not."""
    source, old = ROUND5_CLASS_STATE[case]
    before = fingerprint_and_code(project.load(pipe=source)["pipe"].FN)[1]
    again = fingerprint_and_code(project.load(pipe=source)["pipe"].FN)[1]
    after = fingerprint_and_code(
        project.load(pipe=source.replace(old, old.replace("103", "903")))["pipe"].FN
    )[1]
    assert not before.unseen and unchanged(before, again), [p.name for p in before.parts]
    assert code_drifted(before, after), case
    owner = "Sub" if case.startswith("subclass") else "Trainer"
    lines = explain_code_drift(before, after)
    assert any(line.startswith(f"code: {owner} changed") for line in lines), lines


WEAK_STATE = """\
import weakref

_STATE = weakref.WeakKeyDictionary()


class Trainer:
    _own = weakref.WeakKeyDictionary()

    def __init__(self, k):
        _STATE[self] = k
        Trainer._own[self] = k

    def train(self, out_path):
        return _STATE[self]

    def train_own(self, out_path):
        return type(self)._own[self]
"""


def test_round5_finding_1_a_weak_registry_keyed_by_the_object_is_unseen(project: Project) -> None:
    """State kept in a module- or class-level ``WeakKeyDictionary`` keyed by ``self`` is
    run-time state of live objects: the code is unseen (named), never "unchanged"."""
    pipe = project.load(pipe=WEAK_STATE)["pipe"]
    module_level = code_digest(pipe.Trainer(103).train)
    assert "_STATE (a weak-reference registry" in str(module_level.unseen), module_level.unseen
    assert not unchanged(module_level, code_digest(pipe.Trainer(103).train))
    class_level = code_digest(pipe.Trainer(103).train_own)
    assert "Trainer._own (a weak-reference registry" in str(class_level.unseen)


HIDDEN_DICT = """\
RAN = []


class Trainer:
    def __init__(self, k):
        object.__setattr__(self, "k", k)

    @property
    def __dict__(self):
        RAN.append("__dict__")
        return {{}}

    def train(self, out_path):
        return self.k


class Hidden(Trainer):
    pass


class Failed(Exception):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def train(self, out_path):
        return self.k
"""


def test_round5_finding_2_an_instance_dict_hidden_by_a_property_is_unseen(project: Project) -> None:
    """``r5-repro-2.sh``: a class whose ``__dict__`` is a property keeps its fields where no
    C-level descriptor reads them: they are an unseen part, and the property never runs; an
    ``Exception`` subclass's fields (its dict is a builtin base's) are read and compared."""
    pipe = project.load(pipe=HIDDEN_DICT)["pipe"]
    for kind in (pipe.Trainer, pipe.Hidden):
        code = code_digest(kind(103).train)
        name = kind.__qualname__
        assert code.unseen == [
            f"{name}.<self __dict__> (its class replaces __dict__, so its fields are not read: "
            "not compared)"
        ]
    assert pipe.RAN == []
    low, high = code_digest(pipe.Failed(103).train), code_digest(pipe.Failed(903).train)
    assert not low.unseen and code_drifted(low, high)
    assert unchanged(low, code_digest(pipe.Failed(103).train))


def test_round5_finding_4_a_dict_fields_key_order_is_compared(project: Project) -> None:
    """``r5-repro-4.sh``: code's values are compared by value, a dict's key order included
    (``list(self.layers)`` depends on it); a set's order (the hash seed's) is not."""
    pipe = project.load(pipe=TRAINER)["pipe"]

    def digest(value: object) -> CodeDigest:
        return code_digest(pipe.Trainer(value).train)

    ab, ba = digest({"a": 1, "b": 2}), digest({"b": 2, "a": 1})
    assert code_drifted(ab, ba) and unchanged(ab, digest({"a": 1, "b": 2}))
    assert unchanged(digest({"x", "y", "z"}), digest({"z", "y", "x"}))


def test_round5_finding_5_a_changed_field_is_named_without_a_misleading_line(
    project: Project,
) -> None:
    """``r5-repro-5.sh``: the drift of an object's field names the field (the object was made
    at run time: no line of its class is "the changed statement")."""
    pipe = project.load(pipe=TRAINER)["pipe"]
    low = code_digest(functools.partial(pipe.Trainer(103).train_lr, lr=1))
    high = code_digest(functools.partial(pipe.Trainer(903).train_lr, lr=1))
    assert explain_code_drift(low, high) == [
        "code: Trainer.<self> changed (a field's value: scale), the object of Trainer.train_lr"
    ]


METACLASS_EQ = """\
RAN = []


class Meta(type):
    def __eq__(cls, other):
        RAN.append("__eq__")
        return NotImplemented

    __hash__ = type.__hash__


class Obj(metaclass=Meta):
    pass


ITEMS = [Obj()]


class Trainer:
    def __init__(self):
        self.x = Obj()

    def train(self, out_path):
        return [self.x, ITEMS]
"""


def test_round5_a_metaclass_eq_never_runs_while_digesting(project: Project) -> None:
    """Types are compared by identity: ``type(x) in (dict, list)`` would ask a user
    metaclass's ``__eq__`` first."""
    pipe = project.load(pipe=METACLASS_EQ)["pipe"]
    code = code_digest(pipe.Trainer().train)
    assert "Trainer.<self x>" in str(code.unseen) and pipe.RAN == []


def test_code_imported_before_an_edit_fails_the_check(project: Project) -> None:
    """A process that keeps running (a Dask worker) checked the code it imported, then the
    file was edited in place, keeping every definition where it was: the digest read the new
    file, matched the driver's new code and let the old code run. A file changed since this
    process first checked it is a change; one whose definition moved away is too."""
    from marin.execution.errors import CodeChangedError

    source = "def train(x):\n    return x + 1\n"
    pipe = project.load(pipe=source)["pipe"]  # the worker's import
    check_code(
        pipe.train, expected=expected_code("p@v1", code_digest(pipe.train)), where="Dask worker"
    )
    edited = source.replace("x + 1", "x + 2")
    Path(pipe.__file__).write_text(edited)
    expected = expected_code("p@v1", code_digest(project.load(pipe=edited)["pipe"].train))
    with pytest.raises(CodeChangedError, match=r"the Dask worker runs other code .*train changed"):
        check_code(pipe.train, expected=expected, where="Dask worker")
    moved = project.load(pipe=source)["pipe"]  # never checked; its def moves down a line
    Path(moved.__file__).write_text("\n" + edited)
    expected = expected_code("p@v1", code_digest(project.load(pipe="\n" + edited)["pipe"].train))
    with pytest.raises(CodeChangedError, match=r"train changed"):
        check_code(moved.train, expected=expected, where="Dask worker")
