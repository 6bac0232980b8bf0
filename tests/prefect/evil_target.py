"""A target that must never be imported by a run that was not allowed to choose it.

Importing it leaves a marker file at ``$MARIN_TEST_EVIL_MARKER``, which the tests check is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

_marker = os.environ.get("MARIN_TEST_EVIL_MARKER")
if _marker:
    Path(_marker).write_text(f"imported in pid {os.getpid()}\n")


def pipeline() -> list[object]:
    raise AssertionError("the evil target ran")
