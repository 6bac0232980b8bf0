"""A log's lines read in bounded memory, whatever it holds (issue 55): ``marin logs``.

A job prints anything: a progress bar without a newline makes one line of megabytes. Lines are
cut at ``LINE_CAP`` bytes (``... (N bytes)`` says how long the line was), so one huge line never
hides the lines before it, and never more than ``SCAN_MOST`` bytes of a log are looked at
(``tail_lines`` reads from the end, by blocks; ``each_line`` from the start; ``LastLines``
from a stream, as a backend's log API sends it).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from typing import IO

LINE_CAP = 16 * 1024
"""A longer line is shown cut there (as the follower cuts it: ``follow.LINE_MOST``)."""
SCAN_MOST = 64 << 20
"""The most of a log ``tail_lines`` looks at for its last lines."""
_BLOCK = 64 * 1024


def shown_line(head: bytes, length: int) -> str:
    """A line as shown: its first ``LINE_CAP`` bytes (``head``), and its length when cut."""
    text = head[:LINE_CAP].decode(errors="replace")
    return text if length <= LINE_CAP else f"{text} ... ({length} bytes)"


def tail_lines(f: IO[bytes], count: int) -> list[str]:
    """The last ``count`` lines of the open file ``f`` (split on newlines only; a last line
    without its newline is one), each ``shown_line``. Reads back from the end, by blocks, at
    most ``SCAN_MOST`` bytes."""
    end = size = f.seek(0, os.SEEK_END)
    if end > 0:
        f.seek(end - 1)
        end -= f.read(1) == b"\n"  # the last line's newline ends it: no empty line after it
    found: list[str] = []
    head, length, pos = b"", 0, end  # the line being read back: its first bytes so far

    while pos > 0 and len(found) < count and end - pos < SCAN_MOST:
        start = max(0, pos - _BLOCK)
        f.seek(start)
        block = f.read(pos - start)
        cut = len(block)
        while len(found) < count and (newline := block.rfind(b"\n", 0, cut)) >= 0:
            head, length = (
                (block[newline + 1 : cut] + head)[: LINE_CAP + 1],
                length + cut - newline - 1,
            )
            found.append(shown_line(head, length))
            head, length, cut = b"", 0, newline
        head, length = (block[:cut] + head)[: LINE_CAP + 1], length + cut
        pos = start
    if pos == 0 and len(found) < count and size > 0:
        found.append(shown_line(head, length))  # the log's first line
    return found[::-1]


def each_line(f: IO[bytes]) -> Iterator[str]:
    """Every line of the open file ``f``, from its start, each ``shown_line``: a line's rest
    past ``LINE_CAP`` is counted, never held."""
    while True:
        head = f.readline(LINE_CAP + 1)
        if not head:
            return
        length = len(head)
        while not head.endswith(b"\n") and length > LINE_CAP:
            rest = f.readline(_BLOCK)  # the rest of a long line: counted, dropped
            if not rest:
                break
            length += len(rest)
            if rest.endswith(b"\n"):
                head += b"\n"
        ended = head.endswith(b"\n")
        yield shown_line(head[:-1] if ended else head, length - ended)


class LastLines:
    """The last ``count`` lines of a log streamed in chunks of any size (split on newlines
    only), each ``shown_line``: at most ``count`` cut lines and one line's head are held, and
    ``feed`` stops taking chunks after ``SCAN_MOST`` bytes."""

    def __init__(self, count: int) -> None:
        self.lines: deque[str] = deque(maxlen=max(count, 0))
        self.head, self.length, self.seen = b"", 0, 0

    def feed(self, chunks: Iterable[bytes]) -> None:
        """Take ``chunks`` in order, until they end or ``SCAN_MOST`` bytes were taken."""
        for chunk in chunks:
            start = 0
            while (newline := chunk.find(b"\n", start)) >= 0:
                self._add(chunk[start:newline])
                self.lines.append(shown_line(self.head, self.length))
                self.head, self.length, start = b"", 0, newline + 1
            self._add(chunk[start:])
            self.seen += len(chunk)
            if self.seen >= SCAN_MOST:
                return

    def _add(self, part: bytes) -> None:
        if len(self.head) <= LINE_CAP:
            self.head += part[: LINE_CAP + 1 - len(self.head)]
        self.length += len(part)

    def result(self) -> list[str]:
        """The lines taken, the last one (without its newline) too."""
        found = list(self.lines)
        if self.length:
            found.append(shown_line(self.head, self.length))
        return found[-self.lines.maxlen :] if self.lines.maxlen else []
