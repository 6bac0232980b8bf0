"""``marin why STEP``: why a step would be built or is served, and which builds it is made of.

It reads the plan a run would make (``marin.execution.plan.read.plan_run``, through the same
``StepRunner.plan`` that ``marin plan`` uses) and only explains its decisions: it never decides
anything itself. The chain of causes follows the upstream steps whose own decision explains
this one (one that is rebuilt, drifted, or stale), each with its reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from marin.execution.errors import InvalidStepError
from marin.execution.plan.decide import Decision, Plan
from marin.execution.step_spec import StepSpec
from marin.execution.suggest import did_you_mean
from marin.execution.vocabulary import Action
from marin.plan_view import shown_status
from marin.terminal_text import safe_text

MAX_DEPTH = 20
"""How far up the chain of causes goes: deep chains repeat the same cause."""


def find_step(steps: Sequence[StepSpec], wanted: str) -> StepSpec:
    """``wanted`` (a name or ``name@version``) in ``steps``, or an error with the closest names."""
    for spec in steps:
        if wanted in (spec.step_id, spec.name):
            return spec
    known = {s.name for s in steps} | {s.step_id for s in steps}
    raise InvalidStepError(
        f"{wanted!r} is no step of this pipeline",
        did_you_mean(wanted, known) or "give a step name or name@version from `marin plan`",
    )


def _build_id(d: Decision) -> str:
    if d.record is None or not d.record.build_id:
        return "no build" if d.record is None else "build id unknown (old record)"
    return f"build {d.record.build_id[:12]}"


def _explains(d: Decision) -> bool:
    """An upstream decision that is a cause for its readers: it changes, or it differs."""
    return d.action == Action.BUILD or bool(d.drift) or bool(d.stale)


def _deps(spec: StepSpec) -> list[StepSpec]:
    """Each dependency once, by output path (never by hashing specs: that walks their graph)."""
    return list({dep.output_path: dep for dep in spec.deps}.values())


def _line(spec: StepSpec, d: Decision, tail: str = "") -> str:
    return f"{safe_text(spec.step_id)}: {tail}{d.action} ({shown_status(d)})"


def _causes(plan: Plan, spec: StepSpec, depth: int, seen: set[str], out: list[str]) -> None:
    pad = "  " * depth
    for dep in _deps(spec):
        d = plan.of(dep)
        if not _explains(d) or dep.output_path in seen:
            continue
        seen.add(dep.output_path)
        out.append(f"{pad}<- {_line(dep, d)}: {safe_text(d.reason)}")
        out += [f"{pad}     {safe_text(line)}" for line in d.drift]
        if depth < MAX_DEPTH:
            _causes(plan, dep, depth + 1, seen, out)


def explain_step(plan: Plan, spec: StepSpec) -> str:
    """The text ``marin why`` prints for ``spec``."""
    d = plan.of(spec)
    lines = [_line(spec, d)]
    lines.append(f"  because: {safe_text(d.reason)}")
    lines += [f"    {safe_text(line)}" for line in d.drift]
    if d.resume is not None:
        lines.append(f"  {safe_text(d.resume.line())}")
    if d.record is not None:
        when = d.record.finished_at or "?"
        lines.append(f"  made from: {_build_id(d)}, finished {safe_text(when)}")
    else:
        lines.append("  made from: nothing built yet")
    chain: list[str] = []
    _causes(plan, spec, 2, set(), chain)
    if chain:
        lines.append("  chain of causes:")
        lines += chain
    if spec.deps:
        lines.append("  upstream:")
        for dep in _deps(spec):
            up = plan.of(dep)
            consumed = (d.record.inputs.get(dep.step_id) if d.record is not None else None) or ""
            current = up.record.build_id if up.record is not None else ""
            if not consumed:
                used = ""
            elif consumed == current:
                used = "; this record read that build"
            else:
                used = f"; this record read build {consumed[:12]}, since replaced"
            lines.append(f"    {_line(dep, up, _build_id(up) + ', ')}{used}")
    readers = [
        x.spec
        for x in plan.decisions.values()
        if any(dep.output_path == spec.output_path for dep in x.spec.deps)
    ]
    if readers:
        lines.append("  downstream:")
        for reader in readers:
            down = plan.of(reader)
            lines.append(f"    {_line(reader, down, _build_id(down) + ', ')}")
    return "\n".join(lines) + "\n"
