"""Compile a lowered Marin pipeline into an Airflow 3 DAG file.

This module is pure code generation: it never imports Airflow, and the file it writes never
imports the pipeline when Airflow parses it. The step graph is embedded in the file as data (task
ids, edges, ``name@version``, fingerprint, retries, pool, and the placement a step declares:
queue, pool slots, timeout, pod resources); every task calls
``marin_airflow.runtime.run_step``, which imports the pipeline only when the task runs.

The output is byte-stable: the same pipeline and options always give the same bytes (no
timestamps, no absolute paths, sorted and stable task ids), so it can be committed and checked in
CI with ``marin export airflow ... --check``. Every user-controlled string reaches the file only
through ``repr()`` of plain data, so no name, version or pool can inject code.
"""

from __future__ import annotations

import ast
import difflib
import graphlib
import hashlib
import heapq
import math
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from marin.execution.atomic_file import write_file_atomically
from marin.execution.errors import MarinError, list_names
from marin.execution.pipeline.scope import check_scope
from marin.execution.pipeline.targets import Target
from marin.execution.pipeline.versions import VersionCodex, codex_flags, codex_json
from marin.execution.plan.options import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_ON_DRIFT,
    check_drift_policy,
    check_max_concurrent,
    check_patterns,
)
from marin.execution.vocabulary import OutputScope
from marin_airflow.contract import graph_digest, target_reference

# Airflow's task/DAG id rule is ``^[\w.-]+$`` (at most 250 characters). We keep to ASCII so ids
# look the same in every UI, log line and URL.
_ID_MAX = 250
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_ID_VALID = re.compile(r"^[A-Za-z0-9_.-]+$")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?#LW-]+$")
_QUEUE_VALID = re.compile(r"[A-Za-z0-9_.:-]{1,250}")

EXECUTORS = ("default", "celery", "kubernetes")
MULTI_HOST_EXECUTORS = ("celery", "kubernetes")
"""Executors whose tasks run on many machines: the export refuses what only one host can see."""
MULTI_HOST_RETRIES = 1
"""The default ``--retries`` on a multi-host executor: a task whose worker is lost (killed,
preempted, out of memory) is retried once on another worker instead of failing the run."""
_HOST_LOCAL_SCHEMES = ("file", "local", "memory")
SCHEDULE_PRESETS = ("@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly")


class ExportError(MarinError, ValueError):
    """Bad export input, in the core's ``what / fix / step`` shape (the CLI exits 2)."""


@dataclass(frozen=True)
class TaskEntry:
    """One Airflow task: the Marin step it builds and the task ids it waits for."""

    task_id: str
    step_id: str
    fingerprint: str
    retries: int = 0
    pool: str | None = None
    upstream: tuple[str, ...] = ()
    queue: str | None = None
    pool_slots: int = 1
    timeout_s: int | float | None = None
    pod_resources: tuple[tuple[str, str], ...] = ()
    """Kubernetes quantities (``cpu``, ``memory``, ``nvidia.com/gpu``); only with that executor."""


@dataclass(frozen=True)
class StepInfo:
    """The part of a ``StepSpec`` the DAG file needs (plain data, no callables)."""

    step_id: str
    fingerprint: str
    deps: tuple[str, ...] = ()
    """The step ids this step depends on."""
    retries: int = 0
    pool: str | None = None
    resources: tuple[tuple[str, float], ...] = ()
    """The step's resource amounts (``Resources.amounts()``): pool slots and pod requests."""
    timeout_s: float | None = None
    queue: str | None = None


@dataclass(frozen=True)
class DagOptions:
    """The DAG-level choices baked into a generated file (its id, limits, schedule, params)."""

    dag_id: str
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    prefix: str | None = None
    schedule: str | None = None
    """``None`` (trigger only), ``@once``/``@daily``/..., or a 5-field cron expression."""
    export_command: str = ""
    export_root: str = "."
    """Where to run ``export_command``: a path relative to the DAG file's folder."""
    on_drift: str = DEFAULT_ON_DRIFT
    """The default of the DAG's ``on_drift`` param."""
    executor: str = "default"
    """``kubernetes``: tasks also get an ``executor_config`` pod override from their resources."""
    plan_queue: str | None = None
    """The Airflow queue of the ``marin-plan`` task (None: the executor's default queue)."""
    select: tuple[str, ...] = ()
    """``--select`` globs: the ``marin-plan`` task plans only these steps and what they need."""
    exclude: tuple[str, ...] = ()
    """``--exclude`` globs: left out, with every step that reads them, from that plan."""
    versions: str | None = None
    """The export's version codex as canonical JSON (``--version``/``--override``): the one
    value of the DAG's ``versions`` param; None (no codex): no such param."""
    scope: str = OutputScope.SHARED
    """``--scope``: the one value of the DAG's ``scope`` param; ``user`` adds a ``user`` param."""


# --- task ids ----------------------------------------------------------------------------------


def _short_hash(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def readable_task_id(step_id: str) -> str:
    """``tokenized/wiki@v1`` -> ``tokenized.wiki__v1``: Airflow's characters, still readable."""
    name, _, version = step_id.rpartition("@")
    if not name:
        name, version = version, ""
    base = name.replace("/", ".")
    if version:
        base = f"{base}__{version}"
    base = _ID_UNSAFE.sub("_", base).strip("._") or "step"
    if len(base) > _ID_MAX - 10:
        base = base[: _ID_MAX - 10].rstrip("._-")
    return base


def assign_task_ids(step_ids: Iterable[str]) -> dict[str, str]:
    """Map each step id to a unique, valid, readable task id, independent of input order.

    Step ids whose readable forms collide (``a/b@v0`` and ``a.b@v0``), or that had to be
    shortened or lost characters, get a short hash of the full step id appended, so the mapping
    of one step never depends on which other steps exist in another order.
    """
    ids = sorted(set(step_ids))
    groups: dict[str, list[str]] = {}
    for step_id in ids:
        groups.setdefault(readable_task_id(step_id), []).append(step_id)
    result: dict[str, str] = {}
    for base, members in groups.items():
        if len(members) == 1:
            result[members[0]] = base
        else:
            for step_id in members:
                result[step_id] = f"{base}_{_short_hash(step_id)}"
    taken: dict[str, str] = {}
    for step_id in ids:
        task_id = result[step_id]
        n = 8
        while task_id in taken and taken[task_id] != step_id:
            n += 4
            task_id = f"{readable_task_id(step_id)}_{_short_hash(step_id, n)}"
        taken[task_id] = step_id
        result[step_id] = task_id
        assert _ID_VALID.match(task_id) and len(task_id) <= _ID_MAX, task_id
    return result


def default_dag_id(target: str) -> str:
    """``examples/ngram.py:pipeline`` -> ``ngram_pipeline``; ``pkg.mod:attr`` -> ``mod_attr``."""
    parsed = Target.parse(target)
    dag_id = _ID_UNSAFE.sub("_", f"{parsed.stem}_{parsed.attr.replace('.', '_')}").strip("._")
    return dag_id[:_ID_MAX] or "marin_pipeline"


def check_dag_id(dag_id: str) -> str:
    if not _ID_VALID.match(dag_id) or len(dag_id) > _ID_MAX:
        raise ExportError(
            f"--dag-id {dag_id!r} is not a valid Airflow DAG id",
            f"use at most {_ID_MAX} ASCII letters, digits, '_', '.' or '-'",
        )
    return dag_id


def check_schedule(schedule: str | None) -> str | None:
    """``None``/``none`` -> ``None`` (manual triggers only); presets and cron pass through."""
    if schedule is None or schedule.strip().lower() in ("", "none"):
        return None
    value = schedule.strip()
    if value in SCHEDULE_PRESETS:
        return value
    fields = value.split()
    if len(fields) in (5, 6) and all(_CRON_FIELD.match(f) for f in fields):
        return " ".join(fields)
    raise ExportError(
        f"--schedule {schedule!r} is not a schedule",
        f"use none, {', '.join(SCHEDULE_PRESETS)}, or a cron expression such as '0 3 * * *'",
    )


# --- graph -> tasks ----------------------------------------------------------------------------


def pool_slots(pool: str | None, resources: Sequence[tuple[str, float]]) -> int:
    """Slots a step takes in its pool: its amount of the resource the pool is named after.

    A step asking for ``gpu=2`` in the pool ``gpu`` takes 2 slots (``memory`` counts GiB); in
    any other pool, or without a pool, one slot.
    """
    amounts = dict(resources)
    if pool is None or pool not in amounts:
        return 1
    amount = amounts[pool] / 1024**3 if pool == "memory" else amounts[pool]
    return max(1, math.ceil(amount - 1e-9))


def pod_quantities(resources: Sequence[tuple[str, float]]) -> tuple[tuple[str, str], ...]:
    """Kubernetes requests/limits for a step: ``cpu``, ``memory`` (``Mi``), ``nvidia.com/gpu``.

    Free-form kinds pass through under their own name (``google.com/tpu`` if you name it so).
    """
    out: dict[str, str] = {}
    for kind, amount in resources:
        if kind == "memory":
            out["memory"] = f"{math.ceil(amount / 1024**2)}Mi"
        elif kind == "cpu":
            millis = math.ceil(amount * 1000 - 1e-6)
            out["cpu"] = str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"
        elif kind == "gpu":
            out["nvidia.com/gpu"] = str(math.ceil(amount))
        else:
            out[kind] = f"{amount:g}"
    return tuple(sorted(out.items()))


def _check_steps(steps: Sequence[StepInfo]) -> dict[str, StepInfo]:
    """The steps by id, each once, every dependency among them (the lowering guarantees both)."""
    by_id = {s.step_id: s for s in steps}
    if len(by_id) != len(steps):
        counts: dict[str, int] = {}
        for s in steps:
            counts[s.step_id] = counts.get(s.step_id, 0) + 1
        dup = next(sid for sid, n in counts.items() if n > 1)
        raise ExportError(
            f"step {dup} appears twice in the graph (internal error)", "pass each step once", dup
        )
    for s in steps:
        for dep in s.deps:
            if dep not in by_id:
                raise ExportError(
                    f"step {s.step_id} depends on {dep}, which is not in the graph (internal "
                    "error)",
                    "pass every transitive step",
                    s.step_id,
                )
    return by_id


def _stable_order(by_id: dict[str, StepInfo], task_ids: dict[str, str]) -> list[str]:
    """Step ids dependencies first; among the ready steps, the smallest task id first, so the
    same graph always gives the same DAG file."""
    sorter = graphlib.TopologicalSorter({sid: set(s.deps) for sid, s in by_id.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError as cycle:
        stuck = sorted(set(cycle.args[1]))
        raise ExportError(
            f"dependency cycle among steps {list_names(stuck)}",
            "a step cannot depend on itself; remove one of these edges",
        ) from None
    ready: list[tuple[str, str]] = []
    ordered: list[str] = []
    while sorter.is_active():
        for sid in sorter.get_ready():
            heapq.heappush(ready, (task_ids[sid], sid))
        _, sid = heapq.heappop(ready)
        ordered.append(sid)
        sorter.done(sid)
    return ordered


def plan_tasks(
    steps: Sequence[StepInfo], default_retries: int = 0, executor: str = "default"
) -> list[TaskEntry]:
    """Tasks in a stable topological order (ties broken by task id), edges sorted."""
    by_id = _check_steps(steps)
    task_ids = assign_task_ids(by_id)
    ordered: list[TaskEntry] = []
    for sid in _stable_order(by_id, task_ids):
        s = by_id[sid]
        retries = s.retries if s.retries else default_retries
        ordered.append(
            TaskEntry(
                task_id=task_ids[sid],
                step_id=sid,
                fingerprint=s.fingerprint,
                retries=int(retries),
                pool=s.pool,
                upstream=tuple(sorted({task_ids[d] for d in s.deps})),
                queue=s.queue,
                pool_slots=pool_slots(s.pool, s.resources),
                timeout_s=_whole(s.timeout_s),
                pod_resources=pod_quantities(s.resources) if executor == "kubernetes" else (),
            )
        )
    return ordered


def _whole(value: float | None) -> int | float | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else float(value)


def _amounts(spec: Any) -> tuple[tuple[str, float], ...]:
    resources = getattr(spec, "resources", None)
    amounts = getattr(resources, "amounts", None)
    return tuple(sorted(amounts().items())) if callable(amounts) else ()


def step_infos(specs: Iterable[Any]) -> list[StepInfo]:
    """``StepSpec``s (all transitive, as from ``collect_steps``) -> plain ``StepInfo``s."""
    return [
        StepInfo(
            step_id=spec.step_id,
            fingerprint=spec.fingerprint,
            deps=tuple(dep.step_id for dep in spec.deps),
            retries=int(getattr(spec, "retries", 0) or 0),
            pool=getattr(spec, "pool", None),
            resources=_amounts(spec),
            timeout_s=getattr(spec, "timeout", None),
            queue=getattr(spec, "queue", None),
        )
        for spec in specs
    ]


# --- rendering ---------------------------------------------------------------------------------

_HEADER = '''\
"""Airflow DAG for a Marin pipeline, generated by `marin export airflow`. Do not edit by hand.

Re-run the export command below after changing the pipeline; `--check` verifies in CI that this
file is up to date. Parsing this file imports only `airflow.sdk` and `marin_airflow.runtime`,
never the pipeline: the step graph is embedded below as data. When a task runs, it imports the
pipeline, checks that its step's fingerprint still equals the one recorded here (a mismatch
fails the task: re-export), and builds the step with Marin's `build_step`.

The first task, `marin-plan`, decides every step exactly as `marin plan` does (its log shows
the plan table) under the run's `on_drift`, `force` and `cascade` params; a drifted step under
`on_drift=error`, or a bad param, fails it before any step runs. It is upstream of every step
task and skips the task of each step it does not build, so a cached step costs no task launch:
a step served from its record (cached) or pruned (not built, and nothing being built needs it)
ends "skipped", and the plan task's XComs `skip` (cached) and `prune` list them by step, as its
log does. Step tasks run when no upstream failed (trigger rule `none_failed`): a skipped,
cached upstream never holds back a step that must build; a failed one blocks its dependents.
So a served step below a step that runs (with `cascade` off) keeps its task, which ends
"cached" in its own XCom, as does a step the plan builds that another run built meanwhile.

Artifacts go to the `prefix` param of the run if set, else $MARIN_PREFIX on the worker, else
DEFAULT_PREFIX below, else Marin's local default. Each step task's outlet is the asset alias
`marin:<name@version>`: a task that builds its step adds an event for the Asset at the
artifact's URL to it (a cached step adds none), so DAGs can be scheduled on Marin artifacts.
"""
'''

_BODY = """\
dag = DAG(
    dag_id=DAG_ID,
    description=DESCRIPTION,
    doc_md=__doc__,
    schedule=SCHEDULE,
    start_date=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    max_active_tasks=MAX_CONCURRENT,
    max_active_runs=1,
    params={
        "prefix": Param(
            None,
            type=["null", "string"],
            description="Where artifacts live (path, s3://, gs://, ...). Empty: $MARIN_PREFIX "
            "on the worker, else the exported default.",
        ),
        "on_drift": Param(
            ON_DRIFT,
            enum=["warn", "rebuild", "error"],
            description="A built step whose config changed without a version bump: serve it "
            "with a warning, rebuild it, or fail the run before anything runs.",
        ),
        "on_code_drift": Param(
            "warn",
            enum=["warn", "rebuild", "error"],
            description="A built step whose code changed since it was built (advisory, "
            "docs/caching.md): serve it with a warning, rebuild it in place, or fail the run "
            "before anything runs.",
        ),
        "force": Param(
            [],
            type="array",
            items={"type": "string"},
            description="Steps to rebuild (name or name@version); what was made from them is "
            "rebuilt too, unless cascade is off.",
        ),
        "cascade": Param(
            True,
            type="boolean",
            description="Rebuild steps whose upstream is rebuilt (off: serve them, warning).",
        ),
        "keep_going": Param(
            False,
            type="boolean",
            description="After a step fails, keep building independent branches. Off: no new "
            "step starts (running ones finish), as with marin run.",
        ),<<PARAMS_EXTRA>>
    },
    tags=["marin"],
)
# The tasks are made outside `with dag:` and added in one call: inside it, every operator
# deep-copies the DAG's params (over half the parse time of a 10,000-step DAG), which a task
# reads from its DAG at run time anyway. A MarinOperator has no template fields: step data is
# never rendered as a Jinja template. What every task is called with, besides its step:
COMMON = {
    "target": TARGET,
    "default_prefix": DEFAULT_PREFIX,
    "default_on_drift": ON_DRIFT,
    "export_command": EXPORT_COMMAND,
    "export_root": EXPORT_ROOT,
}<<COMMON_EXTRA>>
tasks = {}
for task_id, step in STEPS.items():
    tasks[task_id] = MarinOperator(
        task_id=task_id,
        task_display_name=step["step"],
        retries=step["retries"],
        pool=step["pool"],
        # A skipped upstream is one the plan served or pruned: it must not skip this task.
        trigger_rule=TriggerRule.NONE_FAILED,
        marin_call=run_step,
        marin_kwargs={**COMMON, "step": step["step"], "fingerprint": step["fingerprint"]},
        **task_placement(step),
        # Outlet: the step's asset alias, filled with the real artifact URL when the task
        # builds the step (never on a cache hit); inlets: its dependencies' aliases.
        **task_assets(step, STEPS),
    )
# The plan task, upstream of every step, is added last: Airflow's cycle check walks the tasks in
# the order they were added, and from the plan task first it would rescan its children once
# per child (quadratic in the number of steps).
tasks[PLAN_TASK_ID] = MarinPlanOperator(
    task_id=PLAN_TASK_ID,
    task_display_name="marin plan",
    marin_call=plan_steps,
    marin_kwargs={**COMMON, "graph_digest": GRAPH_DIGEST<<PLAN_KWARGS>>},<<PLAN_EXTRA>>
)
dag.add_tasks(tasks.values())
# Edges go into each task's public upstream/downstream task id sets, which is what `a >> b`
# writes too; but `>>` also hashes the whole DAG for every edge (O(tasks x edges)). The
# plan task runs first and is a direct upstream of every step, which it may skip.
for task_id, step in STEPS.items():
    upstream_ids = [PLAN_TASK_ID, *step["upstream"]]
    tasks[task_id].upstream_task_ids.update(upstream_ids)
    for upstream in upstream_ids:
        tasks[upstream].downstream_task_ids.add(task_id)
"""


_SIMPLE_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def py_string(text: str) -> str:
    """A double-quoted Python literal for ``text`` (the style ``ruff format`` keeps).

    Printable characters, including non-ASCII letters, stay readable; quotes, backslashes,
    line breaks, control characters, lone surrogates and other unprintables are escaped.
    """
    out = ['"']
    for ch in text:
        if ch in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}"
                if code < 0x10000
                else f"\\U{code:08x}"
            )
    out.append('"')
    return "".join(out)


def _finite_float(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def _r(value: Any) -> str:
    """A Python literal for plain data; the only way user strings enter the file."""
    if isinstance(value, str):
        text = py_string(value)
    elif value is None or isinstance(value, bool | int) or _finite_float(value):
        text = repr(value)
    else:  # pragma: no cover - the renderer only embeds str, int and None
        raise ExportError(
            f"cannot embed a {type(value).__name__} in a DAG file",
            "pass plain data (str, numbers, lists, dicts)",
        )
    if ast.literal_eval(text) != value:  # pragma: no cover - a bug in py_string
        raise ExportError(f"cannot embed {value!r} safely", "report this as a bug")
    return text


def _r_list(values: Sequence[str]) -> str:
    """A list literal of strings, each through ``_r``."""
    return "[" + ", ".join(_r(v) for v in values) + "]"


def _list_annotation(values: Sequence[str]) -> str:
    """``: list[str]`` for an empty list, whose type a type checker cannot infer."""
    return "" if values else ": list[str]"


def _placement_lines(t: TaskEntry) -> list[str]:
    """Per-task placement keys, only those a step sets (``runtime.task_placement`` maps them)."""
    lines = []
    if t.queue is not None:
        lines.append(f'        "queue": {_r(t.queue)},')
    if t.pool_slots != 1:
        lines.append(f'        "pool_slots": {_r(int(t.pool_slots))},')
    if t.timeout_s is not None:
        lines.append(f'        "timeout_s": {_r(t.timeout_s)},')
    if t.pod_resources:
        items = ", ".join(f"{_r(k)}: {_r(v)}" for k, v in t.pod_resources)
        lines.append(f'        "pod_resources": {{{items}}},')
    return lines


_VERSIONS_PARAM = """
        "versions": Param(
            VERSIONS,
            enum=[VERSIONS],
            description="The version codex the DAG was exported with (--version/--override), "
            "as JSON; another one needs another export, since the step tasks are its steps.",
        ),"""
_SCOPE_PARAM = """
        "scope": Param(
            <<SCOPE>>,
            enum=[<<SCOPE>>],
            description="The output scope the DAG was exported with (--scope); another one "
            "needs another export.",
        ),"""
_USER_PARAM = """
        "user": Param(
            None,
            type=["null", "string"],
            description="Whose folder (<prefix>/users/<user>/) this run writes: one path "
            "segment. Empty: the user who triggered the run, else $MARIN_USER on the worker.",
        ),"""


def render_dag(target: str, tasks: Sequence[TaskEntry], options: DagOptions) -> str:
    """The DAG file text. Deterministic: a function of its arguments only."""
    check_dag_id(options.dag_id)
    check_max_concurrent(options.max_concurrent)  # the core's check: refuse what a run would
    lines = [_HEADER, *_IMPORTS]
    lines += _constants(target, tasks, options)
    lines += _optional_constants(options)
    lines.append("")
    lines += _steps_literal(tasks)
    lines.append("")
    lines.append(_body(options))
    text = "\n".join(lines)
    if any(len(line) > 100 for line in text.splitlines()):
        # Long step names make long literals; keep linters quiet about a generated file.
        text = "# ruff: noqa: E501\n" + text
    return text


_IMPORTS = (
    "from __future__ import annotations\n",
    "import datetime\n",
    "from airflow.sdk import DAG, Param, TriggerRule\n",
    "from marin_airflow.assets import task_assets",
    "from marin_airflow.operator import MarinOperator, MarinPlanOperator",
    "from marin_airflow.runtime import PLAN_TASK_ID, plan_steps, run_step, task_placement\n",
)


def _constants(target: str, tasks: Sequence[TaskEntry], options: DagOptions) -> list[str]:
    """The constants every DAG file has."""
    digest = graph_digest((t.step_id, t.fingerprint) for t in tasks)
    return [
        "# The command that generated this file, and where to run it (relative to this",
        "# file's folder). Re-run it after changing the pipeline.",
        f"EXPORT_COMMAND = {_r(options.export_command)}",
        f"EXPORT_ROOT = {_r(options.export_root)}",
        "# The pipeline: a module path, or a file path relative to this file's folder.",
        f"TARGET = {_r(target)}",
        f"DAG_ID = {_r(options.dag_id)}",
        f"DESCRIPTION = {_r('Marin pipeline ' + target)}",
        f"SCHEDULE = {_r(options.schedule)}",
        f"MAX_CONCURRENT = {_r(int(options.max_concurrent))}",
        f"DEFAULT_PREFIX = {_r(options.prefix)}",
        "# The default drift policy of a run (its `on_drift` param overrides it).",
        f"ON_DRIFT = {_r(check_drift_policy(options.on_drift))}",
        "# A hash of every step id and fingerprint below: tasks warn when the pipeline's",
        "# graph changed (steps added or removed) since the export.",
        f"GRAPH_DIGEST = {_r(digest)}",
    ]


def _optional_constants(options: DagOptions) -> list[str]:
    """Constants written only when their option is set, so files exported without them keep
    their bytes."""
    lines = []
    if options.executor in MULTI_HOST_EXECUTORS:
        lines.append("# Tasks run on many machines: each refuses a prefix only its own host sees.")
        lines.append("SHARED_PREFIX_ONLY = True")
    if options.plan_queue is not None:
        lines.append("# The Airflow queue of the marin-plan task.")
        lines.append(f"PLAN_QUEUE = {_r(options.plan_queue)}")
    if options.select or options.exclude:
        lines.append("# The export's --select/--exclude: STEPS holds only these steps and what")
        lines.append("# they need, and marin-plan plans just them. Re-export to change them.")
        lines.append(f"SELECT{_list_annotation(options.select)} = {_r_list(options.select)}")
        lines.append(f"EXCLUDE{_list_annotation(options.exclude)} = {_r_list(options.exclude)}")
    if options.versions is not None:
        lines.append(
            "# The version codex of the export (JSON data): the only `versions` a run takes."
        )
        lines.append(f"VERSIONS = {_r(options.versions)}")
    if options.scope != OutputScope.SHARED:
        lines.append("# The output scope of the export: the only `scope` a run takes.")
        lines.append(f"SCOPE = {_r(str(options.scope))}")
    return lines


def _steps_literal(tasks: Sequence[TaskEntry]) -> list[str]:
    """``STEPS``: Airflow task id -> the Marin step it builds, as a literal."""
    lines = [
        "# Airflow task id -> the Marin step it builds. `upstream`: the task ids it",
        "# waits for, exactly the deps of the lowered StepSpec graph.",
    ]
    if not tasks:
        return [*lines, "STEPS: dict[str, dict] = {}"]
    lines.append("STEPS = {")
    for t in tasks:
        lines.append(f"    {_r(t.task_id)}: {{")
        lines.append(f'        "step": {_r(t.step_id)},')
        lines.append(f'        "fingerprint": {_r(t.fingerprint)},')
        lines.append(f'        "retries": {_r(int(t.retries))},')
        lines.append(f'        "pool": {_r(t.pool)},')
        lines.extend(_placement_lines(t))
        if t.upstream:
            lines.append('        "upstream": [')
            lines.extend(f"            {_r(u)}," for u in t.upstream)
            lines.append("        ],")
        else:
            lines.append('        "upstream": [],')
        lines.append("    },")
    lines.append("}")
    return lines


def _run_params(options: DagOptions) -> str:
    """The params besides the common ones: ``versions`` and ``scope`` (each the one value the
    export allows) when exported with a codex or a user scope, and then ``user``."""
    user = options.scope != OutputScope.SHARED
    if options.versions is None and not user:
        return ""
    scope = _SCOPE_PARAM.replace("<<SCOPE>>", "SCOPE" if user else _r(str(options.scope)))
    versions = _VERSIONS_PARAM if options.versions is not None else ""
    return versions + scope + (_USER_PARAM if user else "")


def _body(options: DagOptions) -> str:
    """The DAG and its tasks (``_BODY`` with the parts the options ask for)."""
    common_extra = ""
    if options.executor in MULTI_HOST_EXECUTORS:
        common_extra += '\nCOMMON["shared_prefix_only"] = SHARED_PREFIX_ONLY'
    if options.versions is not None:
        common_extra += '\nCOMMON["versions"] = VERSIONS'
    if options.scope != OutputScope.SHARED:
        common_extra += '\nCOMMON["scope"] = SCOPE'
    body = _BODY.replace("<<COMMON_EXTRA>>", common_extra)
    body = body.replace("<<PARAMS_EXTRA>>", _run_params(options))
    # The selection is the plan task's alone: a step task lowers only its step and ancestors.
    selected = options.select or options.exclude
    body = body.replace(
        "<<PLAN_KWARGS>>", ', "select": SELECT, "exclude": EXCLUDE' if selected else ""
    )
    return body.replace(
        "<<PLAN_EXTRA>>", "\n    queue=PLAN_QUEUE," if options.plan_queue is not None else ""
    )


# --- targets and paths -------------------------------------------------------------------------


_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def export_root(dag_dir: str, target: str) -> str:
    """Where the recorded export command runs: the project holding the DAG folder.

    The nearest ancestor of ``dag_dir`` (itself included) with a ``pyproject.toml``,
    ``setup.py``, ``setup.cfg`` or ``.git`` that also holds a file target; else ``dag_dir``. The
    command is recorded relative to it, so it reads the same in every checkout of the project.
    """
    dag_dir = os.path.abspath(dag_dir)
    parsed = Target.parse(target)
    target_path = os.path.abspath(parsed.location) if parsed.is_file else None
    current = dag_dir
    while True:
        marked = any(os.path.exists(os.path.join(current, m)) for m in _ROOT_MARKERS)
        if marked and (target_path is None or _is_within(target_path, current)):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return dag_dir
        current = parent


def _is_within(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _rel(path: str, start: str) -> str:
    return os.path.relpath(os.path.abspath(path), start).replace(os.sep, "/")


def export_command(
    target: str,
    out: str,
    *,
    root: str,
    dag_id: str | None,
    max_concurrent: int,
    prefix: str | None,
    schedule: str | None,
    retries: int,
    on_drift: str = DEFAULT_ON_DRIFT,
    executor: str = "default",
    plan_queue: str | None = None,
    select: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> str:
    """The command that regenerates the file, run in ``root``, with paths relative to it."""
    parsed = Target.parse(target)
    shown = parsed.with_location(_rel(parsed.location, root)) if parsed.is_file else parsed
    shown_target = str(shown)
    argv = ["marin", "export", "airflow", shown_target, "-o", _rel(out, root)]
    if dag_id is not None:
        argv += ["--dag-id", dag_id]
    if max_concurrent != DEFAULT_MAX_CONCURRENT:
        argv += ["--max-concurrent", str(max_concurrent)]
    if prefix is not None:
        argv += ["--prefix", prefix]
    if schedule is not None:
        argv += ["--schedule", schedule]
    if retries != default_retries(executor):
        argv += ["--retries", str(retries)]
    if on_drift != DEFAULT_ON_DRIFT:
        argv += ["--on-drift", on_drift]
    if executor != "default":
        argv += ["--executor", executor]
    if plan_queue is not None:
        argv += ["--plan-queue", plan_queue]
    for flag, patterns in (("--select", select), ("--exclude", exclude)):
        for pattern in patterns:
            argv += [flag, pattern]
    return shlex.join(argv)


def default_retries(executor: str) -> int:
    """``--retries`` when not given: none on one host, one where a worker can be lost."""
    return MULTI_HOST_RETRIES if executor in MULTI_HOST_EXECUTORS else 0


def check_multi_host(target: str, dag_dir: str, prefix: str | None, executor: str) -> None:
    """Refuse what only one host can see when tasks run on many (``celery``, ``kubernetes``).

    The artifacts must live on storage every worker reaches (not a local path or ``memory://``,
    whose lease is also only safe on one host), and a pipeline file must be inside the DAG
    file's folder, which is what Airflow ships to every worker (or be a module path, imported
    from the package installed on every worker).
    """
    if executor not in MULTI_HOST_EXECUTORS:
        return
    flag = f"--executor {executor}"
    if prefix is None:
        raise ExportError(
            f"{flag} needs --prefix: tasks run on many machines, and without a baked prefix a "
            "worker with no $MARIN_PREFIX would write to its own disk",
            "pass --prefix s3://bucket/path (or gs://..., any storage every worker reaches)",
        )
    scheme = prefix.split("://", 1)[0].lower() if "://" in prefix else "file"
    if scheme in _HOST_LOCAL_SCHEMES:
        raise ExportError(
            f"{flag} --prefix {prefix!r} is on one host's {scheme} storage: other workers "
            "cannot read its artifacts, and its leases only hold on one host",
            "pass --prefix s3://bucket/path (or gs://..., any storage every worker reaches)",
        )
    parsed = Target.parse(target)
    if parsed.is_file and not _is_within(
        os.path.abspath(parsed.location), os.path.abspath(dag_dir)
    ):
        raise ExportError(
            f"{flag}: the pipeline file {parsed.location} is outside the DAG folder {dag_dir}, "
            "which is all Airflow ships to its workers",
            f"use a module path (package.module:{parsed.attr}) installed on every worker, or "
            "move the file into the DAG folder",
        )


# --- the whole export --------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportResult:
    """A generated DAG file, not yet written: its path, text, tasks and the command that
    regenerates it (run in ``root``)."""

    path: str
    text: str
    tasks: tuple[TaskEntry, ...]
    dag_id: str
    command: str
    """The export command recorded in the file (re-run it in ``root`` to regenerate)."""
    root: str

    @property
    def pools(self) -> list[str]:
        return sorted({t.pool for t in self.tasks if t.pool is not None})


def output_file(out: str, dag_id: str) -> str:
    """``-o dags/`` -> ``dags/<dag_id>.py``; ``-o dags/x.py`` -> that file."""
    if out.endswith(".py"):
        return out
    return os.path.join(out, f"{dag_id}.py")


def lower_target(
    target: str,
    select: Sequence[str] = (),
    exclude: Sequence[str] = (),
    versions: VersionCodex | None = None,
) -> list[Any]:
    """Load and lower a target: every transitive ``StepSpec``, dependencies first; with
    ``select``/``exclude``, only the steps ``marin plan`` would show with them; ``versions``:
    the codex of steps with ``version=None``."""
    from marin.execution.pipeline.lower import lower_graph
    from marin.execution.pipeline.targets import load_target
    from marin.selection import select_graph

    graph = lower_graph(load_target(target), versions=versions)
    return list(select_graph(graph, select, exclude).steps)


def build_export(
    target: str,
    out: str = "dags",
    *,
    dag_id: str | None = None,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    prefix: str | None = None,
    schedule: str | None = None,
    retries: int | None = None,
    on_drift: str = DEFAULT_ON_DRIFT,
    specs: Sequence[Any] | None = None,
    executor: str = "default",
    plan_queue: str | None = None,
    select: Sequence[str] = (),
    exclude: Sequence[str] = (),
    versions: VersionCodex | None = None,
    scope: str = OutputScope.SHARED,
) -> ExportResult:
    """Generate (but do not write) the DAG file for ``target``.

    ``versions``: the codex of steps with ``version=None``, embedded as JSON data (the DAG's
    ``versions`` param, which a run can set to that value only). ``scope``: the one value of
    the DAG's ``scope`` param; ``user`` runs write under ``<prefix>/users/<user>/`` (``user``
    param). ``specs`` may be passed when the caller has already lowered the target. ``retries`` (for
    steps that declare none) defaults to :func:`default_retries` of the executor. ``select``
    and ``exclude`` (globs, as for ``marin plan``) keep only part of the pipeline: the file
    holds those steps, and its ``marin-plan`` task plans just them.
    """
    Target.parse(target)
    scope = check_scope(scope)
    # Sorted: the selection is a set of globs, so its spelling never changes the file's bytes.
    select = tuple(sorted(check_patterns(select, "--select")))
    exclude = tuple(sorted(check_patterns(exclude, "--exclude")))
    retries = _check_options(executor, retries, plan_queue, prefix)
    chosen_id = check_dag_id(dag_id) if dag_id is not None else default_dag_id(target)
    path = output_file(out, chosen_id)
    dag_dir = os.path.dirname(os.path.abspath(path))
    check_multi_host(target, dag_dir, prefix, executor)
    root = export_root(dag_dir, target)
    steps = step_infos(_export_specs(target, specs, select, exclude, versions))
    tasks = plan_tasks(steps, default_retries=retries, executor=executor)
    command = export_command(
        target, out, root=root, dag_id=dag_id, max_concurrent=max_concurrent, prefix=prefix,
        schedule=schedule, retries=retries, on_drift=on_drift, executor=executor,
        plan_queue=plan_queue, select=select, exclude=exclude,
    )  # fmt: skip
    options = DagOptions(
        dag_id=chosen_id,
        max_concurrent=max_concurrent,
        prefix=prefix,
        schedule=check_schedule(schedule),
        on_drift=check_drift_policy(on_drift),
        export_root=_rel(root, dag_dir),
        export_command=command + codex_flags(versions) + _scope_flag(scope),
        executor=executor, plan_queue=plan_queue, select=select, exclude=exclude,
        versions=None if versions is None else codex_json(versions), scope=scope,
    )  # fmt: skip
    text = render_dag(target_reference(target, dag_dir), tasks, options)
    return ExportResult(path, text, tuple(tasks), chosen_id, options.export_command, root)


def _scope_flag(scope: str) -> str:
    """`` --scope user`` for the recorded export command ("" for the default, shared)."""
    return "" if scope == OutputScope.SHARED else f" --scope {scope}"


def _check_options(
    executor: str, retries: int | None, plan_queue: str | None, prefix: str | None
) -> int:
    """Refuse a bad ``--executor``, ``--retries``, ``--plan-queue`` or a prefix holding
    credentials; the retries to use (:func:`default_retries` when not given)."""
    if executor not in EXECUTORS:
        raise ExportError(
            f"--executor {executor!r} is not known", f"use one of {', '.join(EXECUTORS)}"
        )
    if retries is None:
        retries = default_retries(executor)
    if retries < 0:
        raise ExportError(f"--retries {retries}", "use a whole number, 0 or more")
    if plan_queue is not None and not _QUEUE_VALID.fullmatch(plan_queue):
        raise ExportError(
            f"--plan-queue {plan_queue!r} is not a queue name",
            f"use 1 to {_ID_MAX} ASCII letters, digits, '_', '.', '-' or ':'",
        )
    if prefix is not None:
        from marin.execution.store.location import refuse_credentials

        refuse_credentials(prefix)  # it would be written into the DAG file
    return retries


def _export_specs(
    target: str,
    specs: Sequence[Any] | None,
    select: Sequence[str],
    exclude: Sequence[str],
    versions: VersionCodex | None,
) -> list[Any]:
    """The steps the file holds: ``specs`` (already lowered) or the target lowered, cut to
    the selection."""
    if specs is None:
        return lower_target(target, select, exclude, versions)
    if not (select or exclude):
        return list(specs)
    from marin.execution.pipeline.graph import as_graph
    from marin.selection import select_graph

    return list(select_graph(as_graph(specs), select, exclude).steps)


def write_export(result: ExportResult) -> bool:
    """Write the file if its bytes changed; return True when it was (re)written."""
    data = result.text.encode("utf-8")
    try:
        with open(result.path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        pass
    # Atomic: the DAG processor never sees half a file, and a failed write leaves nothing.
    write_file_atomically(os.path.abspath(result.path), data, make_parents=True)
    return True


def embedded_steps(text: str) -> dict[str, dict[str, Any]] | None:
    """The ``STEPS`` data of a generated file, read with ``ast`` (never executed)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        value: ast.expr | None = None
        names: list[ast.expr] = []
        if isinstance(node, ast.AnnAssign):
            names, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            names, value = list(node.targets), node.value
        if value is not None and any(isinstance(t, ast.Name) and t.id == "STEPS" for t in names):
            try:
                data = ast.literal_eval(value)
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def diff_summary(old: str | None, new: str, path: str, max_lines: int = 60) -> str:
    """Why ``path`` is stale: steps added/removed/changed, then a unified diff (truncated)."""
    if old is None:
        return f"{path} does not exist; run the export command to create it"
    parts = [f"{path} is stale:"]
    old_steps, new_steps = embedded_steps(old), embedded_steps(new) or {}
    if old_steps is None:
        parts.append("  the file on disk is not a DAG file generated by marin export airflow")
    else:
        old_by_step = {v.get("step"): v for v in old_steps.values() if isinstance(v, dict)}
        new_by_step = {v["step"]: v for v in new_steps.values()}
        added = sorted(set(new_by_step) - set(old_by_step), key=str)
        removed = sorted(set(old_by_step) - set(new_by_step), key=str)
        changed = sorted(
            (
                s
                for s in set(new_by_step) & set(old_by_step)
                if {k: v for k, v in new_by_step[s].items()}
                != {k: v for k, v in old_by_step[s].items()}
            ),
            key=str,
        )
        for label, items in (("added", added), ("removed", removed), ("changed", changed)):
            if items:
                shown = ", ".join(str(i) for i in items[:10])
                more = f" and {len(items) - 10} more" if len(items) > 10 else ""
                parts.append(f"  {len(items)} step(s) {label}: {shown}{more}")
        for s in changed[:10]:
            fields = sorted(
                k
                for k in set(new_by_step[s]) | set(old_by_step[s])
                if new_by_step[s].get(k) != old_by_step[s].get(k)
            )
            parts.append(f"    {s}: {', '.join(fields)}")
        if not (added or removed or changed):
            parts.append("  the steps are the same; DAG options or the file layout differ")
    diff = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), f"{path} (on disk)", f"{path} (now)", lineterm=""
        )
    )
    parts.append(f"  {sum(1 for d in diff if d[:1] in '+-') - 2} line(s) differ:")
    parts.extend(diff[:max_lines])
    if len(diff) > max_lines:
        parts.append(f"... ({len(diff) - max_lines} more diff lines)")
    return "\n".join(parts)


def check_export(result: ExportResult) -> tuple[bool, str]:
    """``(fresh, message)``: is the file on disk byte-identical to what we would generate?"""
    try:
        with open(result.path, encoding="utf-8", errors="surrogateescape") as f:
            old: str | None = f.read()
    except FileNotFoundError:
        old = None
    if old == result.text:
        return True, f"{result.path} is up to date ({len(result.tasks)} tasks)"
    return False, diff_summary(old, result.text, result.path)


def pools_hint(result: ExportResult) -> str:
    """Commands that create the pools the DAG uses (Airflow fails tasks in missing pools)."""
    if not result.pools:
        return ""
    lines = [f"DAG {result.dag_id} uses Airflow pools that must exist before it runs:"]
    for pool in result.pools:
        users = sum(1 for t in result.tasks if t.pool == pool)
        lines.append(
            f"  airflow pools set {shlex.quote(pool)} <slots> "
            f"{shlex.quote(f'Marin pool used by {users} step(s) of {result.dag_id}')}"
        )
    return "\n".join(lines)
