"""``marin graph``: the lowered graph as Mermaid, Graphviz DOT or plain text.

Edges point the way data flows, from a dependency to the step that reads it. Given the steps'
states (``marin graph --prefix P``), nodes are styled by status, the one ``marin plan``
shows beside the action: built, stale, drift, to run, forced, dev, failed-before, pruned,
foreign (another step's record in its place); the status word is also in each label, so the
picture reads without colour.

Mermaid output must render on GitHub: every label is quoted, and node ids are the step ids
reduced to ``[A-Za-z0-9_]`` behind an ``s_`` prefix (so no id can be a Mermaid keyword such as
``end``, nor start with the ``o``/``x`` that Mermaid reads as an edge head).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from marin.execution.pipeline.graph import canonical_deps
from marin.execution.pipeline.resources import describe_placement
from marin.execution.plan.decide import Decision
from marin.execution.step_spec import StepSpec
from marin.execution.vocabulary import ShownStatus
from marin.plan_view import SYMBOLS, shown_status
from marin.terminal_text import safe_text

FORMATS = ("mermaid", "dot", "text")
STATUS_LABEL = {
    ShownStatus.BUILT: "built",
    ShownStatus.RUN: "to run",
    ShownStatus.DRIFT: "drift",
    ShownStatus.DEV: "dev",
    ShownStatus.FAILED_BEFORE: "failed before",
    ShownStatus.STALE: "stale",
    ShownStatus.FORCED: "forced",
    ShownStatus.PRUNED: "pruned",
    ShownStatus.FOREIGN: "foreign",
}
# (fill, stroke, text) per status: readable in GitHub's light and dark themes.
COLOURS = {
    ShownStatus.BUILT: ("#d3f9d8", "#2b8a3e", "#0b3d1a"),
    ShownStatus.RUN: ("#fff3bf", "#e67700", "#4a2800"),
    ShownStatus.DRIFT: ("#f3d9fa", "#9c36b5", "#3b0a45"),
    ShownStatus.DEV: ("#d0ebff", "#1971c2", "#082a4d"),
    ShownStatus.FAILED_BEFORE: ("#ffe3e3", "#c92a2a", "#4a0808"),
    ShownStatus.STALE: ("#ffe8cc", "#d9480f", "#4a1d00"),
    ShownStatus.FORCED: ("#fff3bf", "#e67700", "#4a2800"),
    ShownStatus.PRUNED: ("#f1f3f5", "#868e96", "#212529"),
    ShownStatus.FOREIGN: ("#fff0f6", "#a61e4d", "#3d0a1c"),
}
CLASS_NAMES = {
    ShownStatus.BUILT: "built",
    ShownStatus.RUN: "torun",
    ShownStatus.DRIFT: "drift",
    ShownStatus.DEV: "dev",
    ShownStatus.FAILED_BEFORE: "failed",
    ShownStatus.STALE: "stale",
    ShownStatus.FORCED: "forced",
    ShownStatus.PRUNED: "pruned",
    ShownStatus.FOREIGN: "foreign",
}


def _edges(steps: Sequence[StepSpec]) -> list[tuple[StepSpec, StepSpec]]:
    """``(dependency, dependent)`` pairs, in step order then dependency order, deduplicated."""
    by_path = {s.output_path: s for s in steps}
    deps = canonical_deps(list(steps))
    edges: list[tuple[StepSpec, StepSpec]] = []
    for step in steps:
        seen: set[str] = set()
        for dep in deps[step.output_path]:
            if dep.output_path not in seen:
                seen.add(dep.output_path)
                edges.append((by_path[dep.output_path], step))
    return edges


def mermaid_ids(steps: Sequence[StepSpec]) -> dict[str, str]:
    """A unique, Mermaid-safe node id per step (by output path)."""
    ids: dict[str, str] = {}
    used: set[str] = set()
    for step in steps:
        base = "s_" + (re.sub(r"[^A-Za-z0-9]+", "_", step.step_id).strip("_") or "step")
        candidate, n = base, 2
        while candidate in used:
            candidate, n = f"{base}_{n}", n + 1
        used.add(candidate)
        ids[step.output_path] = candidate
    return ids


def _mermaid_label(text: str) -> str:
    # Mermaid entity codes: escape what could end the quoted string or start a code or a tag.
    escaped = text.replace("#", "#35;").replace('"', "#quot;")
    return escaped.replace("<", "#lt;").replace(">", "#gt;")


def _label(step: StepSpec, states: Mapping[str, Decision] | None) -> str:
    state = states.get(step.output_path) if states else None
    if state is None:
        return safe_text(step.step_id)
    return f"{safe_text(step.step_id)} · {STATUS_LABEL[shown_status(state)]}"


def to_mermaid(steps: Sequence[StepSpec], states: Mapping[str, Decision] | None = None) -> str:
    ids = mermaid_ids(steps)
    lines = ["flowchart LR"]
    for step in steps:
        lines.append(f'    {ids[step.output_path]}["{_mermaid_label(_label(step, states))}"]')
    for dep, step in _edges(steps):
        lines.append(f"    {ids[dep.output_path]} --> {ids[step.output_path]}")
    if states:
        by_status: dict[ShownStatus, list[str]] = {}
        for step in steps:
            state = states.get(step.output_path)
            if state is not None:
                by_status.setdefault(shown_status(state), []).append(ids[step.output_path])
        for status, members in by_status.items():
            fill, stroke, text = COLOURS[status]
            name = CLASS_NAMES[status]
            lines.append(f"    classDef {name} fill:{fill},stroke:{stroke},color:{text}")
            lines.append(f"    class {','.join(members)} {name}")
    return "\n".join(lines) + "\n"


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(steps: Sequence[StepSpec], states: Mapping[str, Decision] | None = None) -> str:
    lines = [
        "digraph marin {",
        "    rankdir=LR;",
        '    node [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica"];',
    ]
    for step in steps:
        label = _dot_quote(_label(step, states)).replace(" · ", "\\n")  # DOT's line break
        attrs = [f"label={label}"]
        state = states.get(step.output_path) if states else None
        if state is not None:
            fill, stroke, text = COLOURS[shown_status(state)]
            attrs += [
                f"fillcolor={_dot_quote(fill)}",
                f"color={_dot_quote(stroke)}",
                f"fontcolor={_dot_quote(text)}",
            ]
        lines.append(f"    {_dot_quote(safe_text(step.step_id))} [{', '.join(attrs)}];")
    for dep, step in _edges(steps):
        dep_id, step_id = _dot_quote(safe_text(dep.step_id)), _dot_quote(safe_text(step.step_id))
        lines.append(f"    {dep_id} -> {step_id};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_text(steps: Sequence[StepSpec], states: Mapping[str, Decision] | None = None) -> str:
    """One line per step, indented by depth (the longest chain of dependencies above it)."""
    deps = canonical_deps(list(steps))
    depth: dict[str, int] = {}
    for step in steps:  # dependencies come first
        depth[step.output_path] = 1 + max(
            (depth[d.output_path] for d in deps[step.output_path]), default=-1
        )
    order = sorted(range(len(steps)), key=lambda i: (depth[steps[i].output_path], i))
    lines = []
    for i in order:
        step = steps[i]
        line = "  " * depth[step.output_path] + safe_text(step.step_id)
        state = states.get(step.output_path) if states else None
        if state is not None:
            line = f"{SYMBOLS[shown_status(state)]} {STATUS_LABEL[shown_status(state)]:<13} {line}"
        step_deps = list(dict.fromkeys(safe_text(d.step_id) for d in deps[step.output_path]))
        if step_deps:
            line += "  <- " + ", ".join(step_deps)
        placement = describe_placement(step)
        if placement:
            line += f"  [{placement}]"
        lines.append(line)
    return "\n".join(lines) + "\n"


def render_graph(
    steps: Sequence[StepSpec], fmt: str, states: Mapping[str, Decision] | None = None
) -> str:
    if fmt == "mermaid":
        return to_mermaid(steps, states)
    if fmt == "dot":
        return to_dot(steps, states)
    if fmt == "text":
        return to_text(steps, states)
    raise ValueError(f"error: unknown graph format {fmt!r}: use one of {', '.join(FORMATS)}")
