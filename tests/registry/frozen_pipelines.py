"""A released step for the freeze tests: raw -> model, ``model`` with ``retries=2``.

``$MARIN_TEST_FROZEN_LR`` is ``model``'s config (an edit without a version bump: drift);
``$MARIN_TEST_FROZEN_VERSION`` its version; each ``fn`` call appends its step to
``$MARIN_TEST_FROZEN_CALLS``.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec

from marin.execution.lazy import OUT, ArtifactStep, apply


def train(lr: str, data: str, out_path: str) -> dict[str, Any]:
    with open(os.environ["MARIN_TEST_FROZEN_CALLS"], "a") as f:
        f.write(f"model {lr}\n")
    with fsspec.open(f"{out_path}/weights.txt", "w", auto_mkdir=True) as f:
        f.write(f"lr={lr}")
    return {"lr": lr}


def prepare(out_path: str) -> str:
    with fsspec.open(f"{out_path}/data.txt", "w", auto_mkdir=True) as f:
        f.write("data")
    return "data"


def pipeline() -> list[ArtifactStep]:
    raw = apply("frozen/raw", prepare, version="v1", out_path=OUT)
    version = os.environ.get("MARIN_TEST_FROZEN_VERSION", "v1")
    lr = os.environ.get("MARIN_TEST_FROZEN_LR", "0.1")
    model = apply("frozen/model", train, version=version, lr=lr, data=raw, out_path=OUT)
    return [model.with_options(retries=2)]


def score(n: int, out_path: str) -> dict[str, Any]:
    """A step whose artifact is only its returned value: nothing is written at its output."""
    with open(os.environ["MARIN_TEST_FROZEN_CALLS"], "a") as f:
        f.write(f"score {n}\n")
    return {"score": os.environ.get("MARIN_TEST_FROZEN_SCORE", "0.5")}


def scored() -> list[ArtifactStep]:
    """``frozen/score@v1``: no output path, ever (red team r19-6)."""
    return [apply("frozen/score", score, version="v1", n=1, out_path=OUT)]
