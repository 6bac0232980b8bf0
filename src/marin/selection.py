"""``--select`` and ``--exclude``: run, plan or draw part of a pipeline.

A pattern is an ``fnmatch`` glob matched against each step's ``name`` and ``name@version``
(``ngram/eval/*``, ``ngram/dataset@v1``). The selected steps become the targets, so what they
need (their upstream) comes with them and nothing else does; ``decide()`` then decides them as
for any target. ``--exclude`` leaves out the matching steps and every step that reads them (a
step cannot be built without its inputs). A pattern that matches no step is an error, with the
closest names.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from marin.execution.errors import InvalidStepError
from marin.execution.pipeline.graph import Graph
from marin.execution.step_spec import StepSpec
from marin.execution.suggest import did_you_mean


def matches(pattern: str, spec: StepSpec) -> bool:
    """``pattern`` names ``spec`` by its name or its ``name@version`` (case-sensitive)."""
    return fnmatch.fnmatchcase(spec.name, pattern) or fnmatch.fnmatchcase(spec.step_id, pattern)


def _matching(patterns: Sequence[str], steps: Sequence[StepSpec], option: str) -> set[str]:
    found: set[str] = set()
    for pattern in patterns:
        hits = {s.output_path for s in steps if matches(pattern, s)}
        if not hits:
            known = {s.name for s in steps} | {s.step_id for s in steps}
            # A glob is compared with the globs that would have matched: each folder + "/*".
            known |= {s.name.rpartition("/")[0] + "/*" for s in steps if "/" in s.name}
            hint = did_you_mean(pattern, known)
            raise InvalidStepError(
                f"{option} {pattern!r} matches no step of this pipeline",
                hint
                or "give a step name, name@version or a glob such as 'ngram/eval/*' "
                "(`marin plan` lists the steps)",
            )
        found |= hits
    return found


def select_graph(
    graph: Graph,
    select: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    options: tuple[str, str] = ("--select", "--exclude"),
) -> Graph:
    """The part of ``graph`` a selection leaves: ``graph`` itself when both are empty.

    ``options`` are the names errors give the two (an engine's run parameters are called
    ``select`` and ``exclude``, not flags). Raises ``InvalidStepError`` for a pattern that
    matches no step, or a selection that leaves none."""
    if not select and not exclude:
        return graph
    steps = graph.steps
    chosen = _matching(select, steps, options[0]) if select else None
    dropped = _matching(exclude, steps, options[1]) if exclude else set()
    # Steps come dependencies first, so one pass carries an exclusion to every reader.
    for spec in steps:
        if any(dep.output_path in dropped for dep in spec.deps):
            dropped.add(spec.output_path)
    if chosen is None:
        kept = [s for s in steps if s.output_path not in dropped]
        # Only the kept steps nothing kept reads: their upstream follows from them.
        read = {d.output_path for s in kept for d in s.deps}
        result = [s for s in kept if s.output_path not in read]
    else:
        result = [s for s in steps if s.output_path in chosen and s.output_path not in dropped]
    if not result:
        raise InvalidStepError(
            f"{options[0]} and {options[1]} leave no step to work on",
            f"loosen {options[1]} (it also leaves out every step that reads an excluded one)",
        )
    return graph.narrowed(result)
