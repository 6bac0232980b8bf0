"""The generated pipelines: a small model of one, its edits, and its source file.

A :class:`PipelineModel` is plain, hashable data: 5-8 steps in a chain, a diamond, a fan-in or
a random DAG. :func:`render` writes it as a real Python file (the target ``pipeline``), so a
code edit is a real source edit that the code digest sees. Every step's ``fn`` calls one helper,
``_work``, written into the file: a deterministic function of the step's config ``k``, its code
revision ``REV_<step>`` (held in one of ``REV_SHAPES``: the digest covers each), the type of
the one key of its config's ``keyed`` dict (``StepModel.key``) and its inputs' bytes. It writes
``data.txt`` and a few files under ``parts/``, returns a small JSON value, and works in three
chunks with a
checkpoint after each when ``current_context().checkpoint_path`` is set (a resumable step), so
resuming a checkpoint made from other inputs gives other bytes. Outside the prefix it appends
its start to ``$ORACLE_COUNTER`` and obeys ``$ORACLE_CONTROL``: ``fail-<step>`` makes it raise
after its first checkpoint, ``hold-<step>`` (holding a token) makes it write
``started-<token>`` (its pid) there and wait for ``release-<token>``. A gang's rank K > 0 obeys
``hold-<step>-rK`` the same way, and ``fail-<step>-rK`` (holding a token) once: it takes the
file, waits for ``go-<token>`` and raises.

``note`` (a config field the output ignores) and ``pad`` (a statement that changes the code but
not the output) are the edits that change a recipe without changing its bytes; ``key`` (the
type of the ``keyed`` dict's key: ``0``, ``"0"``, ``0.0``, ``False``...) changes the bytes
but not the key's text (``0`` and ``"0"``: red team round 16, finding 1) or its equality
(``0 == 0.0 == False``).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import os
from dataclasses import dataclass
from typing import Any

NAME_PREFIX = "o"
"""Step names are ``o/s0``, ``o/s1``...: short, and the same in every history."""


@dataclass(frozen=True)
class StepModel:
    """One step: its inputs, its config and code revision, and its placement options."""

    idx: int
    deps: tuple[int, ...]
    k: int = 1
    note: int = 0
    key: str = "0"
    """The key of the config's ``keyed`` dict, as Python source (``0``, ``'0'``, ``0.0``,
    ``False``...; ``KEY_EDITS``): text, as the keys themselves compare and hash alike."""
    version: int = 1
    rev: int = 0
    pad: int = 0
    remote: bool = False
    resumable: bool = False
    user_scope: bool = False
    deferred: bool = False
    ranks: int = 1
    """A remote step's gang (``with_options(ranks=N)``): rank 0 builds, the others return."""
    retries: int = 0
    max_preemptions: int | None = None
    """``with_options(max_preemptions=N)``; None: the default budget."""

    @property
    def name(self) -> str:
        return f"{NAME_PREFIX}/s{self.idx}"

    @property
    def short(self) -> str:
        return f"s{self.idx}"


KEY_EDITS: dict[str, tuple[str, ...]] = {
    "0": ("'0'", "0.0", "False"),
    "'0'": ("0",),
    "0.0": ("'0.0'", "0", "False"),
    "'0.0'": ("0.0",),
    "False": ("'False'", "0", "0.0"),
    "'False'": ("False",),
}
"""What a key-type edit may make of a step's ``key``: a key of another type that prints alike
(first: red team round 16, finding 1 gave ``{0: x}`` and ``{"0": x}`` one fingerprint), or
that compares alike (``0 == 0.0 == False``: one dict key in Python)."""


def config(s: StepModel, note: int | None = None) -> dict[str, Any]:
    """Step ``s``'s config as its ``fn`` gets it (``note``: instead of its own); the pipeline
    file spells it as this dict's ``repr``, so both keep the key's type."""
    return {"k": s.k, "note": s.note if note is None else note, "keyed": {key_value(s.key): 1}}


def key_value(key: str) -> Any:
    """The key ``StepModel.key`` spells."""
    return ast.literal_eval(key)


def feed_config(k: int) -> dict[str, Any]:
    """The feeder's config (``Adoption.feed_k``)."""
    return {"k": k, "note": 0, "keyed": {0: 1}}


SHAPES_ADOPTED = ("outside", "in-place", "in-build")
"""Where an adopted step's data is (``Adoption.shape``): a folder outside the prefix, the
step's own output path ``<prefix>/o/s<N>/v1`` (adopted in place), or in the feeder's build."""

SUBS = ("", "/parts", "/data.txt")
"""What of the feeder's build ``o/feed/v1`` an ``in-build`` adoption reads: all of it, a
sub-folder, or one file."""


@dataclass(frozen=True)
class Adoption:
    """One step that is ``ArtifactStep.adopt(name, version, source)`` of existing data
    (docs/marin.md, the adopt row): user data the history writes before its first run
    (``outside``, ``in-place``), or part of the build of another pipeline's step, the feeder
    (``in-build``). ``built``: the step is a built step of the same name@version instead."""

    step: int
    shape: str
    sub: str = ""
    data_rev: int = 0
    """The user data's revision: each hand edit of its bytes adds one."""
    feed_k: int = 1
    """The feeder's config ``k`` (its bytes)."""
    built: bool = False

    @property
    def user_data(self) -> bool:
        """Whether the data is the user's (never Marin's to change or delete)."""
        return self.shape != "in-build"

    def source(self) -> str:
        """The ``source`` the pipeline file passes to ``adopt`` (a Python expression)."""
        if self.shape == "outside":
            return f'os.path.join(os.environ["ORACLE_OUTSIDE"], "s{self.step}")'
        if self.shape == "in-place":
            return f'"{NAME_PREFIX}/s{self.step}/v1"'
        return f'"{FEED}/v1{self.sub}"'


FEED = f"{NAME_PREFIX}/feed"
"""The feeder step's name: another pipeline's (the target ``feeder``), built before the first run
of a history whose adoption lies in its build."""


def user_data_files(idx: int, rev: int) -> dict[str, bytes]:
    """The files of step ``idx``'s adopted user data at revision ``rev`` (a hand edit changes a
    file's bytes, and adds or removes another)."""
    files = {
        "data.txt": f"user data of s{idx}, revision {rev}\n".encode(),
        "more/a.bin": hashlib.sha256(f"a{idx}|{rev}".encode()).digest(),
    }
    if rev % 2:
        files["more/b.bin"] = hashlib.sha256(f"b{idx}|{rev}".encode()).digest()
    return files


def write_files(where: str, files: dict[str, bytes]) -> None:
    """Make the folder ``where`` hold exactly ``files`` (relative path -> bytes)."""
    for folder, _, names in os.walk(where):
        for name in names:
            if os.path.relpath(os.path.join(folder, name), where) not in files:
                os.remove(os.path.join(folder, name))
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(where, rel)), exist_ok=True)
        with open(os.path.join(where, rel), "wb") as f:
            f.write(data)


@dataclass(frozen=True)
class PipelineModel:
    """The pipeline a history runs: its steps, in an order where inputs come first, and the
    step that is an adoption, if any."""

    steps: tuple[StepModel, ...]
    adoption: Adoption | None = None

    @property
    def targets(self) -> tuple[int, ...]:
        """The sinks (no step reads them): the file's ``pipeline`` list."""
        read = {d for s in self.steps for d in s.deps}
        return tuple(s.idx for s in self.steps if s.idx not in read)

    @property
    def deferred(self) -> bool:
        return any(s.deferred for s in self.steps)

    def step(self, idx: int) -> StepModel:
        return self.steps[idx]

    def replace(self, idx: int, **changes: int | bool | str) -> PipelineModel:
        steps = list(self.steps)
        steps[idx] = dataclasses.replace(steps[idx], **changes)  # type: ignore[arg-type]
        return dataclasses.replace(self, steps=tuple(steps))

    def adopted(self, idx: int) -> bool:
        """Whether step ``idx`` is an adoption now (not turned into a built step)."""
        a = self.adoption
        return a is not None and a.step == idx and not a.built

    def with_adoption(self, **changes: int | bool | str) -> PipelineModel:
        assert self.adoption is not None
        return dataclasses.replace(
            self,
            adoption=dataclasses.replace(self.adoption, **changes),  # type: ignore[arg-type]
        )

    def content_key(self) -> tuple[object, ...]:
        """What a clean build's bytes depend on: the graph, each ``k``, ``key`` and ``REV``,
        and the adoption (its shape, its data's revision, the feeder's ``k``)."""
        return (tuple((s.idx, s.deps, s.k, s.key, s.rev) for s in self.steps), self.adoption)

    def readers(self, idx: int) -> list[int]:
        return [s.idx for s in self.steps if idx in s.deps]

    def upstream(self, idx: int) -> set[int]:
        """Every step ``idx`` reads, transitively."""
        seen: set[int] = set()
        todo = list(self.steps[idx].deps)
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo.extend(self.steps[d].deps)
        return seen


SHAPES = ("chain", "diamond", "fan-in", "random")


def shaped_deps(shape: str, n: int, pick: list[int]) -> list[tuple[int, ...]]:
    """The inputs of each of ``n`` steps; ``pick`` feeds the random shape's choices."""
    if shape == "chain":
        return [()] + [(i - 1,) for i in range(1, n)]
    if shape == "diamond":  # 0 -> (1, 2) -> 3 -> (4, 5) -> 6 ...
        deps: list[tuple[int, ...]] = [()]
        for i in range(1, n):
            apex = (i - 1) // 3 * 3
            deps.append((apex,) if i % 3 else (i - 2, i - 1))
        return deps
    if shape == "fan-in":  # roots, one step reading them all, then a short tail
        roots = max(2, n - 3)
        return [()] * roots + [tuple(range(roots))] + [(i - 1,) for i in range(roots + 1, n)]
    out: list[tuple[int, ...]] = [()]
    for i in range(1, n):
        a = pick[2 * i] % i
        b = pick[2 * i + 1] % (i + 1)  # == i: only one input
        out.append(tuple(sorted({a, b} if b < i else {a})))
    return out


# --- the source file -------------------------------------------------------------------------

HEADER = """\"\"\"A pipeline generated by tests/oracle (a random history's current state).\"\"\"

import configparser
import hashlib
import json
import os
import time

from marin.execution.lazy import DEFER, OUT, ArtifactStep, apply, current_context


def _const(v):
    return lambda: v


def _table():
    return {}


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def _control(name):
    ctl = os.environ.get("ORACLE_CONTROL")
    if not ctl:
        return
    if os.path.exists(os.path.join(ctl, "fail-" + name)):
        raise RuntimeError(name + ": injected failure after a checkpoint")
    _hold(ctl, name)


def _rank_control(name, rank):
    ctl = os.environ.get("ORACLE_CONTROL")
    if not ctl:
        return
    key = "%s-r%d" % (name, rank)
    fail = os.path.join(ctl, "fail-" + key)
    try:
        os.rename(fail, fail + ".taken")  # once: a retry's gang does not fail again
    except FileNotFoundError:
        return _hold(ctl, key)
    with open(fail + ".taken") as f:
        go = os.path.join(ctl, "go-" + f.read().strip())
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    raise RuntimeError(key + ": injected failure of one rank")


def _hold(ctl, name):
    try:
        with open(os.path.join(ctl, "hold-" + name)) as f:
            token = f.read().strip()
    except FileNotFoundError:
        return
    _write(os.path.join(ctl, "started-" + token), str(os.getpid()))
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(ctl, "release-" + token)):
        if time.monotonic() > deadline:
            raise RuntimeError(name + ": never released")
        time.sleep(0.02)


def _work(name, out, cfg, rev, ins):
    if current_context().rank:
        _rank_control(name, current_context().rank)
        return None  # a gang's other ranks: rank 0 builds, and its value is the step's
    blob = bytearray()
    for path in ins:
        if os.path.isfile(path):  # an adopted file
            with open(path, "rb") as f:
                blob += b"\\0" + f.read() + b"\\0"
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for file in sorted(files):
                with open(os.path.join(root, file), "rb") as f:
                    data = f.read()
                rel = os.path.relpath(os.path.join(root, file), path)
                blob += rel.encode() + b"\\0" + data + b"\\0"
    key = type(next(iter(cfg["keyed"]))).__name__  # {0: 1} and {"0": 1}: other bytes
    if os.environ.get("ORACLE_COUNTER"):
        line = {"run": os.environ.get("ORACLE_RUN", ""), "step": name, "pid": os.getpid(),
                "recipe": "%s|%s|%s|%s" % (cfg["k"], key, rev,
                                           hashlib.sha256(blob).hexdigest()[:16])}
        fd = os.open(os.environ["ORACLE_COUNTER"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, (json.dumps(line, sort_keys=True) + "\\n").encode())
        os.close(fd)
    os.makedirs(out, exist_ok=True)
    _write(os.path.join(out, "partial.txt"), "in progress")
    ckpt = current_context().checkpoint_path
    state = {"done": 0, "acc": []}
    if ckpt is not None and os.path.exists(os.path.join(ckpt, "state.json")):
        with open(os.path.join(ckpt, "state.json")) as f:
            state = json.load(f)
    third = (len(blob) + 2) // 3
    for i in range(state["done"], 3):
        salt = "%s|%s|%s|%s|%s|" % (name, cfg["k"], key, rev, i)
        state["acc"].append(hashlib.sha256(salt.encode() + blob[i * third:(i + 1) * third])
                            .hexdigest()[:16])
        state["done"] = i + 1
        if ckpt is not None:
            os.makedirs(ckpt, exist_ok=True)
            _write(os.path.join(ckpt, "state.json.tmp"), json.dumps(state))
            os.replace(os.path.join(ckpt, "state.json.tmp"), os.path.join(ckpt, "state.json"))
        if i == 0:
            _control(name)
    text = json.dumps({"acc": state["acc"], "k": cfg["k"], "key": key, "rev": rev, "step": name},
                      sort_keys=True)
    _write(os.path.join(out, "data.txt"), text)
    os.makedirs(os.path.join(out, "parts"), exist_ok=True)
    for j in range(1 + cfg["k"] % 3):
        _write(os.path.join(out, "parts", "p%d.bin" % j),
               hashlib.sha256((text + str(j)).encode()).digest())
    os.remove(os.path.join(out, "partial.txt"))
    return {"step": name, "sum": hashlib.sha256(text.encode()).hexdigest()[:12]}
"""


REV_SHAPES = ("constant", "filled", "configured", "closure")
"""How a step's code holds its ``REV`` (by its index): a literal, a table a function fills from
its argument (red team r37-2), a library object a module-level call configures (r47-1), a
closure a factory makes: an edit of ``REV`` is code drift in each, the code digest's shapes
the histories meet."""


def _rev_source(s: StepModel) -> tuple[str, str]:
    """The statements binding step ``s``'s ``REV`` and the expression reading it."""
    name, rev = f"REV_{s.short}", s.rev
    shape = REV_SHAPES[s.idx % len(REV_SHAPES)]
    if shape == "filled":
        setter = f"def _set_{s.short}(v):\n    {name}['rev'] = v\n\n\n"
        return f"{name} = _table()\n\n\n{setter}_set_{s.short}({rev})\n\n", f"{name}['rev']"
    if shape == "configured":
        made = f"{name} = configparser.ConfigParser()\n"
        return f'{made}{name}.read_string("[r]\\nv = {rev}\\n")\n\n', f'int({name}["r"]["v"])'
    if shape == "closure":
        return f"{name} = _const({rev})\n\n", f"{name}()"
    return f"{name} = {rev}\n\n", name


def _step_source(s: StepModel, placement: bool) -> str:
    pad = f"    _pad = {s.pad}\n" if s.pad else ""
    version = "DEFER" if s.deferred and placement else f'"v{s.version if placement else 1}"'
    ins = ", ".join(f"s{d}" for d in s.deps)
    cfg = repr(config(s))
    rev, read = _rev_source(s)
    lines = [
        rev,
        f"def f_{s.short}(out, cfg, ins):\n{pad}"
        f'    return _work("{s.short}", out, cfg, {read}, ins)\n\n',
        f's{s.idx} = apply("{s.name}", f_{s.short}, version={version}, out=OUT, cfg={cfg}, '
        f"ins=[{ins}])\n",
    ]
    options = []
    if placement and s.remote:
        options.append('remote="local"')
    if placement and s.remote and s.ranks > 1:
        options.append(f"ranks={s.ranks}")
    if placement and s.remote and s.retries:
        options.append(f"retries={s.retries}")
    if placement and s.remote and s.max_preemptions is not None:
        options.append(f"max_preemptions={s.max_preemptions}")
    if placement and s.resumable:
        options.append("resumable=True")
    if placement and s.user_scope:
        options.append('scope="user"')
    if options:
        lines.append(f"s{s.idx} = s{s.idx}.with_options({', '.join(options)})\n")
    return f"# --- {s.short} ---\n" + "".join(lines) + f"# --- end {s.short} ---\n\n\n"


def _adopted_source(s: StepModel, a: Adoption) -> str:
    """An adopted step's block: ``ArtifactStep.adopt`` of its data, its config recorded."""
    cfg = repr(config(s))
    return (
        f"# --- {s.short} ---\n"
        f"REV_{s.short} = {s.rev}\n\n"
        f's{s.idx} = ArtifactStep.adopt("{s.name}", "v{s.version}", {a.source()}, config={cfg})\n'
        f"# --- end {s.short} ---\n\n\n"
    )


def _feeder_source(a: Adoption) -> str:
    """The feeder: another pipeline's step (target ``feeder``) whose build the adoption reads."""
    return (
        f"# --- feed ---\nREV_feed = 0\n\n\n"
        f"def f_feed(out, cfg, ins):\n"
        f'    return _work("feed", out, cfg, REV_feed, ins)\n\n\n'
        f'feed = apply("{FEED}", f_feed, version="v1", out=OUT, cfg={feed_config(a.feed_k)!r}, '
        f"ins=[])\nfeeder = [feed]\n# --- end feed ---\n\n\n"
    )


def render(model: PipelineModel, placement: bool = True) -> str:
    """The pipeline file. ``placement=False`` (the oracle's copy) leaves out what is not
    identity and cannot change bytes: remote, ranks, resumable, scope, notes, pads and
    versions (and an adoption: the oracle places adopted data itself)."""
    a = model.adoption
    if not placement:
        model = PipelineModel(
            tuple(dataclasses.replace(s, note=0, pad=0, version=1) for s in model.steps)
        )
    feeder = _feeder_source(a) if a is not None and a.shape == "in-build" else ""
    body = "".join(
        _adopted_source(s, a) if a is not None and model.adopted(s.idx)
        else _step_source(s, placement)
        for s in model.steps
    )  # fmt: skip
    targets = ", ".join(f"s{t}" for t in model.targets)
    tail = f"pipeline = [{targets}]\n" + (TEAMMATE if placement else "")
    return HEADER + "\n\n" + feeder + body + tail


TEAMMATE = """

def f_teammate(out):
    return None


teammate = [apply("teammate/other", f_teammate, version="v1", out=OUT)]
"""
"""A teammate's pipeline, in the same file (target ``:teammate``): the gc operation's other
target, which serves nothing of the history's pipeline (``ops.Gc.teammate``)."""


def source_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]
