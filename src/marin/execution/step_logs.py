"""Per-step log capture: what a step's ``fn`` prints or logs lands in that step's ``log.txt``.

Several steps run at once on threads of one process, so ``sys.stdout`` cannot simply be swapped
per step. Instead one routing stream is installed for the whole process; it looks up the current
step's log in a context variable (each worker runs in its own copy of the caller's context) and
writes there, and also passes the text through to the terminal. A logging handler does the same
for ``logging`` records. Threads that ``fn`` starts itself do not inherit the context, so their
output goes only to the real stream.

The pass-through normally goes to the real stream. A live progress display, which owns the
terminal, installs an echo with :func:`set_echo`; step output is then handed to it (so it can
print the lines above the display) instead of being written under the display's feet.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

_current_log: contextvars.ContextVar[IO[str] | None] = contextvars.ContextVar(
    "marin_step_log", default=None
)
_install_lock = threading.Lock()
_handler: logging.Handler | None = None
_echo: Callable[[str], None] | None = None
PASS_THROUGH = contextvars.ContextVar("marin_log_pass_through", default=True)
"""Set to False (before a run; workers inherit it) to keep step output out of the terminal."""


class _RoutingStream:
    def __init__(self, real: Any) -> None:
        self._real = real

    @property
    def real(self) -> Any:
        return self._real

    def write(self, text: str) -> int:
        target = _current_log.get()
        if target is not None:
            with contextlib.suppress(ValueError, OSError):
                target.write(text)
                target.flush()
            if not PASS_THROUGH.get():
                return len(text)
            echo = _echo
            if echo is not None:
                echo(text)
                return len(text)
        return int(self._real.write(text))

    def flush(self) -> None:
        self._real.flush()

    def isatty(self) -> bool:
        return bool(self._real.isatty())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _StepLogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        target = _current_log.get()
        if target is None or record.name == "marin" or record.name.startswith("marin."):
            return
        with contextlib.suppress(ValueError, OSError):
            target.write(self.format(record) + "\n")
            target.flush()


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
            logging.getLogger().addHandler(_handler)


_install = install  # the old private name


def set_echo(echo: Callable[[str], None] | None) -> None:
    """Send step output's pass-through to ``echo`` (called on the step's thread), or reset."""
    global _echo
    _echo = echo


@contextlib.contextmanager
def capture_step_output(stream: IO[str]) -> Iterator[None]:
    """Route this context's prints and log records into ``stream`` while the block runs."""
    install()
    token = _current_log.set(stream)
    try:
        yield
    finally:
        _current_log.reset(token)


class LazyLogFile:
    """A step's ``log.txt`` on local disk, created on the first write.

    Most steps print nothing; creating, writing and closing an empty file for each of them was a
    measurable share of a no-op build. ``close`` reports whether the file was created.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def write(self, text: str) -> int:
        if not text:
            return 0
        if self._file is None:
            self._file = open(self.path, "w")  # noqa: SIM115 - closed in close()
        return self._file.write(text)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> bool:
        if self._file is None:
            return False
        self._file.close()
        return True
