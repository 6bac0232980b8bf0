"""Heartbeats: one shared daemon thread renews every lease this process holds."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time

from marin.execution import faults
from marin.execution.store.lease.core import Lease, _held, _held_lock

log = logging.getLogger("marin")


_COMPACT_SLACK = 64
"""Stale heap entries tolerated beyond the live ones before ``_Renewer.remove`` compacts:
compaction costs one pass over the heap, so it runs once per that many removals at least."""


class _Renewer:
    """Renews every held lease from one daemon thread, each at a third of its TTL."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._due: list[tuple[float, int, Heartbeat]] = []
        self._active: set[Heartbeat] = set()
        self._beating: Heartbeat | None = None
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = math.inf
        """When the thread looks at the heap next (``time.monotonic()``; inf: not until told)."""
        self._idle_wait = 0.0
        """The interval of the last beat added: how long an idle thread waits before it gives
        up expecting more (see ``_run``)."""

    def add(self, beat: Heartbeat) -> None:
        with self._cond:
            self._active.add(beat)
            due = time.monotonic() + beat.interval
            heapq.heappush(self._due, (due, next(self._order), beat))
            self._idle_wait = beat.interval
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="marin-lease-heartbeat", daemon=True
                )
                self._wake_at = -math.inf  # a new thread looks at the heap first thing
                self._thread.start()
            elif due < self._wake_at:
                # Only a deadline before the thread's next look changes its wait. Waking it
                # costs the building thread more than the notify: a woken thread that wants
                # the GIL takes it at the builder's next system call, and on this VM a build
                # then paid for a hand-off between CPUs at each of its calls (issue 23).
                self._cond.notify_all()

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
                idle = False
                while True:
                    while self._due and self._due[0][2] not in self._active:
                        heapq.heappop(self._due)
                    now = time.monotonic()
                    if not self._due:
                        if idle or not self._idle_wait:
                            self._wake_at = math.inf  # idle for a whole interval: sleep
                            self._cond.wait()
                        else:
                            # Builds come and go faster than their interval: the next one's
                            # deadline is at least an interval away, so waiting that long
                            # means an add need not wake this thread.
                            idle = True
                            self._wake_at = now + self._idle_wait
                            self._cond.wait(self._idle_wait)
                        continue
                    idle = False
                    self._wake_at = self._due[0][0]
                    if self._wake_at <= now:
                        break
                    self._cond.wait(self._wake_at - now)
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
