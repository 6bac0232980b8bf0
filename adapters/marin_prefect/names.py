"""Prefect's rule for flow and deployment names, shared by the compiler and ``marin export
prefect`` (which must not import Prefect, so the rule lives here rather than in ``compile``)."""

from __future__ import annotations

import re

BANNED_NAME_CHARS = re.compile(r"[/%&><]")
"""Characters Prefect refuses in flow and deployment names."""


def safe_prefect_name(text: str) -> str:
    """``text`` with the characters Prefect bans in flow/deployment names replaced by ``-``."""
    return BANNED_NAME_CHARS.sub("-", text).strip() or "marin"
