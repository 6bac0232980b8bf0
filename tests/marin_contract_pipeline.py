"""A pipeline written the way Marin's library steps are: ``ArtifactStep``s whose ``run`` takes
the config. Every runner's tests run it (local, isolated, Prefect, the Airflow task runtime).

``CORPUS`` is pinned, ``COUNT`` reads a runtime arg, ``ctx.resolved(CORPUS)`` and
``current_context()``; ``ISOLATED`` is ``COUNT``'s twin in a fresh subprocess.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec

from marin.execution.lazy import ArtifactStep
from marin.execution.pipeline.context import StepContext, current_context

TEXT = "hello marin"


def corpus_config(ctx: StepContext) -> dict[str, Any]:
    return {"out": ctx.output_path, "text": TEXT}


def write_corpus(config: dict[str, Any]) -> dict[str, Any]:
    fs, root = fsspec.core.url_to_fs(config["out"])
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/data.txt", config["text"].encode())
    return {"chars": len(config["text"])}


def count_config(ctx: StepContext) -> dict[str, Any]:
    # At fingerprint time nothing is built: the dependency's result is not identity anyway.
    chars = None if ctx.is_fingerprint else ctx.resolved(CORPUS).result["chars"]
    return {
        "corpus": ctx.artifact_path(CORPUS),
        "chars": chars,
        "tpu": ctx.runtime_arg("tpu"),
        "out": ctx.output_path,
    }


def count(config: dict[str, Any]) -> dict[str, Any]:
    ctx = current_context()
    fs, root = fsspec.core.url_to_fs(config["corpus"])
    text = bytes(fs.cat_file(f"{root}/data.txt")).decode()
    return {
        "chars": config["chars"],
        "read": len(text),
        "tpu": config["tpu"],
        "pid": os.getpid(),
        "context_out": ctx.output_path,
        "is_fingerprint": ctx.is_fingerprint,
    }


CORPUS = ArtifactStep(
    name="contract/corpus",
    version="v1",
    run=write_corpus,
    build_config=corpus_config,
    override_path="contract/pinned-corpus",
)
COUNT = ArtifactStep(
    name="contract/count",
    version="v1",
    run=count,
    build_config=count_config,
    deps=(CORPUS,),
    runtime_args={"tpu": "v4-8"},
)
ISOLATED = ArtifactStep(
    name="contract/count-isolated",
    version="v1",
    run=count,
    build_config=count_config,
    deps=(CORPUS,),
    runtime_args={"tpu": "v5-16"},
    isolate=True,
)
pipeline = [COUNT, ISOLATED]


def expected(prefix: str, name: str, tpu: str) -> dict[str, Any]:
    """What ``count`` returns for ``name`` under ``prefix`` (all but the pid)."""
    n = len(TEXT)
    out = f"{prefix.rstrip('/')}/{name}/v1"
    return {
        "chars": n, "read": n, "tpu": tpu, "context_out": out, "is_fingerprint": False
    }  # fmt: skip


def devices_seen(config: dict[str, Any]) -> dict[str, Any]:
    """What an isolated step's ``run`` sees of its GPU devices."""
    return {
        "devices": list(current_context().devices),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
    }
