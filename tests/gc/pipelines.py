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


def corpus_adopted() -> list[ArtifactStep]:
    """``gc/corpus@v1`` adopted in place: the user's data at the step's own output path."""
    return [ArtifactStep.adopt("gc/corpus", "v1", "gc/corpus/v1")]


def corpus_built() -> list[ArtifactStep]:
    """``gc/corpus@v1`` made a built step (what ``corpus_adopted`` adopts, built instead)."""
    return [step("corpus", "v1")]


def scoped() -> list[ArtifactStep]:
    """raw (shared) -> model (user scope): each user's model is built in their own folder."""
    return [step("model", "v1", step("raw", "v1")).with_options(scope="user")]


def deferred() -> list[ArtifactStep]:
    """One step whose version comes from the run (``--version``/``--override``)."""
    from marin.execution.lazy import DEFER

    return [apply("gc/dv", write_step, version=DEFER, text="dv", inputs=[], out_path=OUT)]


def remote() -> list[ArtifactStep]:
    """A remote (``local`` job) step; ``$MARIN_TEST_GC_TRAIN`` sets its version (a bump while
    its job runs leaves that job orphaned). The job waits for ``$MARIN_TEST_GATE``."""
    from tests.reliability.remote_pipelines import prepare, train

    data = apply("gc/rdata", prepare, version="v1", out_path=OUT)
    version = os.environ.get("MARIN_TEST_GC_TRAIN", "v1")
    return [
        apply(
            "gc/rtrain", train, version=version, data=data, out_path=OUT, step="gc/rtrain"
        ).with_options(remote="local")
    ]


def crash_step(out_path: str) -> str:
    """Writes part of its output and a log line, says it started, waits for the gate."""
    from tests.reliability.pipelines import append_line, wait_for_file

    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, "part-0"), "w") as f:
        f.write("half")
    print("training, step 1", flush=True)
    append_line(os.path.join(os.environ["MARIN_TEST_STARTED"], "gc_crash"), str(os.getpid()))
    wait_for_file(os.environ["MARIN_TEST_GATE"], timeout=120)
    return "done"


def crashing() -> list[ArtifactStep]:
    """A step the crash tests kill in the middle of its build."""
    return [apply("gc/crash", crash_step, version="v1", out_path=OUT)]


def outer() -> list[ArtifactStep]:
    """A corpus whose output folder ``gc/corpus/v1`` holds ``inner``'s (red team finding 5)."""
    return [step("corpus", "v1")]


def inner() -> list[ArtifactStep]:
    """Another pipeline's step whose output lies inside ``outer``'s: ``gc/corpus/v1/model/v2``."""
    return [step("corpus/v1/model", "v2")]


def stalling_step(out_path: str) -> str:
    """Writes half its output, says it started, waits for the gate, then writes the other half
    beside the first: a FileNotFoundError if its output folder was deleted meanwhile."""
    from tests.reliability.pipelines import append_line, wait_for_file

    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, "part-0"), "w") as f:
        f.write("half")
    append_line(os.path.join(os.environ["MARIN_TEST_STARTED"], "gc_stalling"), str(os.getpid()))
    wait_for_file(os.environ["MARIN_TEST_GATE"], timeout=120)
    with open(os.path.join(out_path, "part-1"), "w") as f:
        f.write("rest")
    return "done"


def stalling() -> list[ArtifactStep]:
    """A step that writes its output in two goes, a gate apart (red team round 17, finding 7)."""
    return [apply("gc/stalling", stalling_step, version="v1", out_path=OUT)]
