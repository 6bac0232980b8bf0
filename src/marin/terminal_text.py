"""Making a stored or user-given string safe to show on a terminal.

Step names, versions, records, statuses and error messages are data that a pipeline author, a
trigger or whoever can write to the prefix chose. Printed raw they can carry escape sequences
(clear the screen, set the window title, fake hyperlinks), bidi overrides that reorder what a
reader sees, or rich markup (``x[/red]``) that crashes or rewrites a table. Every command and the
live display pass such strings through this one module before they reach the terminal.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from marin.execution.printable import _unsafe
from marin.execution.printable import safe_text as safe_text


def safe_rich(value: Any, style: str = "", *, keep_newlines: bool = False) -> Any:
    """A rich ``Text`` of ``safe_text(value)``: shown literally, never parsed as markup."""
    from rich.text import Text

    return Text(safe_text(value, keep_newlines=keep_newlines), style=style)


def safe_json(text: str) -> str:
    """JSON text with every unsafe character written as a ``\\uXXXX`` escape: still valid JSON.

    ``json.dumps(..., ensure_ascii=False)`` escapes C0 controls but passes C1 controls (a raw
    ``\\x9b`` is a CSI on many terminals), DEL and bidi overrides through as they are.
    """
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or char in "\n\t" or not _unsafe(char, keep_newlines=True):
            out.append(char)
        elif ord(char) > 0xFFFF:
            code = ord(char) - 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{ord(char):04x}")
    return "".join(out)


def cell_width(text: str) -> int:
    """The terminal cells ``text`` takes: 2 for a wide character (``日``), 0 for a combining one."""
    from rich.cells import cell_len

    return cell_len(text)


def _cells_from(chars: Iterator[str], room: int) -> str:
    """The leading characters of ``chars`` that fit in ``room`` cells."""
    from rich.cells import get_character_cell_size

    taken = []
    for char in chars:
        room -= get_character_cell_size(char)
        if room < 0:
            break
        taken.append(char)
    return "".join(taken)


def cut_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal cells, cut in the middle (``ngram/ver…/long-name``):
    a step name's start and its last part are what tell two steps apart. Widths are cells, not
    characters, so a name with wide characters (``data/日本語-corpus@v1``) keeps its version."""
    if cell_width(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    keep = width - 1
    head = _cells_from(iter(text), keep // 2)
    tail = _cells_from(reversed(text), keep - cell_width(head))[::-1]
    return head + "…" + tail


def table_lines(table: Any, width: int, color: bool) -> list[str]:
    """A rich table rendered ``width`` columns wide, as lines without trailing spaces."""
    from rich.console import Console

    console = Console(
        width=width,
        color_system="auto" if color else None,
        force_terminal=color,
        no_color=not color,
        soft_wrap=False,
    )
    with console.capture() as capture:
        console.print(table)
    return [line.rstrip() for line in capture.get().splitlines()]
