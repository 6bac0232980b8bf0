"""A sweep's counts, from a plan: how many builds its points request, how many are unique, how
many are reused (``35 unique of 80 requested; 3 reused``).

Each point (a step ``sweep()`` tagged) requests every step of its own sub-graph; steps in no
point's sub-graph (a selection over the points) are requested once. Unique is the number of
steps the plan holds, since lowering makes one spec of one ``name@version``; reused, those the
plan serves from a stored build. Every runner plans with the same function, so ``marin plan``,
``marin run``, the Prefect flow and the Airflow plan task print the same line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.decide import Plan
from marin.execution.vocabulary import Action

__all__ = ["SweepCounts", "sweep_counts"]


@dataclass(frozen=True)
class SweepCounts:
    """What a sweep asks for and what a run of it would build or reuse."""

    points: int
    requested: int
    """Each point's steps, counted once per point; other steps once."""
    unique: int
    reused: int
    """Served from a stored build."""

    def line(self) -> str:
        return (
            f"sweep of {self.points} points: {self.unique} unique of {self.requested} "
            f"requested; {self.reused} reused"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sweep_counts(plan: Plan) -> SweepCounts | None:
    """The counts of the sweep in ``plan``; None when no step of it is a sweep point."""
    decisions = plan.decisions
    points = [d.spec for d in decisions.values() if d.spec.point is not None]
    if not points:
        return None
    covered: set[str] = set()
    requested = 0
    for point in points:
        closure = _closure(point)
        requested += len(closure)
        covered |= closure
    requested += sum(1 for path in decisions if path not in covered)
    reused = sum(1 for d in decisions.values() if d.action == Action.SKIP)
    return SweepCounts(len(points), requested, len(decisions), reused)


def _closure(spec: StepSpec) -> set[str]:
    """The output paths of ``spec`` and of every step it needs."""
    seen = {spec.output_path}
    todo = [spec]
    while todo:
        for dep in todo.pop().deps:
            if dep.output_path not in seen:
                seen.add(dep.output_path)
                todo.append(dep)
    return seen
