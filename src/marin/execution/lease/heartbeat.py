"""Heartbeats: one shared daemon thread renews every lease this process holds."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time

from marin.execution import faults
from marin.execution.lease.core import Lease, _held, _held_lock

log = logging.getLogger("marin")


_COMPACT_SLACK = 64
"""Stale heap entries tolerated beyond the live ones before ``_Renewer.remove`` compacts:
compaction costs one pass over the heap, so it runs once per that many removals at least."""


class _Renewer:
    """Renews every held lease from one daemon thread, each at a third of its TTL."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Heartbeat]] = []
        self._active: set[Heartbeat] = set()
        self._beating: Heartbeat | None = None
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, beat: Heartbeat) -> None:
        with self._cond:
            self._active.add(beat)
            heapq.heappush(self._due, (time.monotonic() + beat.interval, next(self._order), beat))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="marin-lease-heartbeat", daemon=True
                )
                self._thread.start()
            elif self._due[0][2] is beat:
                self._cond.notify_all()  # only a new earliest deadline changes the thread's wait

    def remove(self, beat: Heartbeat) -> None:
        with self._cond:
            self._active.discard(beat)
            # A removed beat's entry stays in the heap until its deadline (a third of its TTL
            # away), and most builds end long before that: compact once the stale entries
            # outnumber the live ones, or a fast run keeps every build's heartbeat, lease and
            # event alive (the collector scanning them made per-step time grow with the run).
            if len(self._due) > 2 * len(self._active) + _COMPACT_SLACK:
                self._due = [entry for entry in self._due if entry[2] in self._active]
                heapq.heapify(self._due)
            while self._beating is beat:  # never return while its renewal is in flight
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._due and self._due[0][2] not in self._active:
                        heapq.heappop(self._due)
                    if not self._due:
                        self._cond.wait()
                        continue
                    delay = self._due[0][0] - time.monotonic()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                _, _, beat = heapq.heappop(self._due)
                self._beating = beat
            keep = True
            try:
                keep = beat.beat()
            finally:
                with self._cond:
                    self._beating = None
                    if keep and beat in self._active:
                        heapq.heappush(
                            self._due,
                            (time.monotonic() + beat.interval, next(self._order), beat),
                        )
                    self._cond.notify_all()


_RENEWER = _Renewer()


class Heartbeat:
    """Renews a lease in the background while its step runs (on the shared renewal thread)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost = threading.Event()
        self.interval = max(lease.ttl / 3, 0.05)

    def beat(self) -> bool:
        """Renew once; False once the lease is lost (stop renewing)."""
        if faults.heartbeat_paused():
            return True
        try:
            if self.lease.renew():
                return True
        except OSError as exc:
            log.warning("could not renew lease %s: %s", self.lease.path, exc)
            return True
        with _held_lock:
            released = self.lease not in _held  # released under us (Ctrl-C): not a takeover
        if not released and self.lease.vanished:
            log.warning("lost lease %s: the lease file was deleted while the step ran",
                        self.lease.path)  # fmt: skip
        elif not released:
            log.warning("lost lease %s: another runner took it over", self.lease.path)
        self.lost.set()
        return False

    def __enter__(self) -> Heartbeat:
        _RENEWER.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _RENEWER.remove(self)
