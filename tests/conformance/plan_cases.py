"""Set up a store state per step, predict a run with ``plan_run``, run a runner, and compare.

The plan is the oracle: whatever the setup left in storage, the steps whose ``fn`` ran (counted
through the call log, never the engine's report) must be exactly the plan's ``build`` set, and the
records afterwards must match the plan's other actions. Used by the hypothesis property test and
by the fixed scenarios, on every runner.

Store states a step can be put in (``STATES``):

- ``built``: built with its current config;
- ``missing``: no record and no output;
- ``drifted``: built with another ``value`` at the same version;
- ``corrupt``: garbage bytes in ``record.json``, its output moved away (data beside a record
  that cannot be read is refused as not provably Marin's: ``tests/test_plan_refusals.py``);
- ``failed``: a FAILED status and no record;
- ``stale``: built, then its first dependency rebuilt after it (its lineage names an old build);
- ``old``: built, then ``build_id``/``inputs`` stripped from its record (written before lineage);
- ``interrupted``: a RUNNING status and no record (an attempt that died without its lease).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marin.execution.errors import DriftError
from marin.execution.lazy import lower
from marin.execution.pipeline.graph import Graph
from marin.execution.plan.decide import Plan
from marin.execution.plan.options import RunOptions
from marin.execution.plan.read import plan_run
from marin.execution.step_runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import FAILED, RUNNING, read_record, record_path, write_status
from marin.execution.vocabulary import Action
from tests.conformance.random_graph import GRAPH_ENV, PREFIX, build
from tests.conformance.scenarios import CALLS_ENV, read_calls
from tests.ux.helpers import environ

BUILD, SKIP, PRUNE = Action.BUILD, Action.SKIP, Action.PRUNE

TARGET = "tests.conformance.random_graph:pipeline"
STATES = ("built", "missing", "drifted", "corrupt", "failed", "stale", "old", "interrupted")
DRIFT_OFFSET = 1000


@dataclass
class Case:
    """A graph (dependencies first), a store state per step, and a run policy."""

    deps: dict[str, list[str]]
    targets: list[str]
    states: dict[str, str]
    on_drift: str = "warn"
    force: list[str] = field(default_factory=list)
    """Step names (without the ``graph/`` prefix)."""
    cascade: bool = True
    setup_outputs: dict[str, str] | None = None
    """Fixed output suffixes the store is set up with (``random_graph``); None: a nonce each."""
    run_outputs: dict[str, str] | None = None
    """Fixed output suffixes of the run: equal to the setup's, a rebuild writes the same bytes."""

    def description(self, *, setup: bool = False) -> dict[str, Any]:
        """The pipeline as the run sees it; ``setup``: as the store was built (drifted values)."""
        steps = []
        for i, (name, deps) in enumerate(self.deps.items()):
            value = i + (DRIFT_OFFSET if setup and self.states[name] == "drifted" else 0)
            steps.append({"name": name, "deps": deps, "value": value})
        targets = list(self.deps) if setup else self.targets
        outputs = self.setup_outputs if setup else self.run_outputs
        return {"steps": steps, "targets": targets, **({"outputs": outputs} if outputs else {})}

    @property
    def force_ids(self) -> list[str]:
        return [f"{PREFIX}/{n}" for n in self.force]


def step_name(step_id_or_name: str) -> str:
    """``graph/s3@v1`` or ``graph/s3`` -> ``s3``."""
    return step_id_or_name.split("@", 1)[0].removeprefix(f"{PREFIX}/")


def output_path(name: str) -> str:
    return f"{PREFIX}/{name}/v1"


def set_up_store(case: Case, prefix: str, setup_calls: str) -> None:
    """Build every step with the setup config, then bend each step into its drawn state."""
    location = open_prefix(prefix)
    setup = case.description(setup=True)
    with environ({CALLS_ENV: setup_calls, GRAPH_ENV: json.dumps(setup)}):
        specs = lower(build(setup))
        StepRunner(RunOptions(max_concurrent=4), prefix=prefix).run(specs)
        rebuild = sorted(
            {deps[0] for n, deps in case.deps.items() if case.states[n] == "stale" and deps}
        )
        if rebuild:
            # Rebuild the upstream only: its dependents keep records naming its old build.
            forced = [f"{PREFIX}/{n}" for n in rebuild]
            options = RunOptions(max_concurrent=4, cascade=False, force=forced)
            StepRunner(options, prefix=prefix).run(specs)
    for name, state in case.states.items():
        out = output_path(name)
        record_file = os.path.join(prefix, record_path(out))
        if state == "missing":
            remove(os.path.join(prefix, out))
            remove(os.path.dirname(record_file))
        elif state == "corrupt":
            with open(record_file, "wb") as f:
                f.write(b"\x00\xffnot json{")
            remove(os.path.join(prefix, out))
        elif state == "failed":
            os.remove(record_file)
            write_status(location, out, FAILED, error="RuntimeError: boom (set up by the test)")
        elif state == "interrupted":
            os.remove(record_file)
            write_status(location, out, RUNNING)
        elif state == "old":
            strip_lineage(record_file)


def remove(path: str) -> None:
    """Remove a file or a directory tree (outputs here are single files)."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def needed_by(deps: Mapping[str, Sequence[str]], targets: Sequence[str]) -> list[str]:
    """The targets and everything they read, in ``deps`` order."""
    seen: set[str] = set()
    todo = list(targets)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(deps[name])
    return [n for n in deps if n in seen]


def strip_lineage(record_file: str) -> None:
    """Make a record look written before build ids existed."""
    with open(record_file) as f:
        data = json.load(f)
    data.pop("build_id", None)
    data.pop("inputs", None)
    with open(record_file, "w") as f:
        json.dump(data, f)


def build_ids(case: Case, prefix: str) -> dict[str, str | None]:
    """Each step's current build id (None: no usable record; "" a record without lineage)."""
    location = open_prefix(prefix)
    out: dict[str, str | None] = {}
    for name in case.deps:
        record = read_record(location, output_path(name))
        out[name] = None if record is None else (record.build_id or "")
    return out


def raw_records(case: Case, prefix: str) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for name in case.deps:
        try:
            with open(os.path.join(prefix, record_path(output_path(name))), "rb") as f:
                out[name] = f.read()
        except FileNotFoundError:
            out[name] = None
    return out


def predict(case: Case, prefix: str) -> Plan | DriftError:
    specs = lower(build(case.description()))
    try:
        options = RunOptions(on_drift=case.on_drift, force=case.force_ids, cascade=case.cascade)
        return plan_run(Graph.of(specs), open_prefix(prefix), options)
    except DriftError as exc:
        return exc


@dataclass
class Outcome:
    plan: Plan | DriftError
    ok: bool
    ran: list[str]
    """Step names whose fn started, in order (from the call log)."""
    before: dict[str, str | None]
    after: dict[str, str | None]
    raw_before: dict[str, bytes | None] = field(default_factory=dict)
    """Each step's ``record.json`` bytes (None: no file)."""
    raw_after: dict[str, bytes | None] = field(default_factory=dict)

    def actions(self) -> dict[str, str]:
        assert isinstance(self.plan, Plan)
        return {step_name(d.spec.step_id): d.action for d in self.plan.decisions.values()}


def run_case(runner: Any, case: Case, root: str) -> Outcome:
    """Set up, predict, run and check ``case`` on ``runner``; returns what happened."""
    prefix = os.path.join(root, "prefix")
    os.makedirs(prefix, exist_ok=True)
    set_up_store(case, prefix, os.path.join(root, "setup-calls.jsonl"))
    before = build_ids(case, prefix)
    raw_before = raw_records(case, prefix)
    plan = predict(case, prefix)
    calls = os.path.join(root, "calls.jsonl")
    env = {CALLS_ENV: calls, GRAPH_ENV: json.dumps(case.description())}
    with environ(env):  # an exporter imports the target in this process too
        ok = runner.run(
            TARGET,
            prefix=prefix,
            env=env,
            max_concurrent=4,
            on_drift=case.on_drift,
            force=case.force_ids,
            cascade=case.cascade,
        )
    ran = [c["step"] for c in read_calls(calls) if c["event"] == "start"]
    outcome = Outcome(plan, ok, ran, before, build_ids(case, prefix))
    outcome.raw_before, outcome.raw_after = raw_before, raw_records(case, prefix)
    check(runner, case, prefix, outcome)
    return outcome


def check(runner: Any, case: Case, prefix: str, o: Outcome) -> None:
    """The property: plan, call log and records agree (see the module docstring)."""
    detail = f"{case!r} on {runner.name}: ran {o.ran}"
    if isinstance(o.plan, DriftError):
        # (c) drift under on_drift=error: the run fails before anything builds.
        assert case.on_drift == "error", detail
        assert not o.ok, f"drift under on_drift=error did not fail the run: {detail}"
        assert o.ran == [], f"steps ran despite a DriftError: {detail}"
        assert o.after == o.before and o.raw_after == o.raw_before, detail
        return
    actions = o.actions()
    planned = {n for n, a in actions.items() if a == BUILD}
    # (a) exactly the planned builds ran, each once; a step planned only because an upstream
    # is rebuilt is served instead when that upstream's output is unchanged (early cutoff):
    # then its record is untouched, and it counts as served below.
    cut_off = cut_off_steps(o)
    if case.run_outputs is None:  # every build writes new bytes: nothing may be cut off
        assert not cut_off, f"cut off although every output changed: {cut_off}; {detail}"
    assert sorted(o.ran) == sorted(planned - cut_off), f"plan {actions}; {detail}"
    actions = {n: (SKIP if n in cut_off else a) for n, a in actions.items()}
    assert o.ok, f"the run failed: {detail}\n{getattr(runner, 'last_output', '')}"
    for name, action in actions.items():
        if action == BUILD:
            assert o.after[name] is not None and o.after[name] != o.before[name], (name, detail)
        elif action == SKIP:
            # (b) a served record is untouched.
            assert o.before[name] is not None and o.after[name] == o.before[name], (name, detail)
            assert o.raw_after[name] == o.raw_before[name], f"served {name} was rewritten: {detail}"
        else:
            assert action == PRUNE
            assert o.after[name] is None, f"pruned {name} got a record: {detail}"
            assert o.raw_after[name] == o.raw_before[name], f"pruned {name} was touched: {detail}"
    for name in set(case.deps) - set(actions):
        assert o.raw_after[name] == o.raw_before[name], f"{name} is outside the targets: {detail}"
    # (d) the local runner's own report speaks the plan's vocabulary.
    report = getattr(runner, "last_report", None)
    if runner.name == "local":
        assert report is not None
        words = {BUILD: "built", SKIP: "skipped", PRUNE: "pruned"}
        reported = {step_name(s["step"]): s["action"] for s in report.to_json()["steps"]}
        # A cut-off step is served, and the report says why: ``unchanged`` (issue 49).
        expected = {n: "unchanged" if n in cut_off else words[a] for n, a in actions.items()}
        assert reported == expected, detail
    # (e) the tree is consistent afterwards: a new plan (no force) builds nothing.
    after = predict(
        Case(case.deps, case.targets, case.states, case.on_drift, [], case.cascade), prefix
    )
    assert isinstance(after, Plan), after
    assert after.to_build == [], f"still stale after the run: {after.to_build}; {detail}"


def unless_unchanged(o: Outcome) -> set[str]:
    """Steps the plan builds unless their rebuilt upstream's output is unchanged."""
    assert isinstance(o.plan, Plan)
    return {step_name(d.spec.step_id) for d in o.plan.decisions.values() if d.unless_unchanged}


def cut_off_steps(o: Outcome) -> set[str]:
    """Conditional steps whose fn did not run: served by early cutoff."""
    return unless_unchanged(o) - set(o.ran)


def chain_deps(names: Sequence[str]) -> dict[str, list[str]]:
    """``a -> b -> c``: each step reads the one before it."""
    return {n: ([names[i - 1]] if i else []) for i, n in enumerate(names)}
