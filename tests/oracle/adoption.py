"""Adoptions in random histories: ``ArtifactStep.adopt`` of existing data, with readers.

A history may make one root step of its pipeline an adoption (``pipeline.Adoption``) of:
user data outside the prefix (``outside``), user data the history puts at the step's own
output path before adopting it (``in-place``), or part or all of the build of another
pipeline's step, the feeder (``in-build``: ``o/feed/v1``, a sub-folder or a file of it).
:func:`adopt` turns a generated history into one (drawn last, so a history without an
adoption is drawn exactly as before) and inserts its operations: the user edits the data by
hand; the adoption is turned into a built step of the same name@version and back; its record
is torn or deleted; it or the feeder is forced; the driver is killed at a crash point of the
adoption; gc of the pipeline and of another pipeline.

What the docs promise, and the checks after every operation (beside the usual ones):

- adopted user data is never changed or deleted by a run or gc, byte for byte
  (docs/reliability.md, "Marin deletes only what it provably wrote");
- a built step of the adoption's name@version is refused (``AdoptedDataError``) while data
  adopted in place is at its path, never cleared (docs/reliability.md, the catalogue): such a
  refusal is a failed run the checker expects, no other failure is;
- a change to adopted data is not seen (docs/caching.md, early cutoff: "as any change to
  adopted data"): the adoption's record counts as an output changed by hand after its commit,
  so its readers may be served as they are (exception 3) until it is recorded again; a
  rebuild of the build its data lies in makes the adoption and its readers stale, never
  served under ``rebuild``/``rebuild`` (the usual check, against the oracle, which builds with
  the same adopted data in place).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from marin.execution import faults
from tests.oracle.checks import Violation, read_record, snapshot, step_index
from tests.oracle.choose import Chooser
from tests.oracle.ops import (
    Crash,
    EditConfig,
    Gc,
    Op,
    Run,
    RunOpts,
    Stream,
    draw_context,
)
from tests.oracle.pipeline import (
    FEED,
    NAME_PREFIX,
    SHAPES_ADOPTED,
    SUBS,
    Adoption,
    PipelineModel,
)
from tests.oracle.world import Context

if TYPE_CHECKING:
    from tests.oracle.executor import Executor
    from tests.oracle.history import History


# --- operations ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EditAdopted(Op):
    """The user edits the adopted data by hand (its next revision: a file's bytes change,
    another appears or goes). What was recorded from it counts as changed by hand."""

    name: ClassVar[str] = "edit-adopted"

    def execute(self, ex: Executor) -> None:
        world = ex.world
        a = world.model.adoption
        if a is None or not a.user_data or world.data_path is None:
            return
        world.model = world.model.with_adoption(data_rev=a.data_rev + 1)
        files = world.write_user_data(a.data_rev + 1)
        ex.event("data-edited")
        ex.script.emit(f"put_data({_data_expr(world.model.adoption)}, {files!r})  # by hand")
        for record in adoption_records(world.prefix, a.step):
            world.hand.outputs.add(str(record.get("build_id")))


@dataclass(frozen=True)
class ToggleAdoption(Op):
    """The adoption becomes a built step of the same name@version (``apply``), or back."""

    name: ClassVar[str] = "toggle-adoption"

    def execute(self, ex: Executor) -> None:
        a = ex.world.model.adoption
        if a is None:
            return
        model = ex.world.model.with_adoption(built=not a.built)
        ex.world.write_pipeline(model)
        ex.script.rewrite(model)


@dataclass(frozen=True)
class TearAdoption(Op):
    """Tear (half its bytes) or delete the adoption's record where the last context's plan
    places it (an adoption in place keeps its ``adopted.json``)."""

    name: ClassVar[str] = "tear-adoption"
    delete: bool

    def execute(self, ex: Executor) -> None:
        a = ex.world.model.adoption
        found = ex.pick_built(0, only=a.step) if a is not None else None
        if found is None or not (read_record(found["output_path"]) or {}).get("source"):
            return
        path = found["output_path"] + ".marin/record.json"
        rel = os.path.relpath(path, ex.world.prefix)
        if self.delete:
            os.remove(path)
            ex.script.emit(f"os.remove(os.path.join(PREFIX, {rel!r}))  # by hand")
        else:
            with open(path, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
            ex.script.emit(
                f"p = os.path.join(PREFIX, {rel!r}); data = open(p, 'rb').read()",
                "open(p, 'wb').write(data[: len(data) // 2])  # a torn record",
            )
        ex.world.hand.records.add(found["output_path"])
        ex.event("record-deleted" if self.delete else "record-torn")


@dataclass(frozen=True)
class RebuildFeed(Op):
    """``marin run <file>:feeder --force o/feed``: the build the adopted data lies in is
    rebuilt, into other bytes (``change``: its config edited first) or the same."""

    name: ClassVar[str] = "rebuild-feed"
    change: bool

    def execute(self, ex: Executor) -> None:
        a = ex.world.model.adoption
        if a is None or a.shape != "in-build":
            return
        if self.change:
            model = ex.world.model.with_adoption(feed_k=a.feed_k + 1)
            ex.world.write_pipeline(model)
            ex.script.rewrite(model)
        run_feeder(ex, ["--force", FEED])
        ex.event("feed-rebuilt")


@dataclass(frozen=True)
class GcOther(Op):
    """``marin gc`` of another pipeline, keeping nothing of this one: the feeder's (which
    keeps the feeder), or the teammate's. What it leaves is judged by the runs that follow;
    the adopted user data must stay."""

    name: ClassVar[str] = "gc-other"
    ctx: Context

    def execute(self, ex: Executor) -> None:
        world = ex.world
        a = world.model.adoption
        target = world.feeder if a is not None and a.shape == "in-build" else world.teammate
        argv = ["gc", target, "--json"]
        call = world.marin(argv, self.ctx.user)
        ex.script.emit(ex._marin_line(ex.script.var("p"), argv, self.ctx.user, call.run_id))

    def last_context(self, last: Context) -> Context:
        return last


# --- generation ------------------------------------------------------------------------------


def adopt(ch: Chooser, history: History) -> History:
    """``history`` with one root step (one with readers) made an adoption of drawn shape,
    and adoption operations inserted after its first (none if no root fits)."""
    from tests.oracle.history import History

    model = history.model
    roots = [
        s.idx
        for s in model.steps
        if not s.deps and model.readers(s.idx) and not s.deferred and not s.remote
    ]
    if not roots:
        return history
    idx = roots[ch.integer(0, len(roots) - 1)]
    shape = ch.weighted(SHAPES_ADOPTED, (2, 2, 2))
    sub = SUBS[ch.integer(0, len(SUBS) - 1)] if shape == "in-build" else ""
    model = dataclasses.replace(
        model.replace(idx, resumable=False, user_scope=False),
        adoption=Adoption(idx, shape, sub),
    )
    ops = [op for op in history.ops if not (isinstance(op, Stream) and op.step == idx)]
    for _ in range(ch.integer(2, 5)):
        at = ch.integer(1, len(ops))
        ops[at:at] = with_runs(ch, model, draw_operation(ch, model, idx))
    return History(model, tuple(ops))


def with_runs(ch: Chooser, model: PipelineModel, op: Any) -> list[Any]:
    """``op``, mostly followed by a run: after a toggle one under ``--on-drift rebuild`` most
    of the time (which builds the step, or refuses to over adopted data), and then a toggle
    back now and then (``warn`` serves the other kind's record as drift)."""
    if isinstance(op, (Run, Crash)) or not ch.boolean(0.7):
        return [op]
    run = RunOpts.draw(ch, model, op.last_context(Context()))
    if not isinstance(op, ToggleAdoption):
        return [op, Run(run)]
    if ch.boolean(0.7):
        run = dataclasses.replace(run, on_drift="rebuild")
    back = [op, Run(RunOpts.draw(ch, model, run.ctx))] if ch.boolean(0.4) else []
    return [op, Run(run), *back]


def draw_operation(ch: Chooser, model: PipelineModel, idx: int) -> Any:
    """One adoption operation (or a run, a crash, a gc, an edit aimed at the adoption)."""
    a = model.adoption
    assert a is not None
    table: dict[str, float] = {
        "edit-adopted": 4 if a.user_data else 0,
        "rebuild-feed": 4 if a.shape == "in-build" else 0,
        "toggle": 3,
        "tear": 2,
        "force": 2,
        "rebuild-run": 2,
        "crash": 1.5,
        "gc": 1.5,
        "gc-other": 1.5,
        "edit-config": 1,
    }
    kind = ch.weighted(list(table), list(table.values()))
    ctx = draw_context(ch, model, Context())
    opts = RunOpts.draw(ch, model, ctx)
    if kind == "edit-adopted":
        return EditAdopted()
    if kind == "rebuild-feed":
        return RebuildFeed(ch.boolean(0.6))
    if kind == "toggle":
        return ToggleAdoption()
    if kind == "tear":
        return TearAdoption(ch.boolean(0.5))
    if kind in ("force", "crash"):
        forced = dataclasses.replace(opts, force=(idx,))
        if kind == "crash":
            points = faults.CRASH_POINTS
            return Crash(points[ch.integer(0, len(points) - 1)], idx, forced)
        return Run(forced)
    if kind == "rebuild-run":
        return Run(dataclasses.replace(opts, on_drift="rebuild", on_code_drift="rebuild"))
    if kind == "gc":
        return Gc(ctx, ch.boolean(0.2))
    if kind == "gc-other":
        return GcOther(ctx)
    return EditConfig(idx, ch.boolean(0.5), ch.boolean(0.4))


# --- what the executor asks ----------------------------------------------------------------------


def setup(ex: Executor) -> None:
    """Before the first operation: the user data in the script (the world wrote it), and the
    feeder built (an adoption of a build that is not there fails: docs/reliability.md)."""
    a = ex.world.model.adoption
    if a is None:
        return
    if a.user_data:
        files = dict(sorted((rel, _read(ex.world.data_path, rel)) for rel in ex.world.user_data))
        ex.script.emit(f"put_data({_data_expr(a)}, {files!r})  # the user's data")
    else:
        run_feeder(ex, [])


def run_feeder(ex: Executor, flags: list[str]) -> None:
    """``marin run <file>:feeder`` (shared, as alice), which must succeed."""
    argv = ["run", ex.world.feeder, "--json", *flags]
    call = ex.world.marin(argv, "alice")
    var = ex.script.var("p")
    ex.script.emit(ex._marin_line(var, argv, "alice", call.run_id))
    if call.rc != 0:
        tail = " | ".join(call.err.strip().splitlines()[-3:])
        ex.add(
            [Violation("run-failed:other", ex.op, f"the feeder's run: exit {call.rc}: {tail}")],
            f"expect({var} is not None and {var}.returncode == 0, 'the feeder was built')",
        )


def check_user_data(ex: Executor) -> None:
    """The adopted user data is byte for byte what the history last wrote."""
    world = ex.world
    where = world.data_path
    if where is None:
        return
    now = snapshot(where)
    if now == world.user_data:
        return
    changed = sorted(
        k for k in set(now) | set(world.user_data) if now.get(k) != world.user_data.get(k)
    )
    a = world.model.adoption
    want = {k: v[:12] for k, v in world.user_data.items()}
    ex.add(
        [
            Violation(
                "adopted-data-touched",
                ex.op,
                f"the data {a.shape if a else ''} adopted by o/s{a.step if a else '?'} at "
                f"{where} changed: {changed} (deleted, rewritten or added)",
            )
        ],
        f"expect(tree({_data_expr(a)}) == {want!r}, 'the adopted data is as the user wrote it')",
    )


REFUSALS = ("AdoptedDataError", "already exists and was not written by Marin")
"""How a build of the adoption's name@version is refused over data at its output path
(docs/reliability.md, the catalogue): data adopted in place, put at an adoption's path since,
or beside its ``adopted.json``; or the user's data there before anything adopted it."""


def refused_over_adopted(report: dict[str, Any], model: PipelineModel) -> bool:
    """Whether every step the run failed is the adoption's name@version now built, refused
    over data at its output path (``REFUSALS``)."""
    a = model.adoption
    failed = [s for s in report.get("steps", []) if s.get("action") == "failed"]
    return (
        bool(failed)
        and a is not None
        and a.built
        and all(
            step_index(s) == a.step and any(r in str(s.get("reason", "")) for r in REFUSALS)
            for s in failed
        )
    )


def adoption_records(prefix: str, idx: int) -> list[dict[str, Any]]:
    """Every adoption record of step ``idx`` under ``prefix`` (any version, any user)."""
    out = []
    for folder, _, files in os.walk(prefix):
        if folder.endswith(".marin") and "record.json" in files:
            record = read_record(folder[: -len(".marin")])
            if record and record.get("name") == f"{NAME_PREFIX}/s{idx}" and record.get("source"):
                out.append(record)
    return out


def _data_expr(a: Adoption | None) -> str:
    """Where the adopted user data is, as the repro script says it."""
    if a is None or a.shape == "outside":
        return f"os.path.join(OUTSIDE, 's{a.step if a else 0}')"
    return f"os.path.join(PREFIX, '{NAME_PREFIX}/s{a.step}/v1')"


def _read(root: str | None, rel: str) -> bytes:
    assert root is not None
    with open(os.path.join(root, rel), "rb") as f:
        return f.read()
