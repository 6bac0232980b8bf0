"""The operation table: what a history does, one dataclass per operation.

Each operation is plain data (so a history can be printed, pinned, shrunk and replayed) with
three parts: ``draw`` (its arguments, from a :class:`~tests.oracle.choose.Chooser`), ``weight``
(how often the generator picks it for a pipeline; 0 where it cannot apply) and ``execute``
(what it does to a :class:`~tests.oracle.executor.Executor`, which checks after it). A new
operation (a gang step, a preemption) is one more class in :data:`OPERATIONS`.

Steps are named by index; operations that need a step in some state (a planted job on a step
the next run builds, a deleted output of a built one) take ``pick`` and choose among the steps
in that state when they run, so every drawn history stays valid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from marin.execution import faults
from tests.oracle import userdata
from tests.oracle.checks import Policy, Violation, read_record, snapshot
from tests.oracle.choose import Chooser
from tests.oracle.pipeline import KEY_EDITS, PipelineModel
from tests.oracle.world import Context

if TYPE_CHECKING:
    from tests.oracle.executor import Executor

USERS = ("alice", "bob")
POLICIES = ("warn", "rebuild", "error")
CRASH_POINTS = (*faults.CRASH_POINTS, "after-submit")
"""``MARIN_FAULT_CRASH`` points: the core's, and the remote call's ``after-submit``."""


@dataclass(frozen=True)
class RunOpts:
    """A run's options: who, where, which policies, what is forced."""

    ctx: Context = field(default_factory=Context)
    on_drift: str = "warn"
    on_code_drift: str = "warn"
    force: tuple[int, ...] = ()
    cascade: bool = True

    @property
    def policy(self) -> Policy:
        return Policy(self.on_drift, self.on_code_drift, self.cascade)

    def argv(self, deferred: bool) -> list[str]:
        out = ["--on-drift", self.on_drift, "--on-code-drift", self.on_code_drift]
        if not self.cascade:
            out.append("--no-cascade")
        for idx in self.force:
            out += ["--force", f"o/s{idx}"]
        return out + self.ctx.flags(deferred)

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> RunOpts:
        return RunOpts(
            ctx=draw_context(ch, model, last),
            on_drift=ch.weighted(POLICIES, (5, 4, 1)),
            on_code_drift=ch.weighted(POLICIES, (5, 4, 1)),
            force=(ch.integer(0, len(model.steps) - 1),) if ch.boolean(0.2) else (),
            cascade=not ch.boolean(0.08),
        )


def draw_context(ch: Chooser, model: PipelineModel, last: Context) -> Context:
    """Mostly the last context: a user switches now and then, and so do scope and versions."""
    if ch.boolean(0.75):
        return last
    deferred = [s.idx for s in model.steps if s.deferred]
    override = None
    if deferred and ch.boolean(0.3):
        override = (deferred[ch.integer(0, len(deferred) - 1)], "v7")
    return Context(
        user=ch.weighted(USERS, (2, 1)),
        scope=ch.weighted(("shared", "user"), (4, 1)),
        version=ch.weighted(("v1", "v2"), (2, 1)) if deferred else "v1",
        override=override,
    )


class Op:
    """The interface of every operation (see the module docstring)."""

    name: ClassVar[str]
    carved_from: ClassVar[str] = ""
    """The operation whose weight this one's is taken from (listed just before it in
    ``OPERATIONS``; ``history.carve``): a fixed-seed history that never draws this one is
    drawn exactly as before it existed."""

    def execute(self, ex: Executor) -> None:
        raise NotImplementedError

    def last_context(self, last: Context) -> Context:
        opts = getattr(self, "opts", None)
        return opts.ctx if isinstance(opts, RunOpts) else getattr(self, "ctx", last)


# --- edits ---------------------------------------------------------------------------------------


CONFIG_EDITS = {"k": 6, "key": 1, "note": 3}
"""What an ``EditConfig`` changes, and how often: ``k``, the type of the ``keyed`` dict's key
(listed second: a key edit takes part of the range where ``k`` edits were drawn before it
existed, so a fixed-seed history without one is drawn as it was), or the ignored ``note``."""


@dataclass(frozen=True)
class EditConfig(Op):
    """Change a step's config: its output-changing ``k`` or the ignored ``note``; or, with
    ``retype``, only the type of its ``keyed`` dict's key (``{0: 1}`` to ``{"0": 1}``,
    ``{0.0: 1}`` or ``{False: 1}``...: ``pipeline.KEY_EDITS``, the ``retype``-th modulo their
    number), which its output shows. ``bump`` also bumps its version (a deferred step's
    version is the run's: no bump)."""

    name: ClassVar[str] = "edit-config"
    step: int
    changes_output: bool
    bump: bool
    retype: int | None = None

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 12

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> EditConfig:
        step = ch.integer(0, len(model.steps) - 1)
        what = ch.weighted(list(CONFIG_EDITS), list(CONFIG_EDITS.values()))
        bump = ch.boolean(0.3)
        retype = ch.integer(0, 3) if what == "key" else None  # half: the key that prints alike
        return EditConfig(step, what != "note", bump, retype)

    def execute(self, ex: Executor) -> None:
        s = ex.world.model.step(self.step)
        changes: dict[str, Any] = {"k": s.k + 1} if self.changes_output else {"note": s.note + 1}
        if self.retype is not None:
            options = KEY_EDITS[s.key]
            changes = {"key": options[self.retype % len(options)]}
        if self.bump and not s.deferred:
            changes["version"] = s.version + 1
        ex.edit(self.step, **changes)


@dataclass(frozen=True)
class EditCode(Op):
    """Change a step's code: its ``REV`` constant (new bytes) or a statement (same bytes)."""

    name: ClassVar[str] = "edit-code"
    step: int
    changes_output: bool

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 12

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> EditCode:
        return EditCode(ch.integer(0, len(model.steps) - 1), ch.boolean(0.7))

    def execute(self, ex: Executor) -> None:
        s = ex.world.model.step(self.step)
        ex.edit(self.step, **({"rev": s.rev + 1} if self.changes_output else {"pad": s.pad + 1}))


# --- runs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run(Op):
    """``marin run --json`` with drawn options (in this process)."""

    name: ClassVar[str] = "run"
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 30

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> Run:
        return Run(RunOpts.draw(ch, model, last))

    def execute(self, ex: Executor) -> None:
        ex.run(self.opts)


@dataclass(frozen=True)
class FailRun(Op):
    """A run in which one step's attempt fails after its first checkpoint."""

    name: ClassVar[str] = "fail"
    step: int
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 12 if any(s.resumable for s in model.steps) else 4

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> FailRun:
        step = _prefer(ch, model, "resumable")
        opts = RunOpts.draw(ch, model, last)
        if ch.boolean(0.5):  # make it build now: force it
            opts = RunOpts(opts.ctx, opts.on_drift, opts.on_code_drift, (step,), opts.cascade)
        return FailRun(step, opts)

    def execute(self, ex: Executor) -> None:
        fail = ex.world.control(f"fail-s{self.step}")
        open(fail, "w").close()
        ex.script.emit(f"open(os.path.join(CONTROL, 'fail-s{self.step}'), 'w').close()")
        retried = ex.world.model.step(self.step).retries  # each attempt fails: fn starts twice
        try:
            ex.run(self.opts, injected=True, twice=frozenset({f"s{self.step}"} if retried else ()))
        finally:
            os.remove(fail)
            ex.script.emit(f"os.remove(os.path.join(CONTROL, 'fail-s{self.step}'))")


@dataclass(frozen=True)
class KillDriver(Op):
    """SIGKILL a driver once a step's fn has started (and holds, after its first checkpoint).
    Its remote job lives on: released before the next run, while it waits, or killed."""

    name: ClassVar[str] = "kill-driver"
    step: int
    release: str
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 5 if any(s.remote for s in model.steps) else 2

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> KillDriver:
        step = _prefer(ch, model, "remote")
        release = ch.weighted(("before", "during", "kill"), (1, 2, 1))
        return KillDriver(step, release, RunOpts.draw(ch, model, last))

    def execute(self, ex: Executor) -> None:
        ex.kill_driver(self.step, self.release, self.opts)


@dataclass(frozen=True)
class Preempt(Op):
    """SIGKILL a remote step's job (a gang's rank 0) once its fn started, after its first
    checkpoint: the job is lost, not failed; the same run submits it again (a resumable step
    resumes) and ends as if nothing happened, its fn started at most twice."""

    name: ClassVar[str] = "preempt"
    step: int
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 6 if any(s.remote for s in model.steps) else 0

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> Preempt:
        remote = [s.idx for s in model.steps if s.remote]
        step = remote[ch.integer(0, len(remote) - 1)] if remote else 0
        opts = RunOpts.draw(ch, model, last)
        if ch.boolean(0.7):  # make it build now: force it
            opts = RunOpts(opts.ctx, opts.on_drift, opts.on_code_drift, (step,), opts.cascade)
        return Preempt(step, opts)

    def execute(self, ex: Executor) -> None:
        ex.preempt(self.step, self.opts)


@dataclass(frozen=True)
class PreemptPastBudget(Op):
    """Preempt (as ``Preempt``) a remote step given ``max_preemptions=0`` for this one run:
    past its budget, the step fails, the run never reports success and nothing is committed
    (docs/remote.md, "Preemption is not failure"). The budget is restored after."""

    name: ClassVar[str] = "preempt-past-budget"
    step: int
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 2 if any(s.remote for s in model.steps) else 0

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> PreemptPastBudget:
        p = Preempt.draw(ch, model, last)  # forced: the build it is about happens now
        return PreemptPastBudget(p.step, replace(p.opts, force=(p.step,)))

    def execute(self, ex: Executor) -> None:
        budget = ex.world.model.step(self.step).max_preemptions
        ex.edit(self.step, max_preemptions=0)
        try:
            ex.preempt(self.step, self.opts)
        finally:
            ex.edit(self.step, max_preemptions=budget)


@dataclass(frozen=True)
class RankFail(Op):
    """A gang's rank 1 raises while rank 0 runs (held): the gang fails as one, every rank
    ends, ``retries`` counts it (never ``max_preemptions``) and nothing is committed; with
    ``retries`` one new gang builds the step (docs/remote.md, "Gang steps")."""

    name: ClassVar[str] = "rank-fail"
    step: int
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 4 if any(s.ranks > 1 for s in model.steps) else 0

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> RankFail:
        gangs = [s.idx for s in model.steps if s.ranks > 1] or [0]
        step = gangs[ch.integer(0, len(gangs) - 1)]
        opts = RunOpts.draw(ch, model, last)
        if ch.boolean(0.7):  # make it build now: force it
            opts = RunOpts(opts.ctx, opts.on_drift, opts.on_code_drift, (step,), opts.cascade)
        return RankFail(step, opts)

    def execute(self, ex: Executor) -> None:
        from tests.oracle.gangs import rank_fail

        rank_fail(ex, self.step, self.opts)


@dataclass(frozen=True)
class LeaseLost(Op):
    """A driver whose heartbeat stalls (``MARIN_LEASE_TTL=1``) while a gang's ranks run
    (held); a second driver takes the lease over and reattaches; the first wakes, finds its
    lease lost, cancels its gang (every rank ends) and commits nothing; the new holder builds
    the step once (docs/remote.md, "Who keeps the lease alive")."""

    name: ClassVar[str] = "lease-lost"
    step: int
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 3 if any(s.ranks > 1 for s in model.steps) else 0

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> LeaseLost:
        r = RankFail.draw(ch, model, last)
        return LeaseLost(r.step, r.opts)

    def execute(self, ex: Executor) -> None:
        from tests.oracle.gangs import lease_lost

        lease_lost(ex, self.step, self.opts)


@dataclass(frozen=True)
class Crash(Op):
    """A driver that SIGKILLs itself at a ``MARIN_FAULT_CRASH`` point of one step's build."""

    name: ClassVar[str] = "crash"
    point: str
    step: int
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 3

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> Crash:
        point = CRASH_POINTS[ch.integer(0, len(CRASH_POINTS) - 1)]
        return Crash(point, ch.integer(0, len(model.steps) - 1), RunOpts.draw(ch, model, last))

    def execute(self, ex: Executor) -> None:
        ex.run(
            self.opts, subprocess_=True, extra={"MARIN_FAULT_CRASH": f"{self.point}@o/s{self.step}"}
        )


@dataclass(frozen=True)
class TwoDrivers(Op):
    """Two ``marin run`` processes with the same options, at once."""

    name: ClassVar[str] = "two-drivers"
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 2

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> TwoDrivers:
        opts = RunOpts.draw(ch, model, last)  # no --force: a second forced build is allowed
        return TwoDrivers(RunOpts(opts.ctx, opts.on_drift, opts.on_code_drift, (), opts.cascade))

    def execute(self, ex: Executor) -> None:
        ex.two_drivers(self.opts)


@dataclass(frozen=True)
class Stream(Op):
    """A sweep: ``StepRunner.run`` over a generator yielding the pipeline's targets, then
    configs of one step (``k`` + delta, its ``note`` and key as they are), each at a new
    version or not (a forgotten bump)."""

    name: ClassVar[str] = "stream"
    step: int
    variants: tuple[tuple[int, bool], ...]
    opts: RunOpts

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 3 if any(not s.user_scope for s in model.steps) else 0

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> Stream:
        shared = [s.idx for s in model.steps if not s.user_scope]
        step = shared[ch.integer(0, len(shared) - 1)]
        variants = tuple((ch.integer(0, 2), ch.boolean(0.4)) for _ in range(ch.integer(1, 3)))
        opts = RunOpts.draw(ch, model, last)
        ctx = Context(opts.ctx.user, "shared", opts.ctx.version, opts.ctx.override)
        return Stream(step, variants, RunOpts(ctx, opts.on_drift, opts.on_code_drift))

    def execute(self, ex: Executor) -> None:
        ex.stream(self.step, self.variants, self.opts)


# --- storage -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PutUserData(Op):
    """A user's file by hand at the output path of a step with nothing there yet, beside a
    metadata folder no attempt left (``shape``: empty, the lease's guard only, an empty
    ``checkpoints/`` only): a build there is refused, and no run or gc may touch it
    (``userdata``; red team round 17, finding 2)."""

    name: ClassVar[str] = "user-data"
    carved_from: ClassVar[str] = "run"
    shape: str
    pick: int

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 1

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> PutUserData:
        return PutUserData(
            userdata.SHAPES[ch.integer(0, len(userdata.SHAPES) - 1)], ch.integer(0, 99)
        )

    def execute(self, ex: Executor) -> None:
        userdata.put(ex, self.shape, self.pick)


@dataclass(frozen=True)
class MoveUserData(Op):
    """The user moves the data a build was refused over out of the prefix, by hand (as the
    refusal says): the step then builds normally (``userdata``)."""

    name: ClassVar[str] = "move-user-data"
    carved_from: ClassVar[str] = "run"
    pick: int

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 0.5

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> MoveUserData:
        return MoveUserData(ch.integer(0, 99))

    def execute(self, ex: Executor) -> None:
        userdata.move(ex, self.pick)


@dataclass(frozen=True)
class Gc(Op):
    """``marin gc TARGET --json`` as a user (with ``--scope``/``--version``/``--override``
    where gc takes them), or ``--dry-run``; or (``teammate``) a teammate's gc of another
    pipeline with ``--keep-versions 1`` (``--all-users --scope user`` in a user-scope
    context), which keeps each name's newest build and what it was made from, and may
    collect the rest (red team round 2, finding 3: the leftovers of a killed rebuild)."""

    name: ClassVar[str] = "gc"
    ctx: Context
    dry_run: bool
    teammate: bool = False

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 6

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> Gc:
        return Gc(draw_context(ch, model, last), ch.boolean(0.2), ch.boolean(0.3))

    def execute(self, ex: Executor) -> None:
        ex.gc(self.ctx, self.dry_run, self.teammate)


PLANT_KINDS = {"decoy": 2, "result": 2, "no-workdir": 2, "torn-job": 1.5, "decoy-fp": 1}
"""A foreign ``job.json`` naming a decoy process (without a fingerprint, or with the step's:
a run may wait for it until its bounded subprocess is killed, so that one is rarer), a
``result.pkl`` whose unpickling makes a marker file, a ``job.json`` without ``workdir`` (its
job folder, with a result, under ``$MARIN_LOCAL_JOBS``), and a torn ``job.json``."""


@dataclass(frozen=True)
class Plant(Op):
    """Plant job files in the metadata folder of a step the next run builds (else any)."""

    name: ClassVar[str] = "plant"
    kind: str
    pick: int

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 3

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> Plant:
        return Plant(ch.weighted(list(PLANT_KINDS), list(PLANT_KINDS.values())), ch.integer(0, 99))

    def execute(self, ex: Executor) -> None:
        ex.plant(self.kind, self.pick)


@dataclass(frozen=True)
class DeleteOutput(Op):
    """Delete a built step's output folder by hand (its record stays)."""

    name: ClassVar[str] = "delete-output"
    pick: int

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 3

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> DeleteOutput:
        return DeleteOutput(ch.integer(0, 99))

    def execute(self, ex: Executor) -> None:
        step = ex.pick_built(self.pick, adopted=False)  # adopted data is the user's
        if step is None:
            return
        shutil.rmtree(step["output_path"], ignore_errors=True)
        ex.world.hand.outputs.add(str(step["build_id"]))
        rel = os.path.relpath(step["output_path"], ex.world.prefix)
        ex.script.emit(f"shutil.rmtree(os.path.join(PREFIX, {rel!r}))  # by hand")


@dataclass(frozen=True)
class TearRecord(Op):
    """Truncate a built step's ``record.json`` to half its bytes."""

    name: ClassVar[str] = "tear-record"
    pick: int

    @staticmethod
    def weight(model: PipelineModel) -> float:
        return 2

    @staticmethod
    def draw(ch: Chooser, model: PipelineModel, last: Context) -> TearRecord:
        return TearRecord(ch.integer(0, 99))

    def execute(self, ex: Executor) -> None:
        step = ex.pick_built(self.pick)
        if step is None:
            return
        path = step["output_path"] + ".marin/record.json"
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
        ex.world.hand.records.add(step["output_path"])
        userdata.record_torn(ex, step["output_path"])
        rel = os.path.relpath(path, ex.world.prefix)
        ex.script.emit(
            f"p = os.path.join(PREFIX, {rel!r}); data = open(p, 'rb').read()",
            "open(p, 'wb').write(data[: len(data) // 2])  # a torn record",
        )


OPERATIONS: tuple[type[Any], ...] = (
    Run,
    PutUserData,
    MoveUserData,
    EditConfig,
    EditCode,
    FailRun,
    KillDriver,
    Crash,
    TwoDrivers,
    Stream,
    Gc,
    Plant,
    DeleteOutput,
    TearRecord,
)
"""Every operation, simplest first (hypothesis shrinks toward the first); an operation whose
weight is carved from another's (``Op.carved_from``) right after it."""

OPENERS: dict[str, float] = {
    "run": 7.5,
    "user-data": 0.5,  # carved from "run"'s 8 (see ``Op.carved_from``)
    "fail": 2,
    "kill-driver": 2,
    "crash": 1,
    "plant": 1.5,
    "preempt": 2,
}
"""The first operation: a first build, one that fails or is killed, or storage planted (job
files, or a user's data beside a metadata folder no attempt left) before anything is built
(then a first build follows: ``BUILT_AFTER``)."""

BUILT_AFTER = ("plant", "user-data")
"""The openers a first build follows."""

ENGINE_OPERATIONS: tuple[type[Any], ...] = (
    Run,
    EditConfig,
    EditCode,
    FailRun,
    Gc,
    DeleteOutput,
    TearRecord,
)
"""What a history on Prefect or Airflow does: its runs are the engine's."""

GANG_OPERATIONS: tuple[type[Any], ...] = (
    Run,
    EditConfig,
    EditCode,
    FailRun,
    KillDriver,
    Preempt,
    RankFail,
    LeaseLost,
    PreemptPastBudget,
)
"""What a gang history does (``history.GANG``): runs, edits, failures, killed drivers,
preempted jobs (within and past their budget) of remote steps and gangs, a gang's rank that
raises, and a gang whose driver loses its lease."""


def _prefer(ch: Chooser, model: PipelineModel, feature: str) -> int:
    """A step with ``feature`` (resumable, remote) if there is one, most of the time."""
    having = [s.idx for s in model.steps if getattr(s, feature)]
    if having and ch.boolean(0.8):
        return having[ch.integer(0, len(having) - 1)]
    return ch.integer(0, len(model.steps) - 1)


# --- helpers the executor shares with the operations -------------------------------------------


def kill(pid: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)


def wait_for(path: str, proc: subprocess.Popen[str], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.path.exists(path)


def served_state(plan: dict[str, Any]) -> dict[str, tuple[str, dict[str, str]]]:
    """Output path -> (build id, output tree) of every step ``plan`` serves, and of the data
    a served adoption reads (the folder of an adopted file)."""
    out = {}
    for step in plan.get("steps", []):
        if step.get("action") == "skip":
            record = read_record(step["output_path"]) or {}
            out[step["output_path"]] = (str(record.get("build_id")), snapshot(step["output_path"]))
            source = record.get("source")
            if isinstance(source, str) and os.path.exists(source):  # an adoption's data
                where = source if os.path.isdir(source) else os.path.dirname(source)
                out[where] = (str((read_record(where) or {}).get("build_id")), snapshot(where))
    return out


def gc_violations(
    before: dict[str, tuple[str, dict[str, str]]], op: int, label: str
) -> list[Violation]:
    out = []
    for path, (build_id, files) in sorted(before.items()):
        record = read_record(path) or {}
        if str(record.get("build_id")) != build_id or snapshot(path) != files:
            out.append(
                Violation(
                    "gc-deleted-served",
                    op,
                    f"{label} deleted or changed {path}, "
                    f"which the current plan serves (build {build_id})",
                )
            )
    return out


def job_json(
    job_id: str, workdir: str | None, fingerprint: str, recipe: dict[str, Any] | None = None
) -> bytes:
    """A planted ``job.json`` with today's fields (``step_folder.JobRecord.to_json``); with
    ``recipe`` (``placement``, ``inputs``, ``code``: copied from the plan and the records, as
    anyone who can read the bucket can) it claims the step's very recipe."""
    data = {"workdir": workdir} if workdir else {}
    job: dict[str, Any] = {
        "job_id": job_id,
        "backend": "local",
        "build_id": "planted",
        "submitted_at": "2026-01-01T00:00:00Z",
        "fingerprint": fingerprint,
        "placement": "",
        "inputs": {},
        "data": data,
    }
    for key, value in (recipe or {}).items():
        if value:
            job[key] = value
    return json.dumps(job).encode()
