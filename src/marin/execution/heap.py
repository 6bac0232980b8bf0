"""The objects a run starts with are left out of the garbage collector's scans while it runs.

A run holds its lowered graph (several objects per step) for its whole length and allocates a
record, an outcome and a few events per build; its plan, before it, reads every step's stored
state and makes a decision and a few views per step. Each allocation counts towards the cyclic
collector's next pass, and each full pass walks every tracked object, the whole graph included:
on a run of many small steps that is a large share of its time, spent finding no garbage in
objects that outlive the run (a plan of many thousand steps set off such passes while it
allocated its views, each walking the whole graph). ``gc.freeze()`` moves every object tracked
so far out of the collector's reach until ``gc.unfreeze()``, at no cost per object, while
everything made meanwhile (a step's own garbage included) is collected as usual. Lowering goes
further and switches the collector off, because it frees almost nothing
(``handles._lower_and_check``).

Three things run inside ``frozen_heap``: the run loop, the read of a plan's stored state
(``inspect.read_stored``) and the plan's decisions (``decide.plan_graph``), which every runner
and ``marin plan`` call. Only a process that has frozen nothing itself is touched: a server that
froze its heap before forking workers (what ``gc.freeze`` is for) keeps its frozen objects
frozen, and the run then changes nothing. Runs that overlap in one process (threads, or a step
that runs a pipeline) share one freeze, lifted when the last of them ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_runs = 0
"""Callers inside ``frozen_heap`` now."""
_froze = False
"""Whether the first of them froze the heap (nothing was frozen before it)."""


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """``gc.freeze()`` for the length of a run, a plan or a read of stored state (see the
    module docstring)."""
    global _runs, _froze
    with _lock:
        if _runs == 0:
            _froze = gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
        _runs += 1
    try:
        yield
    finally:
        with _lock:
            _runs -= 1
            if _runs == 0 and _froze:
                _froze = False
                gc.unfreeze()
