"""Which step may start next: the one scheduler every runner drives.

Shaped like ``graphlib.TopologicalSorter`` (``prepare``, ``get_ready``, ``done``, ``is_active``)
plus ``failed``, it holds the dependency counting, the ready order and the failure policy, so the
local ``StepRunner`` and the Prefect flow body only decide *how* a step runs, never *when*:

- a step is ready once all of its dependencies are done; ready steps come out longest remaining
  chain first (the critical path never queues behind short side branches), or in the order they
  became ready (``order="fifo"``);
- a failed step blocks every step downstream of it;
- fail-fast (the default): after a failure nothing new starts; steps already running finish.
  ``keep_going=True``: independent branches go on;
- a running step that could not start after all (another driver holds it) is ``defer``red: it
  stops counting as running until the caller ``resume``s it, when it is ready again (the run
  loop's ``Waiting`` holds it meanwhile, ``run/waiting.py``).

Nodes are opaque strings (the runners use output paths). The caller caps how many run at once by
asking ``get_ready(limit)``, and may ``admit`` only some (resource limits).
"""

from __future__ import annotations

import graphlib
import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from marin.execution.errors import CycleError, InvalidStepError

READY_ORDERS = ("longest-path", "fifo")


@dataclass
class Outcome:
    """How the nodes ended, once the scheduler is no longer active."""

    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    blocked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Not run because a dependency failed -> the failed nodes upstream of it."""
    not_started: list[str] = field(default_factory=list)
    """Not run because the run stopped after a failure (fail-fast); nothing upstream failed."""
    stopped_by: str | None = None
    """The failure that stopped the run (fail-fast), if any."""


class Scheduler:
    """The one scheduler: dependency counting and ready order over output paths, with fail-fast
    or keep-going. Pure mechanism (no threads, no I/O): the run loop decides how a step runs.

    Protocol: ``prepare()``, then ``get_ready(n)`` / ``done(p)`` / ``failed(p)`` while
    ``is_active()``, then ``finish()`` for what was blocked or never started."""

    def __init__(
        self,
        deps: Mapping[str, Iterable[str]],
        *,
        keep_going: bool = False,
        order: str = "longest-path",
        label: Callable[[str], str] = str,
    ) -> None:
        """``deps``: node -> the nodes it waits for (only nodes of this mapping count; others
        are taken as done). ``label`` names a node in errors (the runners pass the step id)."""
        if order not in READY_ORDERS:
            raise InvalidStepError(
                f"ready order {order!r}", f"use one of {', '.join(READY_ORDERS)}"
            )
        self._deps = {node: list(dict.fromkeys(ds)) for node, ds in deps.items()}
        self._keep_going = keep_going
        self._fifo = order == "fifo"
        self._label = label
        self._prepared = False
        self._dependents: dict[str, list[str]] = {}
        self._waiting: dict[str, int] = {}
        self._priority: dict[str, int] = {}
        self._ready: list[tuple[int, int, str]] = []
        self._sequence = 0
        self.running: set[str] = set()
        self.outcome = Outcome()
        self._finished: set[str] = set()
        self._stopped = False

    def prepare(self) -> None:
        """Count dependencies and rank the nodes; raises ``CycleError`` naming the cycle."""
        if self._prepared:
            raise RuntimeError("prepare() called twice")
        self._prepared = True
        nodes = self._deps
        self._dependents = {node: [] for node in nodes}
        for node, ds in nodes.items():
            inside = [d for d in ds if d in nodes]
            self._waiting[node] = len(inside)
            for d in inside:
                self._dependents[d].append(node)
        order = self._topological_order()
        if len(order) < len(nodes):
            self._raise_cycle()
        if not self._fifo:
            for node in reversed(order):
                self._priority[node] = 1 + max(
                    (self._priority[d] for d in self._dependents[node]), default=0
                )
        self._make_ready(n for n in nodes if self._waiting[n] == 0)

    def get_ready(
        self, limit: int | None = None, admit: Callable[[str], bool] | None = None
    ) -> list[str]:
        """Up to ``limit`` ready nodes, best first, now counted as running.

        ``admit(node)`` may refuse a node (it stays ready for a later call); nodes after it are
        still offered, so ``admit`` owns any fairness rule between big and small steps.
        """
        if not self._prepared:
            raise RuntimeError("call prepare() first")
        if self._stopped:
            return []
        started: list[str] = []
        refused: list[tuple[int, int, str]] = []
        while self._ready and (limit is None or len(started) < limit):
            item = heapq.heappop(self._ready)
            if admit is not None and not admit(item[2]):
                refused.append(item)
                continue
            started.append(item[2])
        for item in refused:
            heapq.heappush(self._ready, item)
        self.running.update(started)
        return started

    def done(self, node: str) -> None:
        self._finish(node)
        self.outcome.done.append(node)
        ready = []
        for child in self._dependents[node]:
            self._waiting[child] -= 1
            if self._waiting[child] == 0:
                ready.append(child)
        self._make_ready(ready)

    def failed(self, node: str) -> None:
        """``node`` failed: its descendants are blocked; without keep-going, the run stops."""
        self._finish(node)
        self.outcome.failed.append(node)
        stack = list(self._dependents[node])
        while stack:
            child = stack.pop()
            roots = self.outcome.blocked.setdefault(child, ())
            if node in roots:
                continue
            self.outcome.blocked[child] = (*roots, node)
            stack.extend(self._dependents[child])
        if not self._keep_going and not self._stopped:
            self.outcome.stopped_by = node
            self._stopped = True

    def defer(self, node: str) -> None:
        """A running ``node`` did not start after all: it no longer counts as running (its slot
        is free) and is neither running nor ready until ``resume`` (the caller holds it)."""
        if node not in self.running:
            raise ValueError(f"{self._label(node)} is not running")
        self.running.discard(node)

    def resume(self, node: str) -> None:
        """A deferred ``node`` is ready again, at its old rank; once stopped, it stays not
        started."""
        if node in self.running or node in self._finished:
            raise ValueError(f"{self._label(node)} is not deferred")
        if not self._stopped:
            self._make_ready([node])

    def stop(self) -> None:
        """Start nothing more (an interrupt); running nodes still report done or failed."""
        self._stopped = True

    @property
    def stopped(self) -> bool:
        """Nothing new starts any more (a failure under fail-fast, or ``stop``)."""
        return self._stopped

    def is_active(self) -> bool:
        """Something is running, or something ready can still start (a deferred node is the
        caller's to count)."""
        return bool(self.running) or (bool(self._ready) and not self._stopped)

    def finish(self) -> Outcome:
        """Once inactive: every node that neither finished nor is blocked was not started."""
        if self.is_active():
            raise RuntimeError("the scheduler is still active")
        self.outcome.not_started = [
            n for n in self._deps if n not in self._finished and n not in self.outcome.blocked
        ]
        return self.outcome

    # -- internals ------------------------------------------------------------------------------

    def _finish(self, node: str) -> None:
        if node not in self.running:
            raise ValueError(f"{self._label(node)} is not running")
        self.running.discard(node)
        self._finished.add(node)

    def _make_ready(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            rank = 0 if self._fifo else -self._priority[node]
            heapq.heappush(self._ready, (rank, self._sequence, node))
            self._sequence += 1

    def _topological_order(self) -> list[str]:
        """Dependencies before dependents; shorter than the node list if there is a cycle.

        Kahn's algorithm by hand: at 50,000 steps ``graphlib``'s bookkeeping cost more than the
        rest of the scheduler, and this walk also gives the ranks their order.
        """
        remaining = dict(self._waiting)
        order = [n for n in self._deps if remaining[n] == 0]
        for node in order:  # grows while it is walked
            for child in self._dependents[node]:
                remaining[child] -= 1
                if remaining[child] == 0:
                    order.append(child)
        return order

    def _raise_cycle(self) -> None:
        graph = {n: [d for d in ds if d in self._deps] for n, ds in self._deps.items()}
        try:
            graphlib.TopologicalSorter(graph).prepare()
        except graphlib.CycleError as exc:
            raise CycleError([self._label(n) for n in exc.args[1]]) from None
        raise AssertionError("unreachable: the graph has no cycle")
