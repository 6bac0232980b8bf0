"""Pipelines for ``test_stored_state.py``, loaded by the ``marin`` CLI by path."""

from __future__ import annotations

import fsspec

from marin.execution.lazy import OUT, apply


def write(value: str, out_path: str) -> str:
    with fsspec.open(out_path, "w") as f:
        f.write(value)
    return value


s = apply("s", write, version="v0", value="s-value", out_path=OUT)
s_changed = apply("s", write, version="v0", value="s-changed", out_path=OUT)
other = apply("other", write, version="v0", value="other-value", out_path=OUT)
independent = apply("t", write, version="v0", value="t-value", out_path=OUT)
s_and_t = [s, independent]
