"""Rendering a plan: the table a person reads and the JSON a machine reads.

The JSON schema is versioned (``schema``) and documented in docs/plan-json.md; within a schema
version fields are only ever added, never renamed, removed or retyped
(tests/ux/test_plan_json.py holds the contract).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from marin.execution.artifact_names import artifact_names
from marin.execution.decide import ACTIONS, BUILD, STATUSES, Decision, Plan
from marin.execution.resources import describe_placement, placement_of
from marin.execution.storage import Location
from marin.terminal_text import safe_rich, safe_text

PLAN_SCHEMA = 1
SYMBOLS = {"built": "✓", "run": "▶", "drift": "≠", "dev": "↻", "failed-before": "✗"}
ORDER = STATUSES


def plan_summary(plan: Plan) -> str:
    """``11 steps: 10 built, 1 drift; a run would build 0, skip 11``."""
    decisions = list(plan.decisions.values())
    counts = Counter(d.status for d in decisions)
    actions = Counter(d.action for d in decisions)
    parts = [f"{counts[a]} {'to run' if a == 'run' else a}" for a in ORDER if counts[a]]
    stale = sum(1 for d in decisions if d.stale)
    if stale:
        parts.append(f"{stale} stale")
    would = [f"build {actions['build']}"]
    would += [f"{a} {actions[a]}" for a in ("skip", "prune") if actions[a]]
    return f"{len(decisions)} steps: " + ", ".join(parts) + "; a run would " + ", ".join(would)


def would_change_anything(plan: Plan) -> bool:
    """``--exit-code``: a step would be built, or served although drifted or stale."""
    return any(d.action == BUILD or d.served_with_warning for d in plan.decisions.values())


def plan_json(plan: Plan, location: Location) -> dict[str, Any]:
    decisions = list(plan.decisions.values())
    counts = Counter(d.status for d in decisions)
    actions = Counter(d.action for d in decisions)
    return {
        "schema": PLAN_SCHEMA,
        "prefix": location.url,
        "options": {
            "on_drift": plan.policy.on_drift,
            "force": sorted(plan.policy.force),
            "cascade": plan.policy.cascade,
        },
        "summary": {
            "total": len(decisions),
            **{a: counts[a] for a in ORDER},
            "actions": {a: actions[a] for a in ACTIONS},
        },
        "steps": [_step_json(d, location) for d in decisions],
    }


def _step_json(d: Decision, location: Location) -> dict[str, Any]:
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
        "lineage": d.lineage,
        "stored_fingerprint": d.record.fingerprint if d.record is not None else None,
        "build_id": (d.record.build_id or None) if d.record is not None else None,
        "deps": [dep.step_id for dep in d.spec.deps],
        # Only for steps with placement options (docs/resources.md), so plans of pipelines
        # without any are unchanged.
        **({"placement": placement_of(d.spec)} if describe_placement(d.spec) else {}),
    }


def plan_table(plan: Plan, location: Location, color: bool = False) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in ("", "action", "status", "step", "fingerprint", "output", "reason"):
        table.add_column(column, overflow="fold")
    styles = {
        "built": "green",
        "run": "yellow",
        "drift": "magenta",
        "dev": "cyan",
        "failed-before": "red",
    }
    for state in plan.decisions.values():
        reason = safe_text(state.reason)
        if state.drift:
            reason += "".join(f"\n  {safe_text(line)}" for line in state.drift)
        placement = describe_placement(state.spec)
        table.add_row(
            SYMBOLS[state.status],
            state.action,
            state.status,
            safe_rich(
                state.spec.step_id + (f"\n  [{placement}]" if placement else ""),
                keep_newlines=True,
            ),
            state.spec.fingerprint[:12],
            safe_rich(location.url_for(state.spec.output_path)),
            safe_rich(reason, keep_newlines=True),
            style=styles[state.status] if color else None,
        )
    console = Console(
        width=250,
        color_system="auto" if color else None,
        record=True,
        force_terminal=color,
        soft_wrap=False,
    )
    with console.capture() as capture:
        console.print(table)
    lines = [line.rstrip() for line in capture.get().splitlines()]
    return "\n".join(lines) + "\n" + plan_summary(plan) + "\n"
