"""Rendering a plan: the table a person reads and the JSON a machine reads.

The JSON schema is versioned (``schema``) and documented in docs/plan-json.md; within a schema
version fields are only ever added, never renamed, removed or retyped
(tests/ux/test_plan_json.py holds the contract).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.execution.builder.clearing import refusal_before_writing
from marin.execution.builder.lineage.names import artifact_names
from marin.execution.errors import MarinError, list_names
from marin.execution.pipeline.resources import describe_placement, placement_of
from marin.execution.plan.decide import ACTIONS, STATUSES, Decision, Plan
from marin.execution.plan.read import IO_PARALLELISM
from marin.execution.plan.resume_verdict import ResumeVerdict
from marin.execution.plan.scope import scope_of
from marin.execution.plan.sweep_counts import sweep_counts
from marin.execution.remote.fence import job_not_reused
from marin.execution.remote.view import (
    describe_job,
    describe_other_job,
    job_view,
    other_version_jobs,
)
from marin.execution.store.listed_folders import ListedFolders
from marin.execution.store.location import Location
from marin.execution.vocabulary import Action, ShownStatus, StoredStatus
from marin.terminal_text import safe_rich, safe_text

if TYPE_CHECKING:
    from rich.table import Table

log = logging.getLogger("marin")

PLAN_SCHEMA = 1
SHOWN = tuple(ShownStatus)
"""The status column's words, in the order the summary counts them."""
SYMBOLS = {
    ShownStatus.BUILT: "✓",
    ShownStatus.STALE: "↑",
    ShownStatus.DRIFT: "≠",
    ShownStatus.RUN: "▶",
    ShownStatus.FORCED: "▶",
    ShownStatus.DEV: "↻",
    ShownStatus.FAILED_BEFORE: "✗",
    ShownStatus.PRUNED: "·",
    ShownStatus.FOREIGN: "⊘",
}
STYLES = {
    ShownStatus.BUILT: "green",
    ShownStatus.STALE: "yellow",
    ShownStatus.DRIFT: "magenta",
    ShownStatus.RUN: "yellow",
    ShownStatus.FORCED: "yellow",
    ShownStatus.DEV: "cyan",
    ShownStatus.FAILED_BEFORE: "red",
    ShownStatus.PRUNED: "dim",
    ShownStatus.FOREIGN: "red",
}
ORDER = STATUSES
DEFAULT_WIDTH = 250
"""Without a terminal (a pipe, a file) and without ``$COLUMNS``: wide enough never to wrap."""
OUTPUT_COLUMN_MIN_WIDTH = 150
FINGERPRINT_COLUMN_MIN_WIDTH = 100


def shown_status(d: Decision) -> ShownStatus:
    """The status a person reads next to ``d.action``: never one that contradicts it."""
    if d.status == StoredStatus.FOREIGN:
        return ShownStatus.FOREIGN  # another step's record: never served, never built over
    if d.action == Action.PRUNE:
        return ShownStatus.PRUNED
    if d.forced:
        return ShownStatus.FORCED
    if d.status in (StoredStatus.DEV, StoredStatus.FAILED_BEFORE, StoredStatus.DRIFT):
        return ShownStatus(d.status)
    if d.stale:
        return ShownStatus.STALE  # built, but an upstream is (or was) rebuilt since
    # ``built`` when served, ``run`` when built for want of a record.
    return ShownStatus(d.status)


Refusals = Mapping[str, MarinError]
"""By output path: the error a run raises for a step the plan builds, before writing anything."""


def refused_if(d: Decision) -> str:
    """When a run refuses ``d``'s build: "" (whenever it runs), or ``if the output of X
    changes`` for a build that only an upstream rebuilt in this run makes (``unless_unchanged``):
    the run decides it again once that upstream commits, and serves it, unrefused, when the
    output is unchanged (early cutoff)."""
    ids = d.unless_unchanged
    if not ids:
        return ""
    return f"if {'the output of' if len(ids) == 1 else 'an output of'} {list_names(ids)} changes"


def build_refusals(plan: Plan, location: Location) -> dict[str, MarinError]:
    """What a run refuses to build, of the steps the plan builds, and why (by output path):
    another step's record in the way (``Decision.refused``), or a rule a build asks before it
    writes anything (``refusal_before_writing``: inside another step's output, data Marin
    never wrote, a registered build, ...). Only steps decided ``build`` are looked at, so a
    plan of a built pipeline reads nothing more; each folder above them is listed once
    (``ListedFolders``), however many steps share it. Advisory: a look that fails to read
    shows nothing (the run will say)."""
    listed = ListedFolders(location)
    building = [d for d in plan.decisions.values() if d.action == Action.BUILD]
    slow = not (location.is_local or location.is_memory) and len(building) > 1
    if slow:  # an object store: the steps' reads overlap, the listings are still once each
        with ThreadPoolExecutor(min(IO_PARALLELISM, len(building)), "marin-refusals") as pool:
            found = dict(pool.map(lambda d: _refusal(d, location, listed), building))
    else:
        found = dict(_refusal(d, location, listed) for d in building)
    return {path: refusal for path, refusal in found.items() if refusal is not None}


def _refusal(
    d: Decision, location: Location, listed: ListedFolders
) -> tuple[str, MarinError | None]:
    """``d``'s output path, with the refusal a run raises for it (None: none, or unreadable)."""
    path = d.spec.output_path
    refused = d.refused()
    if refused is not None:
        return path, refused
    try:
        return path, refusal_before_writing(
            location, d.spec, d.record, d.stored_status, listed.exists
        )
    except OSError as exc:  # storage that cannot be read (a StorageError too): nothing to say
        log.debug("could not look at %s before a run: %s", d.spec.step_id, exc)
    except MarinError as exc:
        return path, exc  # a manifest a build cannot trust: a run raises it too
    except Exception as exc:  # advisory: never fails the plan
        log.debug("could not look at %s before a run: %s", d.spec.step_id, exc)
    return path, None


def plan_summary(plan: Plan, refused: Refusals | None = None) -> str:
    """``11 steps: 6 built, 4 drift, 1 pruned; a run would build 0, skip 10, prune 1``, with
    ``build 2 (1 refused)`` when a run refuses to build a step it builds (``refused``).

    The statuses are those of the table, so each one belongs to one action and the two halves
    count the same steps two ways, never one thing in both."""
    decisions = list(plan.decisions.values())
    counts = Counter(shown_status(d) for d in decisions)
    actions = Counter(d.action for d in decisions)
    parts = [f"{counts[s]} {'to run' if s == ShownStatus.RUN else s}" for s in SHOWN if counts[s]]
    would = [f"build {actions[Action.BUILD]}" + _refused_counts(plan, refused or {})]
    would += [f"{a} {actions[a]}" for a in (Action.SKIP, Action.PRUNE) if actions[a]]
    return f"{len(decisions)} steps: " + ", ".join(parts) + "; a run would " + ", ".join(would)


def _refused_counts(plan: Plan, refused: Refusals) -> str:
    """`` (1 refused)``, `` (1 refused, 2 more if an upstream output changes)``, or ""."""
    maybe = sum(
        1 for d in plan.decisions.values() if d.spec.output_path in refused and refused_if(d)
    )
    parts = [f"{len(refused) - maybe} refused"] if len(refused) > maybe else []
    if maybe:
        parts.append(f"{maybe} {'more ' if parts else ''}refused if an upstream output changes")
    return f" ({', '.join(parts)})" if parts else ""


def would_change_anything(plan: Plan) -> bool:
    """``--exit-code``: a run would build a step, or serve one although its config drifted or
    an upstream was rebuilt since (``--no-cascade``). Code drift is advisory: it counts only
    where the run rebuilds it (``--on-code-drift rebuild``), as a build."""
    return any(
        d.action == Action.BUILD or (d.action == Action.SKIP and (d.drift or d.stale))
        for d in plan.decisions.values()
    )


def plan_json(plan: Plan, location: Location) -> dict[str, Any]:
    """The plan as ``marin plan --json`` prints it (docs/plan-json.md)."""
    decisions = list(plan.decisions.values())
    refused = build_refusals(plan, location)
    counts = Counter(d.status for d in decisions)
    actions = Counter(d.action for d in decisions)
    return {
        "schema": PLAN_SCHEMA,
        "prefix": location.url,
        "options": {
            "on_drift": plan.policy.on_drift,
            "force": sorted(plan.policy.force),
            "cascade": plan.policy.cascade,
            "on_code_drift": plan.policy.on_code_drift,
        },
        "summary": {
            "total": len(decisions),
            **{a: counts[a] for a in ORDER},
            "actions": {a: actions[a] for a in ACTIONS},
            # Steps whose code changed since their record, whatever a run does with them.
            "code_drift": sum(1 for d in decisions if d.code_drift),
            # Steps a run would build, and refuses to before writing anything (not those it
            # refuses only if an upstream output changes: ``refusal.conditional``).
            "refused": sum(
                1 for d in decisions if d.spec.output_path in refused and not refused_if(d)
            ),
        },
        "steps": [
            _step_json(d, location, _scoped(plan), plan, refused.get(d.spec.output_path))
            for d in decisions
        ],
        **_sweep_json(plan),
    }


def _sweep_json(plan: Plan) -> dict[str, Any]:
    counts = sweep_counts(plan)
    return {} if counts is None else {"sweep": counts.to_json()}


def _step_json(
    d: Decision, location: Location, scoped: bool, plan: Plan, refused: MarinError | None
) -> dict[str, Any]:
    return {
        "step": d.spec.step_id,
        "name": d.spec.name,
        "version": d.spec.version,
        "fingerprint": d.spec.fingerprint,
        "output_path": location.url_for(d.spec.output_path),
        # How OpenLineage, Airflow and Prefect name the output (docs/lineage.md).
        "artifact": artifact_names(location, d.spec.output_path).to_json(),
        "status": d.status,
        "action": d.action,
        "reason": d.reason,
        "drift": list(d.drift),
        "stale": list(d.stale),
        # Issue 25 (docs/caching.md): what changed in the step's code since its record; the
        # upstream steps whose rebuild makes it build unless their output is unchanged; the
        # upstream steps rebuilt since its record with the output it consumed.
        "code_drift": list(d.code_drift),
        "unless_unchanged": list(d.unless_unchanged),
        "unchanged": list(d.unchanged),
        # Only for a resumable step built over an earlier attempt (docs/reliability.md).
        **({"resume": resume_json(d.resume)} if d.resume is not None else {}),
        "lineage": d.lineage,
        "stored_fingerprint": d.record.fingerprint if d.record is not None else None,
        "build_id": (d.record.build_id or None) if d.record is not None else None,
        "deps": [dep.step_id for dep in d.spec.deps],
        # Only for steps with placement options (docs/resources.md), so plans of pipelines
        # without any are unchanged.
        **({"placement": placement_of(d.spec)} if describe_placement(d.spec) else {}),
        # Only for steps whose version the run's codex gave (docs/marin.md): "default"/"override".
        **({"version_from": d.spec.provenance["version_from"]} if _deferred(d) else {}),
        # Only in runs with user-scope steps (docs/marin.md): where it reads and would write.
        **(
            {"scope": dict(zip(("reads", "writes"), scope_of(d.spec), strict=True))}
            if scoped
            else {}
        ),
        **({"job": job} if (job := _job(d, location, plan)) is not None else {}),
        # Only for a remote step with a job of another version still running (issue 53.10).
        **({"other_jobs": others} if (others := _other_jobs(d, location)) else {}),
        # Only for a step a run would build and refuses to (build_refusals): the run's error.
        **({"refusal": refusal_json(refused, d)} if refused is not None else {}),
    }


def refusal_json(refused: MarinError, d: Decision) -> dict[str, Any]:
    """A run's refusal in ``plan --json``: the error's type, what is wrong and the fix, and
    whether the run refuses only if an upstream output changes (``refused_if``)."""
    return {
        "error": type(refused).__name__,
        "what": refused.what,
        "fix": refused.fix,
        "conditional": bool(refused_if(d)),
    }


def _scoped(plan: Plan) -> bool:
    return any(d.spec.user_home is not None for d in plan.decisions.values())


def _deferred(d: Decision) -> bool:
    return "version_from" in d.spec.provenance


def codex_note(plan: Plan) -> str:
    """``versions: default v3; override tok/bpe=v4`` when a step's version came from the run's
    codex (one line under the prefix), else nothing."""
    from marin.execution.pipeline.versions import VersionCodex

    for d in plan.decisions.values():
        if _deferred(d):
            return (
                safe_text(VersionCodex.from_data(d.spec.provenance["versions"]).describe()) + "\n"
            )
    return ""


def _job(d: Decision, location: Location, plan: Plan) -> dict[str, Any] | None:
    """A remote step's recorded job that the next run reattaches to (docs/remote.md), judged
    against the recipe the plan expects the build to make."""
    if d.spec.remote is None or d.action != Action.BUILD:
        return None
    recipe = plan.recipe(d.spec)
    not_reused = job_not_reused(d.forced, d.stored_status)
    return job_view(location, d.spec.output_path, recipe, plan.policy.on_code_drift, d.spec.remote,
                    not_reused)  # fmt: skip


def _other_jobs(d: Decision, location: Location) -> list[dict[str, Any]]:
    """A remote step's jobs of other versions that still run (a version bumped under them)."""
    if d.spec.remote is None:
        return []
    return other_version_jobs(location, d.spec.output_path)


def terminal_width() -> int:
    """The width to render for: the terminal's, else ``$COLUMNS``, else ``DEFAULT_WIDTH``."""
    import shutil
    import sys

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return DEFAULT_WIDTH


def resume_json(verdict: ResumeVerdict) -> dict[str, Any]:
    """A resume verdict in ``plan --json``: resumed or cleared, why, and from which attempt."""
    previous = verdict.previous
    return {
        "resume": verdict.resume,
        "reason": verdict.line(),
        "attempt": previous.number if previous is not None else None,
        "started_at": previous.started_at if previous is not None else None,
    }


def plan_table(
    plan: Plan, location: Location, color: bool = False, width: int | None = None
) -> str:
    """The table fits ``width`` (the terminal's): outputs are shown relative to the prefix,
    which is printed once above, and the reason column wraps. ``--json`` has the full data."""
    from rich.table import Table

    width = width or terminal_width()
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    columns = _add_columns(table, width, _scoped(plan))
    refused = build_refusals(plan, location)
    for state in plan.decisions.values():
        refusal = refused.get(state.spec.output_path)
        shown = ShownStatus.FOREIGN if _surely(refusal, state) else shown_status(state)
        cells = _row_cells(state, location, columns, plan, refusal)
        table.add_row(*cells, style=STYLES[shown] if color else None)
    lines = _render(table, width, color)
    where = (
        "outputs below are relative to it" if columns.output else "outputs: <prefix>/NAME/VERSION"
    )
    head = f"prefix: {safe_text(location.url)} ({where})\n" + codex_note(plan)
    counts = sweep_counts(plan)
    sweep = "" if counts is None else counts.line() + "\n"
    return head + "\n".join(lines) + "\n" + plan_summary(plan, refused) + "\n" + sweep


@dataclass(frozen=True)
class _Columns:
    """Which optional columns the plan table shows."""

    fingerprint: bool
    output: bool
    scope: bool


def _add_columns(table: Table, width: int, scoped: bool) -> _Columns:
    """Add the table's columns for ``width`` and say which optional ones it has."""
    # Narrow terminals drop the columns whose data is elsewhere (the fingerprint is in --json,
    # an output is always NAME/VERSION under the prefix) and let the step name fold too.
    with_fingerprint = width >= FINGERPRINT_COLUMN_MIN_WIDTH
    for column in ("", "action", "status"):
        table.add_column(column, no_wrap=True)
    if with_fingerprint:
        table.add_column("step", no_wrap=True)
        table.add_column("fingerprint", no_wrap=True)
    else:
        table.add_column("step", overflow="fold", ratio=2)
    # An output is always NAME/VERSION under the prefix: on a narrow terminal the column only
    # takes the reason's room, so it goes (the header says where outputs are).
    with_output = width >= OUTPUT_COLUMN_MIN_WIDTH
    if with_output:
        table.add_column("output", overflow="fold")
    if scoped:
        table.add_column("scope (reads -> writes)", no_wrap=True)
    table.add_column("reason", overflow="fold", ratio=1 if with_fingerprint else 3, min_width=20)
    return _Columns(fingerprint=with_fingerprint, output=with_output, scope=scoped)


def _reason_lines(
    state: Decision, location: Location, plan: Plan, refused: MarinError | None = None
) -> str:
    """The reason cell: the reason, then a run's refusal, drift, code drift, resume and a remote
    job, one a line."""
    reason = safe_text(state.reason)
    if refused is not None:
        when = f" {refused_if(state)}" if refused_if(state) else ""
        reason += f"\n  a run refuses it{when}: {safe_text(refused.what)}: {safe_text(refused.fix)}"
    if state.drift:
        reason += "".join(f"\n  {safe_text(line)}" for line in state.drift)
    if state.code_drift:
        reason += "".join(f"\n  {safe_text(line)}" for line in state.code_drift)
    if state.resume is not None:
        reason += f"\n  {safe_text(state.resume.line())}"
    job = _job(state, location, plan)
    if job is not None:
        reason += f"\n  {safe_text(describe_job(job))}"
    for other in _other_jobs(state, location):
        reason += f"\n  {safe_text(describe_other_job(other))}"
    return reason


def _row_cells(
    state: Decision,
    location: Location,
    columns: _Columns,
    plan: Plan,
    refused: MarinError | None = None,
) -> list[str]:
    """One step's row, cell by cell, for the columns the table has (a step a run refuses to
    build wears ``foreign``'s mark; one it refuses only if an upstream output changes, its own)."""
    placement = describe_placement(state.spec)
    shown = shown_status(state)
    return [
        SYMBOLS[ShownStatus.FOREIGN if _surely(refused, state) else shown],
        state.action,
        shown,
        safe_rich(
            state.spec.step_id + (f"\n  [{placement}]" if placement else ""),
            keep_newlines=True,
        ),
        *([state.spec.fingerprint[:12]] if columns.fingerprint else []),
        *([safe_rich(state.spec.output_path)] if columns.output else []),
        *([safe_rich(" -> ".join(scope_of(state.spec)))] if columns.scope else []),
        safe_rich(_reason_lines(state, location, plan, refused), keep_newlines=True),
    ]


def _surely(refused: MarinError | None, state: Decision) -> bool:
    """Whether a run refuses ``state``'s build whenever it runs (not only if an upstream output
    changes, ``refused_if``)."""
    return refused is not None and not refused_if(state)


def _render(table: Table, width: int, color: bool) -> list[str]:
    """The table printed at ``width``, its lines without trailing blanks."""
    from rich.console import Console

    console = Console(
        width=width,
        color_system="auto" if color else None,
        record=True,
        force_terminal=color,
        soft_wrap=False,
    )
    with console.capture() as capture:
        console.print(table)
    return [line.rstrip() for line in capture.get().splitlines()]
