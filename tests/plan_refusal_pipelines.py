"""Pipelines that meet on one prefix, for ``tests/test_plan_refusals.py``: each is another
pipeline's view of the same folders, so no one graph's ``lower()`` can see the clash."""

from __future__ import annotations

from typing import Any

import fsspec

from marin.execution.lazy import OUT, ArtifactStep, apply


def write(text: str, out_path: str, inputs: Any = ()) -> dict[str, Any]:
    """Write ``text`` as the output's ``data.txt`` (``inputs``: steps read, only to order)."""
    with fsspec.open(f"{out_path}/data.txt", "w", auto_mkdir=True) as f:
        f.write(text)
    return {"text": text}


def corpus() -> list[ArtifactStep]:
    """``corpus@v1``, built at ``corpus/v1``."""
    return [apply("corpus", write, version="v1", text="corpus", out_path=OUT)]


def pinned_inside() -> list[ArtifactStep]:
    """A step pinned inside ``corpus@v1``'s build, with a step that reads it."""
    pinned = apply("x", write, version="v1", text="x", out_path=OUT, pin="corpus/v1/sub")
    return [apply("reader", write, version="v1", text="reader", out_path=OUT, inputs=[pinned])]


def nested() -> list[ArtifactStep]:
    """``corpus/v1@v0``: its name makes its output ``corpus/v1/v0``, inside ``corpus@v1``'s."""
    return [apply("corpus/v1", write, version="v0", text="nested", out_path=OUT)]


def raw_adopted() -> list[ArtifactStep]:
    """``raw@v1`` adopted in place: the user's data at the step's own output path."""
    return [ArtifactStep.adopt("raw", "v1", "raw/v1")]


def raw_built() -> list[ArtifactStep]:
    """``raw@v1`` made a built step (what ``raw_adopted`` adopts, built instead)."""
    return [apply("raw", write, version="v1", text="raw", out_path=OUT)]


def valued(text: str) -> dict[str, Any]:
    """A step whose artifact is its returned value: it writes nothing at its output path."""
    return {"text": text}


def raw_value() -> list[ArtifactStep]:
    """``raw@v1`` whose artifact is its value alone (no folder is made at ``raw/v1``)."""
    return [apply("raw", valued, version="v1", text="raw")]


def raw_v0() -> list[ArtifactStep]:
    """``raw@v0``: the version before ``raw_built``'s, whose record a user may copy."""
    return [apply("raw", write, version="v0", text="raw", out_path=OUT)]


def inner() -> list[ArtifactStep]:
    """``team/exp@v0``, whose output ``team/exp/v0`` lies where ``outer`` writes."""
    return [apply("team/exp", write, version="v0", text="inner", out_path=OUT)]


def outer() -> list[ArtifactStep]:
    """``team@exp``: its output ``team/exp`` holds ``inner``'s."""
    return [apply("team", write, version="exp", text="outer", out_path=OUT)]


def many() -> list[ArtifactStep]:
    """Forty new steps under ``wide/``, and one more there that reads them all."""
    firsts = [apply(f"wide/s{i}", write, version="v1", text="s", out_path=OUT) for i in range(40)]
    return [apply("wide/all", write, version="v1", text="all", out_path=OUT, inputs=firsts)]


def raw_resumable() -> list[ArtifactStep]:
    """``raw@v1`` built as a resumable step (its checkpoint folder ``raw/v1.marin/checkpoints``)."""
    return [
        apply("raw", write, version="v1", text="raw", out_path=OUT).with_options(resumable=True)
    ]
