"""Per-step log capture: what a step's ``fn`` prints or logs lands in that step's ``log.txt``.

Several steps run at once on threads of one process, so ``sys.stdout`` cannot simply be swapped
per step. Instead one routing stream is installed for the whole process; it looks up the current
step in a context variable (each worker runs in its own copy of the caller's context), writes
the text to that step's log as is, and also passes it through to the terminal. A logging handler
does the same for ``logging`` records. Threads that ``fn`` starts itself do not inherit the
context, so their output goes only to the real stream.

The pass-through is line-based, like ``docker compose``: each complete line is labelled with its
step (``ngram/corpus@v1 | working on shard 2``) and written in one piece under one lock, so a
line is never split between two steps; a partial line waits for its newline (or the step's end).

It normally goes to the real stream, each line shown through what ``set_shown`` installed (the
CLI makes the escapes a step printed visible). A live progress display, which owns the
terminal, installs an echo with :func:`set_echo`; step output is then handed to it (so it can
print the lines above the display) instead of being written under the display's feet.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

from marin.execution.printable import safe_text
from marin.execution.store.location import Location, open_local
from marin.execution.store.step_folder import log_path

LABEL_SEPARATOR = " | "


class _Sink:
    """One running step: its log file, its label and its not-yet-finished terminal lines."""

    def __init__(self, log: IO[str], label: str | None) -> None:
        self.log = log
        self.label = label
        self.pending: dict[_RoutingStream, str] = {}
        self.lock = threading.Lock()

    def complete_lines(self, stream: _RoutingStream, text: str) -> list[str]:
        with self.lock:
            *lines, rest = (self.pending.get(stream, "") + text).split("\n")
            self.pending[stream] = rest
        return lines

    def take_pending(self) -> list[tuple[_RoutingStream, str]]:
        with self.lock:
            pending = [(stream, rest) for stream, rest in self.pending.items() if rest]
            self.pending.clear()
        return pending


_current: contextvars.ContextVar[_Sink | None] = contextvars.ContextVar(
    "marin_step_log", default=None
)
_install_lock = threading.Lock()
_line_lock = threading.Lock()
"""Held while one batch of labelled lines is written: lines of two steps never interleave."""
_handler: logging.Handler | None = None
_echo: Callable[[str], None] | None = None
PASS_THROUGH = contextvars.ContextVar("marin_log_pass_through", default=True)
"""Set to False (before a run; workers inherit it) to keep step output off the terminal."""


_shown: Callable[[str], str] | None = None
"""How each echoed line is shown (``set_shown``); None: as it was printed."""


def set_shown(shown: Callable[[str], str] | None) -> None:
    """Show each echoed line of step output through ``shown`` (the CLI: ``safe_text``, so the
    escapes a step printed are visible, never acted on, on a terminal or in a CI log; the
    step's ``log.txt`` keeps them as printed), or reset."""
    global _shown
    _shown = shown


def label_lines(lines: list[str], label: str | None) -> str:
    """``lines`` as one text, each line shown (``set_shown``) and prefixed with ``label |``
    (nothing without a label)."""
    prefix = f"{label}{LABEL_SEPARATOR}" if label else ""
    shown = _shown
    if shown is not None:
        lines = [shown(line) for line in lines]
    return "".join(f"{prefix}{line}\n" for line in lines)


class _RoutingStream:
    def __init__(self, real: Any) -> None:
        self._real = real

    @property
    def real(self) -> Any:
        return self._real

    def write(self, text: str) -> int:
        sink = _current.get()
        if sink is None:
            return int(self._real.write(text))
        with contextlib.suppress(ValueError, OSError):
            sink.log.write(text)
            sink.log.flush()
        if PASS_THROUGH.get():
            lines = sink.complete_lines(self, text)
            if lines:
                self.emit(label_lines(lines, sink.label))
        return len(text)

    def emit(self, text: str) -> None:
        """Whole labelled lines to the display's echo, or to the real stream in one write."""
        echo = _echo
        if echo is not None:
            echo(text)
            return
        with _line_lock, contextlib.suppress(ValueError, OSError):
            self._real.write(text)
            self._real.flush()

    def flush(self) -> None:
        self._real.flush()

    def isatty(self) -> bool:
        return bool(self._real.isatty())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _StepLogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        sink = _current.get()
        if sink is None or record.name == "marin" or record.name.startswith("marin."):
            return
        with contextlib.suppress(ValueError, OSError):
            sink.log.write(self.format(record) + "\n")
            sink.log.flush()


class StepLabelFilter(logging.Filter):
    """For terminal handlers: drop a step's own log records when pass-through is off, and set
    ``record.marin_label`` (``"name@version | "`` or ``""``) for :data:`TERMINAL_FORMAT`.

    Marin's own records (``marin.*``) are never dropped nor labelled; the record's message is
    left alone, so the step's ``log.txt`` still gets it unlabelled.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        sink = _current.get()
        if sink is None or record.name == "marin" or record.name.startswith("marin."):
            record.marin_label = ""
            return True
        if not PASS_THROUGH.get():
            return False
        record.marin_label = f"{sink.label}{LABEL_SEPARATOR}" if sink.label else ""
        return True


TERMINAL_FORMAT = "%(asctime)s %(levelname)-7s %(marin_label)s%(message)s"


def terminal_formatter() -> logging.Formatter:
    """The terminal's log line format; pair it with :class:`StepLabelFilter`."""
    return logging.Formatter(TERMINAL_FORMAT, "%H:%M:%S", defaults={"marin_label": ""})


def real_stream(stream: Any) -> Any:
    """``stream`` without the routing wrapper: for writers that must never reach a step's log."""
    while isinstance(stream, _RoutingStream):
        stream = stream.real
    return stream


def install() -> None:
    """Install the routing streams and the log handler (idempotent).

    ``sys.stdout``/``sys.stderr`` are re-wrapped whenever someone replaced them since the last
    call (a test harness capturing output, for instance), so capture keeps working.
    """
    global _handler
    root = logging.getLogger()
    if (
        _handler is not None
        and isinstance(sys.stdout, _RoutingStream)
        and isinstance(sys.stderr, _RoutingStream)
        and _handler in root.handlers
    ):
        return  # every step calls this: the common case takes no lock
    with _install_lock:
        if not isinstance(sys.stdout, _RoutingStream):
            sys.stdout = _RoutingStream(sys.stdout)
        if not isinstance(sys.stderr, _RoutingStream):
            sys.stderr = _RoutingStream(sys.stderr)
        if _handler is None:
            _handler = _StepLogHandler()
            _handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
        if _handler not in root.handlers:
            # Also after someone reset the root logger's handlers since the last call (an
            # engine's logging.config.dictConfig, basicConfig(force=True)): steps' log records
            # would silently stop reaching their log.txt.
            root.addHandler(_handler)


def lines_writer() -> Callable[[list[str]], None] | None:
    """Where another thread writes whole lines into the step running in this context (a
    remote job's output as it runs, ``remote/follow.py``): its log as they are, and the
    terminal labelled, with control characters escaped (a job's output is untrusted), unless
    pass-through is off. None outside a step."""
    sink = _current.get()
    if sink is None:
        return None
    through = PASS_THROUGH.get()
    install()
    routing = sys.stdout

    def write(lines: list[str]) -> None:
        with contextlib.suppress(ValueError, OSError):
            sink.log.write("".join(f"{line}\n" for line in lines))
            sink.log.flush()
        if through and isinstance(routing, _RoutingStream):
            routing.emit(label_lines([safe_text(line) for line in lines], sink.label))

    return write


def set_echo(echo: Callable[[str], None] | None) -> None:
    """Send step output's pass-through to ``echo`` (called on the step's thread, with whole
    labelled lines), or reset."""
    global _echo
    _echo = echo


class _Capture:
    """``capture_step_output``'s context manager: a class, since every step enters one."""

    __slots__ = ("_sink", "_token")

    def __init__(self, stream: IO[str], label: str | None) -> None:
        self._sink = _Sink(stream, label)
        self._token: contextvars.Token[_Sink | None] | None = None

    def __enter__(self) -> None:
        install()
        self._token = _current.set(self._sink)

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _current.reset(self._token)
        if PASS_THROUGH.get():
            label = self._sink.label
            for routing, rest in self._sink.take_pending():
                routing.emit(label_lines([rest], label))


def capture_step_output(
    stream: IO[str], label: str | None = None
) -> contextlib.AbstractContextManager[None]:
    """Route this context's prints and log records into ``stream`` while the block runs.

    ``label`` (the step's ``name@version``) prefixes each line passed through to the terminal.
    A last line without a newline is passed through when the block ends.
    """
    return _Capture(stream, label)


class LazyLogFile:
    """A step's ``log.txt`` on local disk, created on the first write.

    Most steps print nothing, and creating, writing and closing an empty file for each of them
    was a measurable share of a no-op build. ``close`` says whether the file was created.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        if not text:
            return 0
        with self._lock:  # fn's own threads may print at once: one file, created once
            if self._file is None:
                # Never through a link at log.txt (open_local refuses one).
                self._file = open_local(self.path, "w")
            return self._file.write(text)

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> bool:
        with self._lock:
            if self._file is None:
                return False
            self._file.close()
            return True


def written_log_url(location: Location, output_path: str) -> str | None:
    """The URL of the step's ``log.txt``, or None when no build wrote one: a build refused
    before ``fn`` ran writes none (and one whose ``fn`` neither printed nor raised). A failure
    names only a log that is there; one that cannot be checked (storage failing) is named."""
    path = log_path(output_path)
    try:
        written = location.has_file(location.path(path))
    except OSError:  # StorageError and SymlinkError are OSErrors too
        written = True
    return location.url_for(path) if written else None
