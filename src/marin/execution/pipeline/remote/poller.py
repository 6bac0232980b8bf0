"""One thread watches every remote job of this process: a thousand waiting jobs cost one thread
of polling (each waiting build parks on an event, and uses no CPU).

Each job is polled with its own bounded backoff (``FIRST_DELAY_S`` doubling to ``MAX_DELAY_S``),
and the build's lost-lease event is checked at every poll, so a displaced holder cancels its job
within ``MAX_DELAY_S``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from marin.execution.pipeline.remote.protocol import JobHandle, JobStatus, RemoteBackend
from marin.execution.vocabulary import JobState

log = logging.getLogger("marin")

FIRST_DELAY_S = 0.05
MAX_DELAY_S = float(os.environ.get("MARIN_REMOTE_POLL_MAX_S", "2.0"))


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


class Poller:
    """The process's one job watcher; see the module docstring."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def wait(self, watch: Watch) -> Watch:
        """Block until the job ends or the lease is lost; the answer is in ``watch``."""
        with self._cond:
            heapq.heappush(self._due, (time.monotonic(), next(self._order), watch))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="marin-remote-poller",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            self._cond.notify()
        watch.done.wait()
        return watch

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
                watch.delay = min(watch.delay * 2, MAX_DELAY_S)

    @staticmethod
    def _poll(watch: Watch) -> bool:
        """One look; whether the watch is over."""
        if watch.lost.is_set():
            watch.lease_lost = True
            watch.done.set()
            return True
        try:
            status = watch.backend.status(watch.handle)
        except Exception as exc:  # a backend outage: keep waiting, say so
            log.warning("could not ask about job %s: %s", watch.handle.job_id, exc)
            return False
        if status.state == JobState.RUNNING:
            return False
        watch.status = status
        watch.done.set()
        return True


POLLER = Poller()
