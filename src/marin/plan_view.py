"""Rendering a plan: the table a person reads and the JSON a machine reads.

The JSON schema is versioned (``schema``) and documented in docs/plan-json.md; within a schema
version fields are only ever added, never renamed, removed or retyped
(tests/ux/test_plan_json.py holds the contract).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from marin.execution.inspect import StepState
from marin.execution.resources import describe_placement, placement_of
from marin.execution.storage import Location

PLAN_SCHEMA = 1
SYMBOLS = {"built": "✓", "run": "▶", "drift": "≠", "dev": "↻", "failed-before": "✗"}
ORDER = ("built", "run", "drift", "dev", "failed-before")


def plan_summary(states: list[StepState]) -> str:
    counts = Counter(state.action for state in states)
    parts = [f"{counts[a]} {'to run' if a == 'run' else a}" for a in ORDER if counts[a]]
    return f"{len(states)} steps: " + ", ".join(parts)


def plan_json(states: list[StepState], location: Location) -> dict[str, Any]:
    counts = Counter(state.action for state in states)
    return {
        "schema": PLAN_SCHEMA,
        "prefix": location.url,
        "summary": {"total": len(states), **{a: counts[a] for a in ORDER}},
        "steps": [
            {
                "step": s.spec.step_id,
                "name": s.spec.name,
                "version": s.spec.version,
                "fingerprint": s.spec.fingerprint,
                "output_path": location.url_for(s.spec.output_path),
                "status": s.action,
                "reason": s.reason,
                "drift": list(s.drift),
                "stored_fingerprint": s.record.fingerprint if s.record is not None else None,
                "deps": [d.step_id for d in s.spec.deps],
                # Only for steps with placement options (docs/resources.md), so plans of
                # pipelines without any are unchanged.
                **({"placement": placement_of(s.spec)} if describe_placement(s.spec) else {}),
            }
            for s in states
        ],
    }


def plan_table(states: list[StepState], location: Location, color: bool = False) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in ("", "status", "step", "fingerprint", "output", "reason"):
        table.add_column(column, overflow="fold")
    styles = {
        "built": "green",
        "run": "yellow",
        "drift": "magenta",
        "dev": "cyan",
        "failed-before": "red",
    }
    for state in states:
        reason = state.reason
        if state.drift:
            reason += "".join(f"\n  {line}" for line in state.drift)
        placement = describe_placement(state.spec)
        table.add_row(
            SYMBOLS[state.action],
            state.action,
            state.spec.step_id + (escape(f"\n  [{placement}]") if placement else ""),
            state.spec.fingerprint[:12],
            location.url_for(state.spec.output_path),
            reason,
            style=styles[state.action] if color else None,
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
    return "\n".join(lines) + "\n" + plan_summary(states) + "\n"
