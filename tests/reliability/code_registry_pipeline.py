"""A project of its own for ``test_resumable.py`` (red team finding 7), copied into a scratch
folder with a ``pyproject.toml`` and edited there: a tokenizer reached through a registry dict
filled by a decorator, and one through a module imported inside the function (``lazyhelp``,
which the driver never imports)."""

import json
import os

from marin.execution.lazy import OUT, apply

TOKENIZERS = {}


def register(name):
    def deco(f):
        TOKENIZERS[name] = f
        return f

    return deco


@register("words")
def words(text):
    return text.split(" ")


def tokenize(out_path, how, steps):
    """Resumable: one item per step in seen.json; fails after 2 when $FAIL_ONCE is set."""
    return _tokenize(out_path, how, steps, lambda text: TOKENIZERS[how](text))


def tokenize_lazy(out_path, steps):
    def split(text):
        import lazyhelp

        return lazyhelp.split(text)

    return _tokenize(out_path, "lazy", steps, split)


def _tokenize(out_path, how, steps, split):
    ck = os.path.join(out_path, "seen.json")
    seen = json.load(open(ck)) if os.path.exists(ck) else []
    os.makedirs(out_path, exist_ok=True)
    for s in range(len(seen), steps):
        seen.append(split("a b,c"))
        json.dump(seen, open(ck, "w"))
        if os.environ.get("FAIL_ONCE") and s == 1:
            raise RuntimeError("preempted")
    return sorted({json.dumps(x) for x in seen})


def pipeline():
    return [
        apply("r7/words", tokenize, version="v1", out_path=OUT, how="words", steps=4)
        .with_options(resumable=True),
        apply("r7/lazy", tokenize_lazy, version="v1", out_path=OUT, steps=4)
        .with_options(resumable=True),
    ]
