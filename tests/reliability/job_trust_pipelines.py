"""Pipelines of ``test_job_children.py``: they import only ``marin`` (one of them is run from
another working folder, by its absolute path)."""

from __future__ import annotations

import os

from marin.execution.lazy import OUT, apply

ESCAPES = "\x1b]0;pwned-title\x07\x1b[2J\x1b[31mFAKE\x1b[0m \u202etxt.exe"
"""What ``noisy`` prints: a window title, a screen clear, a colour, a bidi override."""


def noisy(out_path: str) -> None:
    """Prints escapes and a full disk's words, then fails with a plain bug."""
    print(ESCAPES)
    print("OSError: [Errno 28] No space left on device", flush=True)
    raise ValueError("a plain bug, not a full disk")


def touch(out_path: str) -> dict[str, int]:
    os.makedirs(out_path, exist_ok=True)
    return {"pid": os.getpid()}


noisy_job = [apply("trust/noisy", noisy, version="v1", out_path=OUT).with_options(remote="local")]

# One step in a ``local`` job, one in an isolated child: both start a fresh interpreter.
children = [
    apply("trust/remote", touch, version="v1", out_path=OUT).with_options(remote="local"),
    apply("trust/isolated", touch, version="v1", out_path=OUT).with_options(isolate=True),
]
