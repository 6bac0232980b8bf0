"""Following a remote job's output while it runs (issue 55).

A backend that can show a job's log as it grows offers ``follow(handle)`` (optional, beside the
protocol's methods): a ``LogCursor`` that hands out, without blocking, what the job printed
since the last read (``local``: its log file from an offset; ``ray``: Ray's ``tail_job_logs``).
The process's one poller reads each followed job's cursor at every look (``poller.py``), and
``JobLog`` cuts what it read into lines for the step: its ``log.txt`` and, labelled, the
terminal (``on_lines``, given by the build), and keeps the job's last line and state for the
live display (``live_jobs``).

Memory stays bounded whatever the job prints: a cursor hands out at most ``READ_MOST`` bytes at
a time, a line longer than ``LINE_MOST`` is cut, and Marin's own outcome line (``ray.py``) is
never shown. What a job prints is data: it is shown, never acted on.
"""

from __future__ import annotations

import codecs
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from marin.execution.store.step_folder import JobRecord

log = logging.getLogger("marin")

READ_MOST = 1 << 20
"""The most of a job's log held at once."""
LOOK_MOST = 16 << 20
"""The most of a job's log handed on at one look (the poller looks again within a second);
its end hands on all the rest."""
LINE_MOST = 16 * 1024
"""A longer line is cut there (its rest is skipped to its newline)."""
HIDDEN_PREFIX = "<<<marin-outcome "
"""The outcome line ``ray_entry`` prints last (``ray.py``): Marin's, not the job's output."""


class LogCursor(Protocol):
    """What a job printed since the last read; see the module docstring."""

    def read(self, most: int) -> bytes:
        """At most ``most`` bytes printed since the last read; ``b""`` when there is none."""
        ...

    def close(self) -> None:
        """Stop following (the job ended, or nobody waits for it any more)."""
        ...


@dataclass
class LiveJob:
    """A job this process waits for, as the live display and the Ctrl-C message show it."""

    job: JobRecord
    prefix: str
    """The prefix its step is built under (``marin cancel --prefix``)."""
    state: str = "running"
    last_line: str = ""


@dataclass(eq=False)
class JobLog:
    """One followed job: its cursor, where its lines go, and its last line."""

    cursor: LogCursor
    on_lines: Callable[[list[str]], None]
    live: LiveJob
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    _partial: str = ""
    _skipping: bool = False
    """Inside a line that was cut (or hidden): its rest is dropped up to its newline."""
    finished: bool = False
    """The job's whole log was handed on (``finish``): its tail need not be copied again."""

    def pump(self, most: int | None = LOOK_MOST) -> None:
        """Hand on what the job printed since the last look (whole lines only), at most
        ``most`` bytes (None: all of it), ``READ_MOST`` at a time."""
        taken = 0
        while most is None or taken < most:
            try:
                data = self.cursor.read(READ_MOST)
            except Exception as exc:  # an outage: the next look tries again
                log.debug("could not read the log of job %s: %s", self.live.job.job_id, exc)
                return
            if not data:
                return
            taken += len(data)
            self._lines(self._decoder.decode(data))

    def finish(self) -> None:
        """The job ended: what is left, its last partial line too; then stop following."""
        settle = getattr(self.cursor, "settle", None)
        if callable(settle):  # a stream that lags behind the job's end (Ray's)
            settle()
        self.pump(None)
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        if rest and not self._skipping and not rest.startswith(HIDDEN_PREFIX):
            self._emit([rest])
        self.cursor.close()
        self.finished = True

    def _lines(self, text: str) -> None:
        *lines, rest = (self._partial + text).split("\n")
        shown = []
        for line in lines:
            if self._skipping:
                self._skipping = False  # the end of a cut line
            elif not line.startswith(HIDDEN_PREFIX):
                shown.append(line.removesuffix("\r"))
        if len(rest) > LINE_MOST:
            if not self._skipping and not rest.startswith(HIDDEN_PREFIX):
                shown.append(rest[:LINE_MOST] + " [line cut]")
            rest, self._skipping = "", True
        self._partial = rest
        if shown:
            self._emit(shown)

    def _emit(self, lines: list[str]) -> None:
        self.live.last_line = next((line for line in reversed(lines) if line.strip()),
                                   self.live.last_line)  # fmt: skip
        try:
            self.on_lines(lines)
        except Exception as exc:  # advisory: a log that cannot be written never fails a build
            log.debug("could not hand on the log of job %s: %s", self.live.job.job_id, exc)


def follow_job(
    backend: object, live: LiveJob, on_lines: Callable[[list[str]], None] | None
) -> JobLog | None:
    """A ``JobLog`` of the job, when its backend can follow it and its lines have somewhere to
    go; else None (its log tail is copied once it ended, as before)."""
    follow = getattr(backend, "follow", None)
    if on_lines is None or not callable(follow):
        return None
    try:
        cursor = follow(live.job.handle)
    except Exception as exc:  # advisory: the job is waited for all the same
        log.debug("cannot follow job %s: %s", live.job.job_id, exc)
        return None
    return JobLog(cursor, on_lines, live)


_live_lock = threading.Lock()
_live: dict[str, LiveJob] = {}
"""step id -> the job this process waits for: the live display and the Ctrl-C message."""


def live_jobs() -> dict[str, LiveJob]:
    """The jobs this process waits for, by step id."""
    with _live_lock:
        return dict(_live)


def note_live(step_id: str, live: LiveJob | None) -> None:
    """Note (or, with None, forget) the job this process waits for on behalf of ``step_id``."""
    with _live_lock:
        if live is None:
            _live.pop(step_id, None)
        else:
            _live[step_id] = live
