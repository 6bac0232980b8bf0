"""Small pipelines for the Prefect adapter tests (importable: targets name this file).

Every step appends ``<name>`` to the file named by ``$MARIN_PREFECT_TEST_CALLS`` (when set), so a
test can prove that a cached run never calls ``fn``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from marin.execution.lazy import OUT, ArtifactStep, apply

CALLS_ENV = "MARIN_PREFECT_TEST_CALLS"


def _called(name: str) -> None:
    calls = os.environ.get(CALLS_ENV)
    if calls:
        with open(calls, "a") as f:
            f.write(name + "\n")


def make_corpus(out: str, n_shards: int) -> dict[str, int]:
    _called("corpus")
    Path(out).mkdir(parents=True, exist_ok=True)
    for i in range(n_shards):
        Path(out, f"shard-{i}.txt").write_text(f"the cat sat on mat {i}\nthe dog sat {i}\n")
    return {"shards": n_shards}


def tokenize(corpus: str, out: str) -> dict[str, int]:
    _called("tokens")
    tokens = []
    for shard in sorted(Path(corpus).glob("shard-*.txt")):
        tokens.extend(shard.read_text().split())
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, "tokens.json").write_text(json.dumps(tokens))
    return {"tokens": len(tokens)}


def train(tokens: str, out: str, smoothing: float) -> dict[str, float]:
    _called(f"train-{smoothing}")
    words = json.loads(Path(tokens, "tokens.json").read_text())
    counts: dict[str, int] = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, "model.json").write_text(json.dumps({"counts": counts, "smoothing": smoothing}))
    return {"vocab": len(counts)}


def evaluate(model: str, out: str) -> dict[str, float]:
    _called("eval")
    m = json.loads(Path(model, "model.json").read_text())
    score = sum(m["counts"].values()) / (len(m["counts"]) + m["smoothing"])
    Path(out).write_text(json.dumps({"score": score}))  # a single-file artifact
    return {"score": score}


def report(evals: list[str], out: str) -> dict[str, list[float]]:
    _called("report")
    scores = [json.loads(Path(e).read_text())["score"] for e in evals]
    Path(out).write_text(json.dumps({"scores": scores}, sort_keys=True))
    return {"scores": scores}


def pipeline() -> list[ArtifactStep]:
    """Fan-out, fan-in, a shared dependency and OUT: corpus -> tokens -> 2 models -> evals -> report."""
    corpus = apply("toy/corpus", make_corpus, version="v0", out=OUT, n_shards=3)
    tokens = apply("toy/tokens", tokenize, version="v0", corpus=corpus, out=OUT)
    evals = []
    for smoothing in (0.1, 1.0):
        model = apply(
            f"toy/model-{smoothing}",
            train,
            version="v0",
            tokens=tokens,
            out=OUT,
            smoothing=smoothing,
        )
        evals.append(apply(f"toy/eval-{smoothing}", evaluate, version="v0", model=model, out=OUT))
    return [apply("toy/report", report, version="v0", evals=evals, out=OUT)]


# --- concurrency probes ----------------------------------------------------------------------


class Gauge:
    """Counts steps running at once, in this process (Prefect's thread pool runs them here)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def step(self, out: str, i: int, seconds: float) -> int:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(seconds)
            Path(out).write_text(str(i))
            return i
        finally:
            with self.lock:
                self.now -= 1


def wide(gauge: Gauge, n: int, seconds: float, tag: str) -> list[ArtifactStep]:
    return [
        apply(f"wide-{tag}/s{i}", gauge.step, version="v0", out=OUT, i=i, seconds=seconds)
        for i in range(n)
    ]


# --- failures ----------------------------------------------------------------------------------


def ok(out: str, label: str) -> str:
    _called(label)
    Path(out).write_text(label)
    return label


def boom(out: str, upstream: str) -> None:
    _called("boom")
    raise ValueError("boom: this step always fails")


def after(out: str, upstream: str, label: str) -> str:
    _called(label)
    Path(out).write_text(label)
    return label


def failing() -> list[ArtifactStep]:
    """root -> bad (raises) -> child -> grandchild; plus an independent sibling."""
    root = apply("fail/root", ok, version="v0", out=OUT, label="root")
    bad = apply("fail/bad", boom, version="v0", out=OUT, upstream=root)
    child = apply("fail/child", after, version="v0", out=OUT, upstream=bad, label="child")
    grandchild = apply(
        "fail/grandchild", after, version="v0", out=OUT, upstream=child, label="grandchild"
    )
    sibling = apply("fail/sibling", ok, version="v0", out=OUT, label="sibling")
    return [grandchild, sibling]


def flaky(out: str, attempts_file: str) -> int:
    """Fails on its first attempt, succeeds on the second (counts attempts in a file)."""
    path = Path(attempts_file)
    attempt = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(attempt))
    if attempt < 2:
        raise RuntimeError(f"flaky: attempt {attempt} fails")
    Path(out).write_text(str(attempt))
    return attempt


def slow(out: str, label: str, seconds: float) -> str:
    _called(label)
    time.sleep(seconds)
    Path(out).write_text(label)
    return label


def fail_fast_graph() -> list[ArtifactStep]:
    """bad fails at once while slow runs; after_slow becomes ready only after bad has failed."""
    bad = apply("ff/bad", boom, version="v0", out=OUT, upstream="none")
    slow_step = apply("ff/slow", slow, version="v0", out=OUT, label="slow", seconds=1.0)
    after_slow = apply(
        "ff/after-slow", after, version="v0", out=OUT, upstream=slow_step, label="after-slow"
    )
    return [bad, after_slow]
