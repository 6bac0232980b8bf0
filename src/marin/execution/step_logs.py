"""Per-step log capture: what a step's ``fn`` prints or logs lands in that step's ``log.txt``.

Several steps run at once on threads of one process, so ``sys.stdout`` cannot simply be swapped
per step. Instead one routing stream is installed for the whole process; it looks up the current
step's log in a context variable (each worker runs in its own copy of the caller's context) and
writes there, and also passes the text through to the real stream. A logging handler does the same
for ``logging`` records. Threads that ``fn`` starts itself do not inherit the context, so their
output goes only to the real stream.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

_current_log: contextvars.ContextVar[IO[str] | None] = contextvars.ContextVar(
    "marin_step_log", default=None
)
_install_lock = threading.Lock()
_installed = False
PASS_THROUGH = contextvars.ContextVar("marin_log_pass_through", default=True)


class _RoutingStream:
    def __init__(self, real: Any) -> None:
        self._real = real

    def write(self, text: str) -> int:
        target = _current_log.get()
        if target is not None:
            with contextlib.suppress(ValueError, OSError):
                target.write(text)
                target.flush()
            if not PASS_THROUGH.get():
                return len(text)
        return int(self._real.write(text))

    def flush(self) -> None:
        self._real.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _StepLogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        target = _current_log.get()
        if target is None or record.name == "marin":
            return
        with contextlib.suppress(ValueError, OSError):
            target.write(self.format(record) + "\n")
            target.flush()


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        sys.stdout = _RoutingStream(sys.stdout)
        sys.stderr = _RoutingStream(sys.stderr)
        handler = _StepLogHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
        _installed = True


@contextlib.contextmanager
def capture_step_output(stream: IO[str]) -> Iterator[None]:
    """Route this context's prints and log records into ``stream`` while the block runs."""
    _install()
    token = _current_log.set(stream)
    try:
        yield
    finally:
        _current_log.reset(token)
