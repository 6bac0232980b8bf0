"""A small, dependency-free language-modelling pipeline: the README's example.

    corpus ──┬─ tokenize shard 0 ─┐
             ├─ tokenize shard 1 ─┤
             ├─ tokenize shard 2 ─┼─ dataset ─┬─ train bigram (add-k) ──── eval ─┐
             └─ tokenize shard 3 ─┘           └─ train trigram (interp.) ─ eval ─┴─ report

It shows fan-out (one corpus, four tokenizer shards; one dataset, two models), fan-in (the
dataset and the report), a shared dependency (both models and both evaluations read the same
dataset) and ``OUT``. The text comes from the Python standard library's own docstrings, so it
needs no download. Every step reads and writes through fsspec, so any prefix works.

    marin run examples/ngram.py:pipeline
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import math
import re
from collections import Counter
from typing import Any

import fsspec

from marin.execution.lazy import OUT, ArtifactStep, apply

STDLIB_MODULES = (
    "argparse", "collections", "contextlib", "csv", "dataclasses", "datetime", "functools",
    "heapq", "inspect", "itertools", "json", "logging", "pathlib", "random", "statistics",
    "string", "textwrap", "threading",
)  # fmt: skip
NUM_SHARDS = 4
BOS, EOS, UNK = "<s>", "</s>", "<unk>"


def _write(path: str, text: str) -> None:
    with fsspec.open(path, "w", auto_mkdir=True) as f:
        f.write(text)


def _read(path: str) -> str:
    with fsspec.open(path, "r") as f:
        return str(f.read())


_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


# --- steps -----------------------------------------------------------------------------------


def build_corpus(modules: list[str], num_shards: int, out_path: str) -> dict[str, Any]:
    """Collect the docstrings of stdlib modules' top-level classes and functions into shards."""
    documents: list[str] = []
    for name in modules:
        module = importlib.import_module(name)
        try:
            # Parsed from the source, not read off the live module: what other imports add to a
            # module (a submodule, a hook such as threading.excepthook) differs per process.
            tree = ast.parse(inspect.getsource(module))
            docs = [ast.get_docstring(node) for node in tree.body if isinstance(node, _DEFS)]
        except TypeError:  # a built-in module (itertools) has no source; its C types are fixed
            docs = [inspect.getdoc(m) for _, m in sorted(vars(module).items()) if callable(m)]
        documents += [" ".join(doc.split()) for doc in docs if doc and len(doc) > 80]
    documents = sorted(set(documents))
    for shard in range(num_shards):
        _write(f"{out_path}/shard-{shard:02d}.txt", "\n".join(documents[shard::num_shards]) + "\n")
    return {"documents": len(documents), "shards": num_shards}


def tokenize_shard(corpus: str, shard: int, lowercase: bool, out_path: str) -> dict[str, Any]:
    text = _read(f"{corpus}/shard-{shard:02d}.txt")
    lines = []
    for line in text.splitlines():
        tokens = re.findall(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]", line.lower() if lowercase else line)
        if tokens:
            lines.append(" ".join(tokens))
    _write(out_path, "\n".join(lines) + "\n")
    return {"sentences": len(lines), "tokens": sum(len(line.split()) for line in lines)}


def build_dataset(
    shards: list[str], heldout_every: int, min_count: int, out_path: str
) -> dict[str, Any]:
    """Merge token shards, hold out every n-th sentence, and fix a vocabulary on the train split."""
    sentences = [line for path in shards for line in _read(path).splitlines() if line]
    train = [s for i, s in enumerate(sentences) if i % heldout_every]
    heldout = [s for i, s in enumerate(sentences) if not i % heldout_every]
    counts = Counter(token for sentence in train for token in sentence.split())
    vocab = sorted(token for token, count in counts.items() if count >= min_count)
    _write(f"{out_path}/train.txt", "\n".join(train) + "\n")
    _write(f"{out_path}/heldout.txt", "\n".join(heldout) + "\n")
    _write(f"{out_path}/vocab.json", json.dumps(vocab))
    return {"train": len(train), "heldout": len(heldout), "vocab": len(vocab)}


def _sentences(dataset: str, split: str, vocab: set[str]) -> list[list[str]]:
    return [
        [BOS, BOS] + [t if t in vocab else UNK for t in line.split()] + [EOS]
        for line in _read(f"{dataset}/{split}.txt").splitlines()
        if line
    ]


def train_ngram(
    dataset: str, order: int, smoothing: dict[str, Any], out_path: str
) -> dict[str, Any]:
    """Count n-grams up to ``order``; the smoothing settings travel with the model."""
    vocab = set(json.loads(_read(f"{dataset}/vocab.json"))) | {UNK, EOS}
    counts: dict[int, Counter[str]] = {n: Counter() for n in range(1, order + 1)}
    for sentence in _sentences(dataset, "train", vocab):
        for n in range(1, order + 1):
            for i in range(2, len(sentence)):
                if i - n + 1 >= 0:
                    counts[n][" ".join(sentence[i - n + 1 : i + 1])] += 1
    model = {
        "order": order,
        "smoothing": smoothing,
        "vocab_size": len(vocab),
        "counts": {str(n): dict(c) for n, c in counts.items()},
    }
    _write(f"{out_path}/model.json", json.dumps(model))
    return {"order": order, "ngrams": sum(len(c) for c in counts.values())}


class _Model:
    def __init__(self, model: dict[str, Any]) -> None:
        self.order: int = model["order"]
        self.smoothing: dict[str, Any] = model["smoothing"]
        self.v: int = model["vocab_size"]
        self.counts = {int(n): c for n, c in model["counts"].items()}
        self.total = sum(self.counts[1].values())
        # Context counts: how often each (n-1)-gram was followed by anything.
        self.context: dict[int, Counter[str]] = {n: Counter() for n in range(2, self.order + 1)}
        for n in range(2, self.order + 1):
            for gram, count in self.counts[n].items():
                self.context[n][gram.rsplit(" ", 1)[0]] += count

    def _ml(self, n: int, history: list[str], token: str) -> float:
        if n == 1:
            return self.counts[1].get(token, 0) / self.total
        context = " ".join(history[-(n - 1) :])
        denominator = self.context[n].get(context, 0)
        return self.counts[n].get(f"{context} {token}", 0) / denominator if denominator else 0.0

    def prob(self, history: list[str], token: str) -> float:
        kind = self.smoothing["kind"]
        if kind == "add-k":
            k = self.smoothing["k"]
            n = self.order
            context = " ".join(history[-(n - 1) :]) if n > 1 else ""
            count = self.counts[n].get(f"{context} {token}".strip(), 0)
            denominator = self.context[n].get(context, 0) if n > 1 else self.total
            return (count + k) / (denominator + k * self.v)
        if kind == "interpolated":
            lambdas = self.smoothing["lambdas"]  # highest order first
            uniform = 1.0 / self.v
            p = sum(lam * self._ml(self.order - i, history, token) for i, lam in enumerate(lambdas))
            return (1 - self.smoothing["uniform_weight"]) * p + self.smoothing[
                "uniform_weight"
            ] * uniform
        raise ValueError(f"unknown smoothing {kind!r}")


def evaluate(model: str, dataset: str, out_path: str) -> dict[str, Any]:
    """Perplexity on the held-out split."""
    lm = _Model(json.loads(_read(f"{model}/model.json")))
    vocab = set(json.loads(_read(f"{dataset}/vocab.json"))) | {UNK, EOS}
    log_prob, tokens = 0.0, 0
    for sentence in _sentences(dataset, "heldout", vocab):
        for i in range(2, len(sentence)):
            log_prob += math.log(lm.prob(sentence[:i], sentence[i]))
            tokens += 1
    metrics = {"perplexity": round(math.exp(-log_prob / tokens), 4), "tokens": tokens}
    _write(out_path, json.dumps(metrics, sort_keys=True) + "\n")
    return metrics


def write_report(evaluations: dict[str, str], out_path: str) -> dict[str, Any]:
    """Compare the models; the best (lowest perplexity) comes first."""
    rows = sorted(
        (json.loads(_read(path))["perplexity"], name) for name, path in evaluations.items()
    )
    lines = [
        "# n-gram language models on stdlib docstrings",
        "",
        "| model | perplexity |",
        "| --- | --- |",
    ]
    lines += [f"| {name} | {ppl:.2f} |" for ppl, name in rows]
    _write(out_path, "\n".join(lines) + "\n")
    return {"best": rows[0][1], "perplexity": {name: ppl for ppl, name in rows}}


# --- the pipeline ------------------------------------------------------------------------------


TRAIN_RESOURCES = {"cpu": 2, "memory": "4GiB"}
TOKENIZE_RESOURCES = {"cpu": 1, "memory": "1GiB"}


def build_pipeline(
    *, add_k: float = 0.05, lambdas: tuple[float, ...] = (0.6, 0.3, 0.1)
) -> ArtifactStep:
    corpus = apply(
        "ngram/corpus", build_corpus, version="v1",
        modules=list(STDLIB_MODULES), num_shards=NUM_SHARDS, out_path=OUT,
    )  # fmt: skip
    shards = [
        apply(f"ngram/tokens/shard-{i:02d}", tokenize_shard, version="v1",
              corpus=corpus, shard=i, lowercase=True, out_path=OUT)
        .with_options(resources=TOKENIZE_RESOURCES)
        for i in range(NUM_SHARDS)
    ]  # fmt: skip
    dataset = apply(
        "ngram/dataset", build_dataset, version="v1",
        shards=shards, heldout_every=10, min_count=2, out_path=OUT,
    )  # fmt: skip
    models = {
        "bigram-add-k": apply(
            "ngram/models/bigram-add-k", train_ngram, version="v1",
            dataset=dataset, order=2, smoothing={"kind": "add-k", "k": add_k}, out_path=OUT,
        ),
        "trigram-interpolated": apply(
            "ngram/models/trigram-interpolated", train_ngram, version="v1",
            dataset=dataset, order=3,
            smoothing={"kind": "interpolated", "lambdas": list(lambdas), "uniform_weight": 0.01},
            out_path=OUT,
        ),
    }  # fmt: skip
    # Placement, not identity: resources and timeouts never change a fingerprint. Training is
    # the heavy step; on a cluster it would ask for GPUs (resources={"gpu": 1, ...}).
    models = {
        name: model.with_options(resources=TRAIN_RESOURCES, timeout="30m")
        for name, model in models.items()
    }
    evaluations = {
        name: apply(f"ngram/eval/{name}", evaluate, version="v1",
                    model=model, dataset=dataset, out_path=OUT)
        for name, model in models.items()
    }  # fmt: skip
    return apply("ngram/report", write_report, version="v1", evaluations=evaluations, out_path=OUT)


pipeline = build_pipeline()
