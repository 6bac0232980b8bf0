"""Pipelines for ``test_stored_state.py``, loaded by the ``marin`` CLI by path."""

from __future__ import annotations

import os

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


def write_then_fail(value: str, out_path: str) -> str:
    """``write``, then fail while ``$MARIN_TEST_FAIL`` is set: an attempt that left its output,
    its status and its log behind."""
    write(value, out_path)
    if os.environ.get("MARIN_TEST_FAIL"):
        raise RuntimeError("failed on purpose")
    return value


failing = apply("f", write_then_fail, version="v0", value="f-value", out_path=OUT)
