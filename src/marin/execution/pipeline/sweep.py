"""Sweeps: Marin's ``grid`` and ``sweep``, one handle per grid point.

``grid(lr=[1e-3, 3e-3], wd=[0.0, 0.1])`` is the Cartesian product of the axes, in row-major
order (the last axis varies fastest). ``sweep(trial, **axes)`` calls ``trial(**point)`` for each
point and returns the handles, each tagged with its point (``ArtifactStep.point``: for the sweep
counts of ``marin plan`` and for ``marin results``, never identity).

Each point's handle must say its point in its name or version (``point_name`` makes such a
name): two points that made one ``name@version`` would be built once and served for both, so
``sweep`` refuses them. Steps the points share (the data preparation) are ordinary shared
handles: lowering builds an identical ``name@version`` once, and a stored build of it is reused.
There is no framework ``select``: the choice of the best point is an ordinary step over the
points' results (``apply("best", pick, results=list(points))``), or code over their resolved
values.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from marin.execution.errors import InvalidStepError
from marin.execution.names import validate_name
from marin.execution.pipeline.handles import ArtifactStep

__all__ = ["Sweep", "grid", "point_name", "sweep"]


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """The Cartesian product of named axes, as a list of parameter dicts, last axis fastest.

    Raises:
        InvalidStepError: an axis that is a string or not a sequence, is empty, or repeats a
            value (two points would be one).
    """
    values: list[list[Any]] = []
    for name, axis in axes.items():
        if isinstance(axis, str | bytes) or not isinstance(axis, Iterable):
            raise InvalidStepError(
                f"sweep axis {name}={axis!r} is not a list of values",
                f"give a list, e.g. {name}=[{axis!r}]",
            )
        items = list(axis)
        if not items:
            raise InvalidStepError(
                f"sweep axis {name} has no values (the grid would be empty)",
                "give at least one value, or leave the axis out",
            )
        repeated = [v for i, v in enumerate(items) if v in items[:i]]
        if repeated:
            raise InvalidStepError(
                f"sweep axis {name} repeats the value {repeated[0]!r}",
                "give each value once: two equal points would be one step",
            )
        values.append(items)
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


class Sweep(list[ArtifactStep]):
    """The handles ``sweep`` made, in grid order (a list, as Marin's ``sweep`` returns), and
    ``points``: each one's parameters."""

    def __init__(self, handles: Iterable[ArtifactStep], points: Iterable[dict[str, Any]]) -> None:
        super().__init__(handles)
        self.points = list(points)


def sweep(trial: Callable[..., ArtifactStep], **axes: Sequence[Any]) -> Sweep:
    """One handle per grid point: ``trial(**point)`` for each point of ``grid(**axes)``.

    Raises:
        InvalidStepError: a bad axis (see ``grid``), a ``trial`` that returned no handle, or two
            points whose handles share a ``name@version`` (the name or version must say the
            point: ``point_name`` makes such a name).
    """
    points = grid(**axes)
    handles: list[ArtifactStep] = []
    seen: dict[str, dict[str, Any]] = {}
    for point in points:
        handle = trial(**point)
        if not isinstance(handle, ArtifactStep):
            raise InvalidStepError(
                f"the sweep's trial returned a {type(handle).__name__} for the point {point}",
                "return the handle of the point's last step (from apply() or ArtifactStep)",
            )
        key = handle.name if handle.version is None else handle.step_id
        if key in seen:
            raise InvalidStepError(
                f"the points {seen[key]} and {point} both make {handle.step_id}: it would be "
                "built once and served for both",
                "put the point in the name or the version, e.g. "
                f"name=point_name({handle.name!r}, **point)",
                handle.step_id,
            )
        seen[key] = point
        handles.append(dataclasses.replace(handle, point=dict(point)))
    return Sweep(handles, points)


def point_name(base: str, **point: Any) -> str:
    """``base/lr=0.001,wd=0.1``: a step name that says its point.

    Raises:
        InvalidStepError: a value whose text is not allowed in a name (``/``, ``:``, ``*``...),
            or holds ``,`` or ``=`` (``x="a,b=c"`` would read as two keys: one name, two points).
    """
    parts = [f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}" for key, value
             in point.items()]  # fmt: skip
    for key, part in zip(point, parts, strict=True):
        if part.count("=") > 1 or "," in part:
            raise InvalidStepError(
                f"the point's {key}={point[key]!r} holds ',' or '=': its name "
                f"{base}/{part} would read as another point's",
                "name the step yourself (a value without ',' or '=', or an index: "
                "f'{base}/point-{i}')",
                base,
            )
    name = f"{base}/{','.join(parts)}" if parts else base
    return validate_name(name)
