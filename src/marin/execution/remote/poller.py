"""One thread watches every remote job of this process: a thousand waiting jobs cost one thread
of polling. A build waits for its job either on an event (``wait``: Prefect's task, a direct
``build_step``) or on no thread at all (``watch``: the job's end calls back; the run loop).
``_poll`` is the one place each running job is looked at: what follows a job while it runs
(its log, a gang's ranks) hooks in there.

Each job is polled with its own bounded backoff (``FIRST_DELAY_S`` doubling to ``MAX_DELAY_S``),
and the build's lost-lease event is checked at every poll, so a displaced holder cancels its job
within ``MAX_DELAY_S``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from marin.execution.remote.follow import JobLog
from marin.execution.remote.protocol import JobHandle, JobStatus, RemoteBackend
from marin.execution.vocabulary import JobState

log = logging.getLogger("marin")

POLL_MAX_ENV = "MARIN_REMOTE_POLL_MAX_S"


def poll_max_s(default: float) -> float:
    """The longest wait between two looks at a job: ``$MARIN_REMOTE_POLL_MAX_S`` when set (a
    test's jobs end within seconds), else ``default`` (2 s here; an Airflow trigger's 30 s).
    A setting that is not a positive number of seconds is warned of and ``default`` kept: a
    tuning knob never stops an import, nor a job from being watched. Set but empty is unset."""
    text = os.environ.get(POLL_MAX_ENV)
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        log.warning(
            "%s=%r is not a positive number of seconds: polling waits up to %s s (unset it, "
            "or set it to e.g. 0.5)",
            POLL_MAX_ENV,
            text[:100],
            default,
        )
        return default
    return seconds


FIRST_DELAY_S = 0.05
MAX_DELAY_S = poll_max_s(2.0)
FOLLOW_DELAY_S = 1.0
"""A followed job is looked at at least every second: its output shows while it runs."""


@dataclass(eq=False)
class Watch:
    """One job being waited for; ``done`` is set with ``status`` (or ``lease_lost``)."""

    backend: RemoteBackend
    handle: JobHandle
    lost: threading.Event
    done: threading.Event = field(default_factory=threading.Event)
    status: JobStatus | None = None
    lease_lost: bool = False
    delay: float = FIRST_DELAY_S
    on_end: Callable[[], None] | None = None
    """Called once, on the poller's thread, when ``done`` is set; it must not block."""
    dropped: bool = False
    """Nobody waits any more (the build was given up): the next look forgets the job."""
    follow: JobLog | None = None
    """The job's output, handed on at each look while it runs (``follow.py``)."""


class Poller:
    """The process's one job watcher; see the module docstring."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def wait(self, watch: Watch) -> Watch:
        """Block until the job ends or the lease is lost; the answer is in ``watch``."""
        self.watch(watch)
        watch.done.wait()
        return watch

    def watch(self, watch: Watch, on_end: Callable[[], None] | None = None) -> None:
        """Watch the job from the poller's thread; ``on_end`` is called when ``done`` is set."""
        watch.on_end = on_end
        with self._cond:
            heapq.heappush(self._due, (time.monotonic(), next(self._order), watch))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="marin-remote-poller",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, watch = heapq.heappop(self._due)
            if not self._poll(watch):
                with self._cond:
                    due = time.monotonic() + watch.delay
                    heapq.heappush(self._due, (due, next(self._order), watch))
                most = MAX_DELAY_S if watch.follow is None else min(MAX_DELAY_S, FOLLOW_DELAY_S)
                watch.delay = min(watch.delay * 2, most)

    @staticmethod
    def _poll(watch: Watch) -> bool:
        """One look; whether the watch is over."""
        if watch.dropped:
            if watch.follow is not None:
                watch.follow.cursor.close()
            return True
        if watch.lost.is_set():
            watch.lease_lost = True
        else:
            try:
                status = watch.backend.status(watch.handle)
            except Exception as exc:  # a backend outage: keep waiting, say so
                log.warning("could not ask about job %s: %s", watch.handle.job_id, exc)
                return False
            if watch.follow is not None:
                watch.follow.live.state = str(status.state)
            if status.state == JobState.RUNNING:
                if watch.follow is not None:
                    watch.follow.pump()
                return False
            watch.status = status
        if watch.follow is not None:
            watch.follow.finish()  # the job's last lines, before its end is handed on
        watch.done.set()
        if watch.on_end is not None:
            try:
                watch.on_end()
            except Exception:  # never the poller's end: every other job still needs it
                log.exception("the end of job %s could not be handed on", watch.handle.job_id)
        return True


POLLER = Poller()
