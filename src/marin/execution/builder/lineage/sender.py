"""The bounded background sender of OpenLineage events (``lineage.py`` queues, this sends).

One daemon thread owns the OpenLineage client and sends what builds queued; a build never
waits for it. A full queue drops events. The first failure of any kind is one warning, and the
transport's own retry lines from the thread are filtered out, so a dead backend costs a log
line, not a build. At exit the queue is drained for at most ``MARIN_LINEAGE_FLUSH_S`` seconds.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marin.execution.builder.lineage.model import BuildEvent, PipelineEvent

log = logging.getLogger("marin")

QUEUE_SIZE = 10_000
"""Events waiting to be sent; beyond it events are dropped (with the one warning)."""
DEFAULT_FLUSH_S = 5.0


class LineageSender:
    """One background thread sending queued events through an OpenLineage client.

    ``submit`` never blocks: a full queue drops the event. The first failure (no client, a
    transport error, a full queue) is logged once as a warning; later ones only at debug level,
    so a dead backend costs a log line, not a build.
    """

    def __init__(self, maxsize: int = QUEUE_SIZE, client: Any = None) -> None:
        self._queue: queue.Queue[BuildEvent | PipelineEvent] = queue.Queue(maxsize)
        self._client = client
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._warned = False
        self.sent = 0
        self.dropped = 0

    def submit(self, event: BuildEvent | PipelineEvent) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._work, name=SENDER_THREAD, daemon=True
                    )
                    self._thread.start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            self._warn(f"the queue of {self._queue.maxsize} events is full; events are dropped")

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the queue to drain; whether it did."""
        done = self._queue.all_tasks_done
        with done:
            return done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout)

    def _warn(self, what: str) -> None:
        if self._warned:
            log.debug("lineage: %s", what)
            return
        self._warned = True
        log.warning(
            "lineage: could not send OpenLineage events (%s); builds go on, and further "
            "failures are not reported",
            what,
        )

    def _work(self) -> None:
        from marin.execution.builder.lineage.openlineage import make_client, to_run_event

        _quiet_sender_thread()

        client = self._client
        if client is None:
            try:
                client = make_client()
            except Exception as exc:  # a broken config must not end the thread: drain
                self._warn(f"no client: {type(exc).__name__}: {exc}")
        while True:
            event = self._queue.get()
            try:
                if client is not None:
                    client.emit(to_run_event(event))
                    self.sent += 1
            except Exception as exc:
                self.dropped += 1
                self._warn(f"{type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()


SENDER_THREAD = "marin-lineage"
_QUIETED = ("urllib3.connectionpool", "urllib3.util.retry", "openlineage")


class _NotFromSender(logging.Filter):
    """Drops the retry and transport log lines of the sender thread: its own one warning
    says a backend is failing, and a dead backend must not print a line per event."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != SENDER_THREAD or record.levelno < logging.WARNING


def _quiet_sender_thread() -> None:
    for name in _QUIETED:
        target = logging.getLogger(name)
        if not any(isinstance(f, _NotFromSender) for f in target.filters):
            target.addFilter(_NotFromSender())


_sender_lock = threading.Lock()
_the_sender: LineageSender | None = None


def sender() -> LineageSender:
    global _the_sender
    if _the_sender is None:
        with _sender_lock:
            if _the_sender is None:
                _the_sender = LineageSender()
                atexit.register(_flush_at_exit)
    return _the_sender


def use_sender(sender: LineageSender | None) -> LineageSender | None:
    """Replace the process's sender (tests); returns the previous one."""
    global _the_sender
    with _sender_lock:
        previous, _the_sender = _the_sender, sender
    return previous


def flush(timeout: float | None = None) -> bool:
    """Wait (at most ``timeout``, default ``MARIN_LINEAGE_FLUSH_S``) for queued events to go."""
    sender = _the_sender
    if sender is None:
        return True
    return sender.flush(flush_timeout() if timeout is None else timeout)


def flush_timeout() -> float:
    text = os.environ.get("MARIN_LINEAGE_FLUSH_S")
    try:
        return max(0.0, float(text)) if text else DEFAULT_FLUSH_S
    except ValueError:
        return DEFAULT_FLUSH_S


def _flush_at_exit() -> None:
    if not flush():
        log.warning(
            "lineage: %s OpenLineage event(s) not sent within %.0fs at exit (raise "
            "MARIN_LINEAGE_FLUSH_S to wait longer)",
            _the_sender._queue.unfinished_tasks if _the_sender else 0,
            flush_timeout(),
        )
