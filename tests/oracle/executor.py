"""Runs a history in its sandbox and checks after every operation.

After each operation: no planted code ran (no marker file), every decoy process lives, nothing
outside the prefix changed, no record holds a planted result, and, for every context (user,
scope, versions) the history ran under, ``marin plan --on-drift rebuild --on-code-drift rebuild
--json`` serves only clean builds (:func:`~tests.oracle.checks.check_served`). A run also has its
own report checked against the plan made just before it with the same options, and its fns
counted (at most one start per recipe). ``gc`` keeps what the plan serves and never touches
another user's folder.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from tests.oracle import adoption, sweep, userdata
from tests.oracle.checks import (
    STRICT,
    Policy,
    Stored,
    Violation,
    allowances,
    check_once,
    check_report,
    check_served,
    diff,
    differences,
    read_record,
    snapshot,
    step_index,
    stored,
)
from tests.oracle.ops import (
    USERS,
    RunOpts,
    gc_violations,
    job_json,
    kill,
    served_state,
    wait_for,
)
from tests.oracle.oracle import ORACLE, Expected
from tests.oracle.pipeline import PipelineModel, key_value
from tests.oracle.script import Script
from tests.oracle.world import Call, Context, World
from tests.ux.helpers import environ


@dataclass
class Outcome:
    """What running a history found."""

    violations: list[Violation]
    script: str
    seconds: float

    @property
    def kinds(self) -> set[str]:
        return {v.kind for v in self.violations}


@dataclass
class Executor:
    """Runs one history's operations on a :class:`World` (see the module docstring)."""

    world: World
    runner: Any = None
    """None: ``marin run`` (the CLI); else an engine runner (``tests/oracle/engines.py``)."""
    violations: list[Violation] = field(default_factory=list)
    op: int = 0
    last: Context = field(default_factory=Context)
    script: Script = field(init=False)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _dead_decoys: set[int] = field(default_factory=set)
    _sentinels: list[str] = field(default_factory=list)
    _bystander: dict[str, str] = field(default_factory=dict)
    _cut: list[int] = field(default_factory=list)
    """The script's length after each operation."""
    _checks: list[tuple[Violation, str]] = field(default_factory=list)
    """Each violation with the script line that checks it."""
    _decoy_vars: dict[int, str] = field(default_factory=dict)
    """The script's variable of each decoy process."""
    preempted: int = 0
    """Remote jobs a ``preempt`` operation SIGKILLed."""
    gang_events: dict[str, int] = field(default_factory=dict)
    """How often a gang operation happened as drawn: ``rank-fail`` (rank 1 raised while rank
    0 ran), ``lease-lost`` (a second driver took the lease of a running gang), ``past-budget``
    (a job preempted past ``max_preemptions=0``)."""

    adopt_events: dict[str, int] = field(default_factory=dict)
    """How often an adoption operation did what it is for (``adoption``): ``data-edited``,
    ``record-torn``, ``record-deleted``, ``feed-rebuilt``, ``refused`` (a build of the
    adoption's name@version refused over data at its path); and a user's data operation
    (``userdata``): ``user-data-put``, ``user-data-refused``, ``user-data-moved``,
    ``torn-record-refused`` (a torn record beside its data: that data refused, kept)."""

    def __post_init__(self) -> None:
        self.script = Script(self.world.model)
        self._bystander = snapshot(self.world.path("bystander"))

    # --- the loop ---------------------------------------------------------------------------

    def execute(self, ops: Any) -> None:
        adoption.setup(self)
        for i, op in enumerate(ops):
            self.op = i
            self.script.comment(f"op {i}: {op!r}")
            op.execute(self)
            self.last = op.last_context(self.last)
            self.after_op()
            self._cut.append(len(self.script.lines))

    def report(self, kind: str | None = None) -> str:
        """The script up to the first violation (of ``kind``), with its check."""
        wanted = [v for v in self.violations if kind is None or v.kind == kind]
        if not wanted:
            return self.script.render()
        first = wanted[0].op
        cut = Script(self.script.model, self.script.lines[: self._cut[first]])
        cut.checks = [c for v, c in self._checks if v.op == first and v in wanted]
        # what was seen comes first: a failure message shows only the start of the script
        seen = "".join(f"# {line}\n" for v in wanted for line in str(v).splitlines())
        return seen + cut.render()

    def event(self, name: str) -> None:
        self.adopt_events[name] = self.adopt_events.get(name, 0) + 1

    def add(self, violations: list[Violation], check: str | None = None) -> None:
        for v in violations:
            key = (v.kind, v.message)
            if key in self._seen:
                continue
            self._seen.add(key)
            self.violations.append(v)
            self._checks.append((v, check or f"expect(False, {v.message!r})"))

    # --- marin calls --------------------------------------------------------------------------

    def plan(self, ctx: Context, policy: Policy, force: tuple[int, ...] = ()) -> Call:
        opts = RunOpts(ctx, policy.on_drift, policy.on_code_drift, force, policy.cascade)
        argv = ["plan", self.world.target, "--json", *opts.argv(self.world.model.deferred)]
        return self.world.marin(argv, ctx.user)

    def edit(self, idx: int, **changes: Any) -> None:
        new = self.world.model.replace(idx, **changes)
        self.world.write_pipeline(new)
        self.script.edit(new, idx)

    def run(
        self,
        opts: RunOpts,
        *,
        injected: bool = False,
        subprocess_: bool = False,
        extra: dict[str, str] | None = None,
        twice: frozenset[str] = frozenset(),
    ) -> None:
        """One run of the pipeline (the CLI, or the engine), then its checks (``twice``: steps
        whose fn may start twice in it)."""
        if self.runner is not None:
            self.runner.run(self, opts, injected)
            return
        self.world.use(opts.ctx)
        pre = self.plan(opts.ctx, opts.policy, opts.force)
        self._release_held()
        argv = ["run", self.world.target, "--json", *opts.argv(self.world.model.deferred)]
        call = self.world.marin(argv, opts.ctx.user, subprocess_=subprocess_, extra=extra)
        var = self.script.var("p")
        self.script.emit(self._marin_line(var, argv, opts.ctx.user, call.run_id, extra))
        self.check_run(call, pre, opts, var, injected=injected, crash=bool(extra), twice=twice)

    def _marin_line(
        self,
        var: str,
        argv: list[str],
        user: str,
        run_id: str,
        extra: dict[str, str] | None = None,
        start: bool = False,
    ) -> str:
        names = {
            self.world.target: "TARGET",
            self.world.teammate: "TEAMMATE",
            self.world.feeder: "FEEDER",
        }
        args = ", ".join(names.get(a, repr(a)) for a in argv)
        more = "".join(f", {k}={v!r}" for k, v in (extra or {}).items())
        fn = "start" if start else "marin"
        return f"{var} = {fn}({args}, user={user!r}, run={run_id!r}{more})"

    def check_run(
        self,
        call: Call,
        pre: Call,
        opts: RunOpts,
        var: str,
        *,
        injected: bool = False,
        crash: bool = False,
        twice: frozenset[str] = frozenset(),
    ) -> None:
        planted = self.world.planted
        if call.timed_out:
            kind = "planted:run-hung" if planted else "run-hung"
            self.add(
                [
                    Violation(
                        kind,
                        self.op,
                        f"a run did not end within {call.argv[0]} timeout: {call.err[-600:]}",
                    )
                ],
                f"expect({var} is not None, 'the run ended')",
            )
            return
        report = call.json() or {}
        expected = self.expected()
        found = check_report(
            report, pre.json(), opts.policy, expected, self.world.hand, self.op, call.err
        )
        self.add(found, self._clean_check(found))
        over_adopted = adoption.refused_over_adopted(report, self.world.model)
        if over_adopted:
            self.event("refused")
        refused = refuses(pre, report, userdata.refused_steps(report, self)) or over_adopted
        ok = {0} | ({1} if injected or refused else set()) | ({pre.rc} if pre.rc else set())
        if crash:
            ok.add(-9)
        if "Traceback (most recent call last)" in call.err:
            at = call.err.index("Traceback (most recent call last)")
            self.add(
                [Violation("crash", self.op, f"marin crashed: {call.err[at:][-800:]}")],
                f"expect('Traceback' not in {var}.stderr, 'marin did not crash')",
            )
        elif call.rc not in ok:
            tail = " | ".join(call.err.strip().splitlines()[-3:])
            self.add(
                [Violation(failure_kind(call.err), self.op, f"exit {call.rc}: {tail[-700:]}")],
                f"expect({var} is not None and {var}.returncode == 0, 'the run succeeded')",
            )
        self.add(
            check_once(self.world.path("counter.jsonl"), {call.run_id}, self.op, twice),
            f"expect(ran({call.run_id!r}) <= {2 if twice else 1}, 'fn ran once per recipe in "
            "the run (twice when preempted once)')",
        )

    def check_engine_run(
        self,
        opts: RunOpts,
        run_id: str,
        ok: bool,
        injected: bool,
        engine: str,
        output: str = "",
    ) -> None:
        """After a Prefect or Airflow run: what the plan serves under the run's options is
        clean (or allowed), each fn started once per recipe, and it succeeded unless told to
        fail. (What it serves under rebuild/rebuild is checked after every operation.)"""
        self.world.use(opts.ctx)
        plan = self.plan(opts.ctx, opts.policy).json()
        if plan is not None:
            found = check_served(
                plan,
                opts.policy,
                self.expected(),
                self.world.hand,
                self.op,
                f"after the {engine} run, plan as {opts.ctx}",
            )
            for v in found:
                self.add([v], self._expect_clean_line(v.message.split(": ", 1)[1].split(" ")[0]))
        # Refused over data that is not provably Marin's (a user's, or beside a torn record):
        # a failure the checker expects, as on the CLI (``userdata.refused_steps``).
        refused = userdata.REFUSAL in output and any(
            o in output for o in self.world.refused_outputs
        )
        if not ok and not injected and not refused:
            self.add(
                [
                    Violation(
                        f"run-failed:{engine}", self.op, f"the {engine} run failed: {output[-700:]}"
                    )
                ]
            )
        self.add(
            check_once(self.world.path("counter.jsonl"), {run_id}, self.op),
            f"expect(ran({run_id!r}) <= 1, 'fn ran once per recipe in the run')",
        )

    def _clean_check(self, found: list[Violation]) -> str | None:
        if not found:
            return None
        name = found[0].message.split(" ")[3] if " reports " in found[0].message else ""
        return self._expect_clean_line(name)

    def _expect_clean_line(self, step_id: str) -> str:
        for ctx in [self.last, *self.world.contexts]:
            plan = self.plan(ctx, Policy()).json() or {}
            for step in plan.get("steps", []):
                if step["step"] == step_id or step["name"] == step_id:
                    rel = os.path.relpath(step["output_path"], self.world.prefix)
                    return f"expect_clean(CLEAN, {step['name']!r}, {rel!r})"
        return "expect(False, 'a wrong artifact (see the message)')"

    def expected(self) -> dict[int, Expected]:
        return ORACLE.expected(self.world.model)

    def _release_held(self) -> None:
        """Fns held by an earlier killed driver are released while this run waits for them."""
        if self.world.held:
            tokens = list(self.world.held)
            self.world.release_later(0.3)
            self.script.emit(*(f"threading.Timer(0.3, release, [{t!r}]).start()" for t in tokens))

    # --- operations that need more than one marin call -------------------------------------

    def _held_run(
        self, step: int, opts: RunOpts
    ) -> tuple[Call, str, str, list[str], subprocess.Popen[str], str]:
        """A ``marin run`` started while step ``step``'s fn is held: the plan before it, the
        hold's token, the run's id, its argv (with the prefix), the driver and its script
        variable."""
        world = self.world
        world.use(opts.ctx)
        pre = self.plan(opts.ctx, opts.policy, opts.force)
        self._release_held()
        token = world.hold(f"s{step}")
        run_id = world.new_run_id()
        argv = ["run", world.target, "--json", *opts.argv(world.model.deferred)]
        argv += ["--prefix", world.prefix]
        proc = world.start(argv, world.env(opts.ctx.user, run_id))
        var = self.script.var("p")
        self.script.emit(
            f"hold('s{step}', {token!r})",
            self._marin_line(var, argv[:-2], opts.ctx.user, run_id, start=True),
        )
        return pre, token, run_id, argv, proc, var

    def kill_driver(self, step: int, release: str, opts: RunOpts) -> None:
        if self.runner is not None:
            return
        world = self.world
        pre, token, run_id, argv, proc, var = self._held_run(step, opts)
        started = wait_for(world.control(f"started-{token}"), proc)
        os.remove(world.control(f"hold-s{step}"))
        if not started:  # the step was not built: an ordinary run
            world.held.pop(token, None)
            self.script.emit(
                f"os.remove(os.path.join(CONTROL, 'hold-s{step}'))", f"{var} = finish({var})"
            )
            self.check_run(world.finish(proc, argv, {}, run_id), pre, opts, var)
            return
        kill(proc.pid)
        proc.wait()
        self.script.emit(
            f"wait_for(os.path.join(CONTROL, 'started-{token}'), {var})",
            f"{var}.kill(); {var}.wait()  # SIGKILL the driver",
            f"os.remove(os.path.join(CONTROL, 'hold-s{step}'))",
        )
        self._after_kill(token, release, proc.pid)
        self.add(check_once(world.path("counter.jsonl"), {run_id}, self.op))

    def preempt(self, step: int, opts: RunOpts) -> None:
        """A run in which step ``step``'s job (a gang's rank 0) is SIGKILLed once its fn
        started: a preemption, resubmitted by the same driver, which must end as a clean run
        (``step``'s fn may start twice: the killed job, and the one that replaced it)."""
        if self.runner is not None:
            return
        world = self.world
        pre, token, run_id, argv, proc, var = self._held_run(step, opts)
        started = wait_for(world.control(f"started-{token}"), proc)
        os.remove(world.control(f"hold-s{step}"))
        self.script.emit(
            f"wait_for(os.path.join(CONTROL, 'started-{token}'), {var})",
            f"os.remove(os.path.join(CONTROL, 'hold-s{step}'))",
        )
        pid = world.started_pid(token)
        killed = started and pid is not None and pid != proc.pid  # a job's, not the driver
        if killed and pid is not None:
            kill(pid)
            self.preempted += 1
            self.script.emit(f"os.kill(started_pid({token!r}), signal.SIGKILL)  # preempted")
        world.release(token)
        self.script.emit(f"release({token!r})", f"{var} = finish({var})")
        past = killed and world.model.step(step).max_preemptions == 0
        before = _build_ids(pre, step)
        call = world.finish(proc, argv, {}, run_id)
        self.check_run(call, pre, opts, var, injected=past, twice=frozenset({f"s{step}"}))
        said = f"preempted {world.model.step(step).name}@"
        if killed and call.rc == 0 and said not in call.err and not past:
            message = f"s{step}'s job was SIGKILLed, and the run never said it was preempted"
            self.add([Violation("preemption-unseen", self.op, message)])
        if past:
            self.gang_events["past-budget"] = self.gang_events.get("past-budget", 0) + 1
        if past and not call.timed_out:
            self._check_past_budget(step, call, before, _build_ids(pre, step), var)

    def _check_past_budget(
        self, step: int, call: Call, before: list[str | None], after: list[str | None], var: str
    ) -> None:
        """A preemption past ``max_preemptions=0``: the step failed, saying so, the run never
        reports success, and nothing was committed (docs/remote.md)."""
        found = []
        if call.rc == 0:
            found.append(("preempted-past-budget-succeeded", "the run reported success"))
        if before != after:
            found.append(("preempted-past-budget-committed", "a build was committed"))
        if "after 0 preemptions" not in call.err:
            found.append(("preempted-past-budget-unsaid", "no 'after 0 preemptions' said"))
        for kind, message in found:
            check = f"expect({var}.returncode != 0, 'the step failed past its budget')"
            self.add([Violation(kind, self.op, f"s{step} preempted past its budget: {message}")],
                     check if kind.endswith("succeeded") else None)  # fmt: skip

    def _after_kill(self, token: str, release: str, driver: int) -> None:
        world = self.world
        pid = world.started_pid(token)
        if release == "kill" and pid is not None and pid != driver:
            kill(pid, group=True)  # the job: its own session
            self.script.emit(f"os.killpg(started_pid({token!r}), signal.SIGKILL)  # the job")
            deadline = time.monotonic() + 5
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        if release in ("kill", "before") or pid == driver:
            world.release(token)
            self.script.emit(f"release({token!r})")

    def two_drivers(self, opts: RunOpts) -> None:
        if self.runner is not None:
            return
        world = self.world
        world.use(opts.ctx)
        pre = self.plan(opts.ctx, opts.policy, opts.force)
        self._release_held()
        argv = [
            "run",
            world.target,
            "--json",
            *opts.argv(world.model.deferred),
            "--prefix",
            world.prefix,
        ]
        ids = [world.new_run_id(), world.new_run_id()]
        procs = [world.start(argv, world.env(opts.ctx.user, i)) for i in ids]
        names = [self.script.var("p"), self.script.var("p")]
        for name, run_id in zip(names, ids, strict=True):
            self.script.emit(self._marin_line(name, argv[:-2], opts.ctx.user, run_id, start=True))
        calls = [world.finish(p, argv, {}, i) for p, i in zip(procs, ids, strict=True)]
        self.script.emit(*(f"{n} = finish({n})" for n in names))
        for call, name in zip(calls, names, strict=True):
            call.run_id = "-"  # counted below, over both drivers
            self.check_run(call, pre, opts, name)
        self.add(
            check_once(world.path("counter.jsonl"), set(ids), self.op),
            f"expect(ran({ids[0]!r}) + ran({ids[1]!r}) <= 1, 'two drivers: fn once')",
        )

    def stream(self, step: int, variants: tuple[tuple[int, bool], ...], opts: RunOpts) -> None:
        if self.runner is not None:
            return
        self.world.use(opts.ctx)
        self._release_held()
        model = self.world.model
        s = model.step(step)
        codex = _codex(opts.ctx, model)
        version = f"v{s.version}"
        if s.deferred and codex is not None:
            version = codex[1].get(s.name, codex[0])
        wanted = sweep.variant_specs(s.k, version, variants)
        # The key itself (its repr in the script keeps its type): what pipeline.config gives.
        info = {
            "note": s.note,
            "key": key_value(s.key),
            "remote": s.remote,
            "resumable": s.resumable,
        }
        # Shared, or the user's folder (a user-scope step upstream places it there).
        places = [f"{r}{s.name}/{v}" for _, v in wanted for r in ("", f"users/{opts.ctx.user}/")]
        before = {
            p: (read_record(self.world.path("prefix", p)) or {}).get("build_id") for p in places
        }
        excused = self._inputs_allowed(step, opts)
        report = self._run_stream(step, wanted, info, opts, codex)
        self.script.emit(
            f"stream({step}, {wanted!r}, {info!r}, user={opts.ctx.user!r}, "
            f"on_drift={opts.on_drift!r}, on_code_drift={opts.on_code_drift!r}, "
            f"codex={codex!r})"
        )
        if report is not None:
            served = [
                *report.outcomes.values(),
                *(report.plan.decisions.values() if report.plan is not None else ()),
            ]
            placed = {
                (o.spec.name, o.spec.version): o.spec.output_path for o in served
            }  # built, or served from a record
            paths = [placed.get((s.name, v), f"{s.name}/{v}") for _, v in wanted]
            self._check_variants(step, wanted, paths, before, opts, excused)

    def _inputs_allowed(self, step: int, opts: RunOpts) -> list[str]:
        """Why step ``step``'s inputs may differ from their clean builds under the stream's
        options (a variant built from one of those may too: docs/caching.md, exception 4), by
        the plan made just before with those options."""
        plan = self.plan(opts.ctx, opts.policy, opts.force).json() or {}
        differs = differences(plan, self.expected())
        allowed = allowances(plan, opts.policy, self.world.hand, differs)
        ours = [s for s in plan.get("steps", []) if step_index(s) == step]
        return [
            f"input {dep}: {', '.join(allowed[dep])}"
            for s in ours
            for dep in s.get("deps", [])
            if allowed.get(dep) and differs.get(dep, True)
        ]

    def _run_stream(
        self,
        step: int,
        wanted: list[tuple[int, str]],
        info: dict[str, Any],
        opts: RunOpts,
        codex: tuple[str, dict[str, str]] | None,
    ) -> Any:
        """The sweep, in this process: its report; None when the run refused or failed (a
        MarinError)."""
        from marin.execution.errors import MarinError
        from marin.execution.pipeline.targets import load_target

        env = self.world.env(opts.ctx.user, self.world.new_run_id())
        with environ(env):
            try:
                load_target(self.world.target)
                module = sys.modules[f"marin_target_{self.world.stem}"]
                return sweep.run_sweep(
                    module,
                    self.world.prefix,
                    step,
                    wanted,
                    info,
                    opts.on_drift,
                    opts.on_code_drift,
                    codex,
                )
            except MarinError:
                return None
            except Exception as exc:  # not an error Marin means to raise: a crash
                self.add(
                    [
                        Violation(
                            "crash",
                            self.op,
                            f"the sweep raised {type(exc).__name__}: {exc} (not a MarinError)",
                        )
                    ],
                    "expect(False, 'the sweep crashed (see its traceback)')",
                )
                return None

    def _check_variants(
        self,
        step: int,
        wanted: list[tuple[int, str]],
        paths: list[str],
        before: dict[str, Any],
        opts: RunOpts,
        excused: list[str],
    ) -> None:
        """Each config the sweep yielded is served its own clean build; a record from before
        the run may be served drifted (config or code) under ``warn``, an output damaged by hand is served as it
        is, and a build from inputs allowed to differ may differ (docs/caching.md)."""
        model = self.world.model
        for (k, version), path in zip(wanted, paths, strict=True):
            want = ORACLE.expected(model.replace(step, k=k))[step]
            got = stored(self.world.path("prefix", path))
            build = (got.record or {}).get("build_id")
            old = got.record is not None and build == before.get(path)
            damaged = old and str(build) in self.world.hand.outputs
            if got.found == want or (old and opts.on_drift == "warn") or damaged or excused:
                continue
            if old and opts.on_code_drift == "warn" and self._older_code(step, k, got.found):
                continue  # code drift served under warn: this config's build by older code
            self.add(
                [
                    Violation(
                        "wrong-artifact:stream",
                        self.op,
                        (
                            f"a stream yielded o/s{step}@{version} with k={k} and was served "
                            f"{diff(Stored(got, None), want)}"
                        ),
                    )
                ],
                f"expect(data_k({path!r}) == {k}, "
                f"'o/s{step}@{version} with k={k} is served its own build')",
            )

    def _older_code(self, step: int, k: int, found: Any) -> bool:
        """Whether ``found`` is the clean build of config ``k`` by an older code revision of
        ``step``: a record from before the run served with code drift under ``warn``
        (docs/caching.md, exception 1; seed 5952 of the soak profile)."""
        model = self.world.model
        return any(
            found == ORACLE.expected(model.replace(step, k=k, rev=rev))[step]
            for rev in range(model.steps[step].rev)
        )

    def gc(self, ctx: Context, dry_run: bool, teammate: bool = False) -> None:
        """``marin gc`` of the pipeline: what its plan serves stays, other users' folders too.
        A teammate's gc of another pipeline (``ops.Gc``) promises neither: what it leaves is
        judged by the runs that follow."""
        world = self.world
        plan = self.plan(ctx, Policy()).json() or {}
        served = {} if teammate else served_state(plan)
        others = {u: snapshot(world.path("prefix", "users", u)) for u in USERS if u != ctx.user}
        whole = _stored_files(world.prefix) if dry_run else {}
        argv = ["gc", world.target, "--json", *gc_flags(ctx, world.model.deferred)]
        if teammate:
            scope = ["--all-users", "--scope", "user"] if ctx.scope == "user" else []
            argv = ["gc", world.teammate, "--json", "--keep-versions", "1", *scope]
            others = {}
        if dry_run:
            argv.append("--dry-run")
        call = world.marin(argv, ctx.user)
        var = self.script.var("p")
        self.script.emit(self._marin_line(var, argv, ctx.user, call.run_id))
        found = gc_violations(served, self.op, f"marin gc as {ctx.user}")
        for path in sorted(served):
            if any(v.message.find(path) >= 0 for v in found):
                rel = os.path.relpath(path, world.prefix) + ".marin/record.json"
                self.add(
                    [v for v in found if path in v.message],
                    f"expect(os.path.exists(os.path.join(PREFIX, {rel!r})), "
                    f"'gc kept {rel}, which the plan serves')",
                )
        for user, files in others.items():
            gone = sorted(set(files) - set(snapshot(world.path("prefix", "users", user))))
            if gone:
                self.add(
                    [
                        Violation(
                            "gc-touched-other-user",
                            self.op,
                            (
                                f"marin gc as {ctx.user} deleted {len(gone)} file(s) of users/{user}/, "
                                f"e.g. {gone[0]}"
                            ),
                        )
                    ],
                    f"expect(os.path.exists(os.path.join(PREFIX, 'users', {user!r}, "
                    f"{gone[0]!r})), 'gc as {ctx.user} left users/{user}/ alone')",
                )
        changed = _changed_by_gc(whole, _stored_files(world.prefix)) if dry_run else []
        if changed:
            self.add([Violation("gc-dry-run-changed", self.op,
                                f"marin gc --dry-run changed files, e.g. {changed[0]}")])  # fmt: skip

    def plant(self, kind: str, pick: int) -> None:
        world = self.world
        plan = self.plan(self.last, Policy()).json() or {}
        # Never beside a user's data: a planted job.json would make it look Marin's.
        steps = [s for s in plan.get("steps", []) if s["output_path"] not in world.refused_outputs]
        step = _plant_target({"steps": steps}, world.model, pick)
        if step is None:
            return
        meta = step["output_path"] + ".marin"
        os.makedirs(meta, exist_ok=True)
        job_id = "marin-" + hashlib.sha256(f"{world.root}/{self.op}".encode()).hexdigest()[:20]
        rel = os.path.relpath(meta, world.prefix)
        fingerprint = "" if kind == "decoy" else str(step["fingerprint"])
        recipe = None if kind == "decoy" else copied_recipe(plan, step, world.prefix)
        if kind == "torn-job":
            data = job_json(job_id, meta, fingerprint, recipe)
            with open(os.path.join(meta, "job.json"), "wb") as f:
                f.write(data[: len(data) // 2])
            self.script.emit(
                f"open(os.path.join(PREFIX, {rel!r}, 'job.json'), 'wb')"
                f".write({data[: len(data) // 2]!r})  # a torn job.json"
            )
        else:
            self._plant_job(kind, meta, rel, job_id, fingerprint, recipe)
        # A run may reattach to a live decoy with the step's fingerprint and wait for it: from
        # now on runs go to a bounded subprocess. The other plants cannot make a run wait.
        world.planted = world.planted or kind == "decoy-fp"

    def _plant_job(
        self,
        kind: str,
        meta: str,
        rel: str,
        job_id: str,
        fingerprint: str,
        recipe: dict[str, Any] | None,
    ) -> None:
        world = self.world
        workdir = None if kind == "no-workdir" else meta
        folder = os.path.join(workdir or world.path("jobs"), job_id)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(meta, "job.json"), "wb") as f:
            f.write(job_json(job_id, workdir, fingerprint, recipe))
        with open(os.path.join(folder, "keep.txt"), "w") as f:
            f.write("planted")
        pid = marker = None
        if kind in ("decoy-fp", "decoy"):
            pid = self._decoy(folder)
        if kind in ("result", "no-workdir"):
            marker = world.path("markers", f"m{self.op}")
            with open(os.path.join(folder, "result.pkl"), "wb") as f:
                f.write(planted_result(marker))
        if workdir is None:
            self._sentinels.append(os.path.join(folder, "keep.txt"))
        dvar = self.script.var("d") if pid is not None else None
        if dvar:
            self.script.emit(f"{dvar} = decoy()")
        wd = f"os.path.join(PREFIX, {rel!r})" if workdir else "None"
        mk = f"os.path.join(MARKERS, 'm{self.op}')" if marker else "None"
        self.script.emit(
            f"plant_job(os.path.join(PREFIX, {rel!r}), {job_id!r}, {wd}, {fingerprint!r}, "
            f"pid={f'{dvar}.pid' if dvar else 'None'}, marker={mk}, recipe={recipe!r})"
        )
        if dvar:
            self._decoy_vars[len(world.decoys) - 1] = dvar

    def _decoy(self, folder: str) -> int:
        import json

        from marin.execution.remote.local_job import start_time

        proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
        self.world.decoys.append(proc)
        info = {"pid": proc.pid, "start_time": start_time(proc.pid)}
        with open(os.path.join(folder, "pid.json"), "w") as f:
            json.dump(info, f)
        return proc.pid

    def pick_built(
        self, pick: int, adopted: bool = True, only: int | None = None
    ) -> dict[str, Any] | None:
        """A step the last context's plan finds built (with a record), chosen by ``pick``
        (``adopted=False``: never an adoption, whose data is the user's; ``only``: that step)."""
        plan = self.plan(self.last, Policy()).json() or {}
        built = [
            s
            for s in plan.get("steps", [])
            if s.get("build_id")
            and (record := read_record(s["output_path"])) is not None
            and (adopted or not record.get("source"))
            and only in (None, step_index(s))
        ]
        return built[pick % len(built)] if built else None

    # --- after every operation --------------------------------------------------------------

    def after_op(self) -> None:
        world = self.world
        if os.listdir(world.path("markers")):
            self.add(
                [
                    Violation(
                        "planted:code-ran",
                        self.op,
                        "a planted result.pkl was "
                        f"unpickled: {os.listdir(world.path('markers'))} appeared",
                    )
                ],
                "expect(not os.listdir(MARKERS), 'no planted code ran')",
            )
        for i, decoy in enumerate(world.decoys):
            if decoy.poll() is not None and i not in self._dead_decoys:
                self._dead_decoys.add(i)
                var = self._decoy_vars.get(i) or "d"
                self.add(
                    [
                        Violation(
                            "planted:process-killed",
                            self.op,
                            f"the decoy process "
                            f"{decoy.pid} named by a planted pid.json was killed "
                            f"(exit {decoy.returncode})",
                        )
                    ],
                    f"expect({var}.poll() is None, 'the decoy process lives')",
                )
        self._outside_checks()
        adoption.check_user_data(self)
        userdata.check(self)
        self._strict_checks()

    def _outside_checks(self) -> None:
        world = self.world
        if snapshot(world.path("bystander")) != self._bystander:
            self.add([Violation("outside-prefix-touched", self.op, "bystander files changed")])
        for sentinel in self._sentinels:
            if not os.path.exists(sentinel):
                rel = os.path.relpath(sentinel, world.path("jobs"))
                self.add(
                    [
                        Violation(
                            "outside-prefix-touched",
                            self.op,
                            (
                                f"{sentinel} (outside the prefix, under $MARIN_LOCAL_JOBS) was deleted"
                            ),
                        )
                    ],
                    f"expect(os.path.exists(os.path.join(JOBS, {rel!r})), "
                    "'nothing outside the prefix was deleted')",
                )
        for path in _records(world.prefix):
            record = read_record(path[: -len(".marin/record.json")])
            if record is not None and "planted" in str(record.get("result")):
                rel = os.path.relpath(path, world.prefix)
                self.add(
                    [
                        Violation(
                            "planted:result-committed",
                            self.op,
                            f"{rel} holds a planted result: {record.get('result')}",
                        )
                    ],
                    f"expect('planted' not in open(os.path.join(PREFIX, {rel!r})).read(), "
                    "'no planted result committed')",
                )

    def _strict_checks(self) -> None:
        expected = self.expected()
        for ctx in self.world.contexts:
            call = self.plan(ctx, STRICT)
            plan = call.json()
            if plan is None:
                continue
            found = check_served(
                plan,
                STRICT,
                expected,
                self.world.hand,
                self.op,
                f"plan --on-drift rebuild --on-code-drift rebuild as {ctx}",
            )
            for v in found:
                self.add([v], self._expect_clean_line(v.message.split(": ", 1)[1].split(" ")[0]))


def run_history(history: Any, runner: Any = None) -> tuple[Outcome, Executor]:
    """Execute ``history`` in a fresh sandbox; the outcome, and the executor (for scripts)."""
    from marin.execution.remote import poller

    world = World(history.model)
    ex = Executor(world, runner)
    start = time.monotonic()
    saved, poller.MAX_DELAY_S = poller.MAX_DELAY_S, 0.1  # as MARIN_REMOTE_POLL_MAX_S=0.1
    try:
        ex.execute(history.ops)
    finally:
        poller.MAX_DELAY_S = saved
        world.close()
    script = ex.report()
    return Outcome(list(ex.violations), script, time.monotonic() - start), ex


# --- small helpers --------------------------------------------------------------------------------


@functools.cache
def gc_options() -> frozenset[str]:
    """The flags ``marin gc`` takes (today's has no ``--scope``/``--version``/``--override``;
    issue 53 adds them: the gc operation passes them once they exist)."""
    from marin.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return frozenset(sub.choices["gc"]._option_string_actions)


def gc_flags(ctx: Context, deferred: bool) -> list[str]:
    known = gc_options()
    out = []
    if "--scope" in known and ctx.scope != "shared":
        out += ["--scope", ctx.scope]
    if "--version" in known and deferred:
        out += ["--version", ctx.version]
    if "--override" in known and deferred and ctx.override is not None:
        out += ["--override", f"o/s{ctx.override[0]}={ctx.override[1]}"]
    return out


FAILURES = {
    "not a job record; delete it by hand": "run-failed:torn-job",
    "job.json cannot be read": "run-failed:torn-job",
    "never writes a shared artifact": "run-failed:user-scope-shared",
    "AdoptedDataError": "run-failed:adopted-data",
}


REFUSED_JOB_STATES = ("unreadable", "refuse", "unrecorded", "unseen")
"""A plan's job states the run refuses (docs/remote.md: a job.json that cannot be read, a job
writing the output that job.json does not name, a job this driver cannot see)."""


def refuses(plan: Call, report: dict[str, Any], excused: set[str] | None = None) -> bool:
    """Whether every step the run failed is one its plan, made just before, said it refuses
    (a foreign record; a ``job.json`` it cannot read or that does not name the job writing the
    output, a job it cannot see: ``REFUSED_JOB_STATES``, shown as ``refuse: ...``), or is
    ``excused`` (refused over a user's data: ``userdata``): the run then fails those steps, as
    documented (docs/reliability.md, the catalogue; docs/remote.md), and that is no broken
    promise. Any other failed step is."""
    refused = {
        s["step"]
        for s in (plan.json() or {}).get("steps", [])
        if s.get("status") == "foreign"
        or str((s.get("job") or {}).get("state")) in REFUSED_JOB_STATES
        or (s.get("job") or {}).get("refused")
    }
    failed = {s["step"] for s in report.get("steps", []) if s.get("action") == "failed"}
    return bool(failed) and failed <= refused | (excused or set())


def copied_recipe(plan: dict[str, Any], step: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The step's recipe as a planter copies it from what anyone can read: its placement, the
    build ids of its inputs (``plan --json``), and its code digest (its record's, while the
    plan shows no code drift)."""
    builds = {s["step"]: s.get("build_id") for s in plan.get("steps", [])}
    record = read_record(step["output_path"]) or {}
    code = record.get("code") if not step.get("code_drift") else None
    return {
        "placement": os.path.relpath(step["output_path"], prefix),
        "inputs": {d: builds[d] for d in step.get("deps", []) if builds.get(d)},
        "code": code,
    }


def failure_kind(err: str) -> str:
    """The kind of a run that failed with no failure injected, from its error."""
    return next((kind for text, kind in FAILURES.items() if text in err), "run-failed:other")


def planted_result(marker: str) -> bytes:
    """A ``result.pkl`` whose unpickling creates ``marker`` (and claims ``{'planted': True}``)."""
    return pickle.dumps(
        {"ok": True, "result": pickle.dumps({"planted": True}), "x": _Marker(marker)}
    )


class _Marker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _plant_target(plan: dict[str, Any], model: PipelineModel, pick: int) -> dict[str, Any] | None:
    steps = plan.get("steps", [])
    remote = {s.idx for s in model.steps if s.remote}
    building = [s for s in steps if s.get("action") == "build"]
    pool = (
        [s for s in building if step_index(s) in remote]
        or [s for s in steps if step_index(s) in remote]
        or building
        or steps
    )
    return pool[pick % len(pool)] if pool else None


def _build_ids(plan: Call, step: int) -> list[str | None]:
    """The build ids of step ``step``'s records where ``plan`` places it."""
    steps = (plan.json() or {}).get("steps", [])
    out = []
    for s in steps:
        if step_index(s) == step:
            record = read_record(s["output_path"])
            out.append(None if record is None else str(record.get("build_id")))
    return out


def _codex(ctx: Context, model: PipelineModel) -> tuple[str, dict[str, str]] | None:
    if not model.deferred:
        return None
    overrides = {f"o/s{ctx.override[0]}": ctx.override[1]} if ctx.override else {}
    return (ctx.version, overrides)


def _records(prefix: str) -> list[str]:
    out = []
    for folder, _, files in os.walk(prefix):
        if folder.endswith(".marin") and "record.json" in files:
            out.append(os.path.join(folder, "record.json"))
    return out


def _changed_by_gc(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The files a ``gc --dry-run`` changed: any deleted, new or rewritten one but a job's: a
    killed driver's job runs on and may write (or remove) its output's data or its checkpoints
    meanwhile (seed 4995 of the soak profile: a resumable job removed its ``partial.txt``).
    gc deletes a step's metadata with its data, and that is never a job's to touch."""
    gone = [k for k in before if k not in after and not _jobs_to_write(k)]
    written = [k for k, v in after.items() if before.get(k) != v and not _jobs_to_write(k)]
    return sorted(gone + written)


def _jobs_to_write(path: str) -> bool:
    """Whether a running job may write ``path`` (relative to the prefix): its output's data,
    or its checkpoints; never the rest of a metadata folder."""
    parts = path.split("/")
    meta = next((i for i, part in enumerate(parts) if part.endswith(".marin")), None)
    return meta is None or parts[meta + 1 : meta + 2] == ["checkpoints"]


def _stored_files(prefix: str) -> dict[str, str]:
    return {k: v for k, v in snapshot(prefix).items() if not k.endswith("lease.json.guard")}


def _running(pid: int) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    return False
