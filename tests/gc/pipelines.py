"""Small pipelines for the ``marin gc`` tests: raw -> tok -> train, and an abandoned sibling.

``$MARIN_TEST_GC_TOK`` sets the tokenizer's version (a version bump upstream of ``train``).
"""

from __future__ import annotations

import os
from typing import Any

import fsspec

from marin.execution.lazy import OUT, ArtifactStep, apply


def write_step(text: str, inputs: list[str], out_path: str) -> dict[str, Any]:
    """Read every input whole, then write a two-file output folder."""
    seen = []
    for path in inputs:
        with fsspec.open(f"{path}/data.txt", "r") as f:
            seen.append(f.read())
    for part in ("data.txt", "extra.txt"):
        with fsspec.open(f"{out_path}/{part}", "w", auto_mkdir=True) as f:
            f.write(f"{text}<-{'|'.join(seen)}")
    return {"text": text}


def step(name: str, version: str, *deps: ArtifactStep, text: str = "") -> ArtifactStep:
    return apply(
        f"gc/{name}",
        write_step,
        version=version,
        text=text or name,
        inputs=list(deps),
        out_path=OUT,
    )


def pipeline() -> list[ArtifactStep]:
    raw = step("raw", "v1")
    tok = step("tok", os.environ.get("MARIN_TEST_GC_TOK", "v1"), raw)
    return [step("train", "v1", tok)]


def scratch() -> list[ArtifactStep]:
    """An abandoned experiment beside the pipeline: garbage once only ``pipeline`` is kept."""
    return [step("scratch", "v1", step("raw", "v1"))]


def other() -> list[ArtifactStep]:
    """A pipeline sharing nothing with the others: keeping it keeps none of theirs."""
    return [step("other", "v1")]
