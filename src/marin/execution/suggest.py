"""Did you mean: the one place that suggests a known name for a mistyped one.

Every command that takes a step name (``--force``, ``marin show``, ``--select``, ``marin why``,
``marin diff``) suggests from the names that actually exist, through :func:`close_names`, so a
typo reads the same wherever it is made.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

CUTOFF = 0.6
"""``difflib``'s similarity ratio below which a name is not worth suggesting."""
MARGIN = 0.05
"""Candidates within this ratio of the best one are suggested beside it."""


def close_names(word: str, known: Iterable[str], n: int = 3, cutoff: float = CUTOFF) -> list[str]:
    """The names of ``known`` closest to ``word``, best first (none when nothing is close).

    A word with ``@version`` is compared with the ``name@version`` candidates, a bare name with
    the bare names (when ``known`` has both), and only candidates about as close as the best
    one are kept: ``ngram/datset`` suggests ``ngram/dataset``, not also ``ngram/report``.
    ``cutoff`` is the least similarity worth suggesting (short vocabularies want more).
    """
    pool = sorted(set(known))
    same_kind = [k for k in pool if ("@" in k) == ("@" in word)]
    scored = []
    for candidate in same_kind or pool:
        matcher = difflib.SequenceMatcher(None, word, candidate)
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff:
            ratio = matcher.ratio()
            if ratio >= cutoff:
                scored.append((ratio, candidate))
    scored.sort(key=lambda item: (-item[0], item[1]))
    if not scored:
        # Too short to be similar, but an abbreviation: learning_rate -> lr, lr -> learning_rate.
        return [c for c in same_kind or pool if _initials(word) == c or _initials(c) == word][:n]
    best = scored[0][0]
    return [c for ratio, c in scored[:n] if ratio >= best - MARGIN]


def did_you_mean(word: str, known: Iterable[str], n: int = 3, cutoff: float = CUTOFF) -> str:
    """``"did you mean a or b?"``, or ``""`` when nothing is close."""
    close = close_names(word, known, n, cutoff)
    return f"did you mean {' or '.join(close)}?" if close else ""


def _initials(word: str) -> str:
    """``learning_rate`` -> ``lr``; a word of one part has none (``""``)."""
    parts = [part for part in re.split(r"[_\-]", word) if part]
    return "".join(part[0] for part in parts) if len(parts) > 1 else ""
