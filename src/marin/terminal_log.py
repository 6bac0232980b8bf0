"""The one log handler that shows the CLI's log lines on the terminal.

It lives in its own small module (not ``marin.cli``) so that the live progress display can swap
it out and back even when the CLI runs as ``python -m marin.cli``, where ``marin.cli`` would be
imported a second time under another name.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

_active: logging.Handler | None = None
_default: logging.Handler | None = None


def configure(verbose: bool) -> None:
    """Log to the real stderr (never into a step's log); calling it again replaces, not adds."""
    global _default
    from marin.execution.builder.step_logs import TERMINAL_FORMAT, StepLabelFilter, real_stream

    handler = logging.StreamHandler(real_stream(sys.stderr))
    handler.setFormatter(SafeFormatter(TERMINAL_FORMAT, "%H:%M:%S", defaults={"marin_label": ""}))
    handler.addFilter(StepLabelFilter())  # a step's own log lines carry its label
    _default = handler
    swap(None)
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
    # The storage libraries log their retries, with tracebacks, long before they give up; the
    # engine reports the failure once, as a one-line error. ``-v`` shows them again.
    for name in STORAGE_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.CRITICAL)


STORAGE_LOGGERS = ("aiobotocore", "botocore", "s3fs", "gcsfs", "aiohttp", "urllib3", "fsspec")


class SafeFormatter(logging.Formatter):
    """Log lines carry step names and stored strings: no escape sequence reaches the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        from marin.terminal_text import safe_text

        return safe_text(super().format(record), keep_newlines=True)


def swap(handler: logging.Handler | None) -> None:
    """Show log lines through ``handler`` instead (a live display prints them); None restores."""
    global _active
    root = logging.getLogger()
    if _active is not None:
        root.removeHandler(_active)
    _active = handler if handler is not None else _default
    if _active is not None:
        root.addHandler(_active)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold the terminal's log handler: a step thread's log line waits until the block has
    written (the run summary), instead of landing in the middle of it."""
    handler = _active
    if handler is None:
        yield
        return
    handler.acquire()
    try:
        yield
    finally:
        handler.release()
