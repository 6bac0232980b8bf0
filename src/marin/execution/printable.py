"""Escaping control and invisible characters: the one rule for text that reaches a terminal.

On the ground floor so that every layer can apply it (a remote job's output is shown while it
runs, ``remote/follow.py``); ``marin.terminal_text`` builds the CLI's helpers on it.
"""

from __future__ import annotations

import unicodedata
from typing import Any

# Format characters that change how text around them is displayed, without being visible.
_INVISIBLE = frozenset(
    "\u00ad\u061c\u180e\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    "\u2060\u2061\u2062\u2063\u2064\u2066\u2067\u2068\u2069\ufeff"
)


def _unsafe(char: str, keep_newlines: bool) -> bool:
    if char == "\n":
        return not keep_newlines
    if char in _INVISIBLE:
        return True
    category = unicodedata.category(char)
    # Cc: C0 controls, DEL and C1 controls (ESC, CSI, OSC, BEL, CR, backspace ...); Cf: other
    # format characters; Zl/Zp: line and paragraph separators, which some terminals honour; Cs:
    # lone surrogates (from JSON ``\\ud800``), which cannot even be encoded for output.
    return category in ("Cc", "Cf", "Cs", "Zl", "Zp")


def _visible(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def safe_text(value: Any, *, keep_newlines: bool = False) -> str:
    """``value`` as a string with every control or invisible format character made visible.

    ``\\x1b`` becomes the four characters ``\\x1b``, so a reader sees that it was there but the
    terminal never acts on it. Newlines are escaped too unless ``keep_newlines``, so one stored
    field cannot forge extra lines of output. Tabs become a space.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and "\t" not in text:
        return text  # the common case, without a per-character walk
    out = []
    for char in text:
        if char == "\t":
            out.append(" ")
        elif char.isprintable() or not _unsafe(char, keep_newlines):
            out.append(char)
        else:
            out.append(_visible(char))
    return "".join(out)
