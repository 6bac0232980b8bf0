"""What a runner's thread hand-off costs on this machine, apart from the runner.

A ``StepRunner`` hands each build to a worker thread and gets its end back on the loop's thread.
Two measurements separate that hand-off from the builds and from the scheduler:

- ``builds_alone_worker``: the same graph's builds, with the upstream records a run passes, one
  after another on one thread (``handed=False``: the Python of the builds alone, the floor of
  any runner on ``memory://``), or each handed to one worker thread and back through two queues
  (``handed=True``: the builds plus one hand-off each way, and no scheduler), the two threads
  free or (``one_cpu``) both on one CPU;
- ``round_trip_worker``: one item handed back and forth between two threads through two queues,
  with nothing else done, the two threads on different CPUs and then on the same one.
"""

from __future__ import annotations

import gc
import os
import queue
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from common import context_switches, fresh_prefix, lowered

from marin.execution.builder.commit import BuildOutcome, BuildRequest, build_step
from marin.execution.builder.outcome import waited_here
from marin.execution.plan.decide import Policy, plan_graph
from marin.execution.step_spec import StepSpec
from marin.execution.store.location import open_prefix
from marin.execution.store.records import ArtifactRecord


def _handed_to_a_thread() -> tuple[Callable[[Callable[[], BuildOutcome]], BuildOutcome], Any]:
    """A call that runs a function on one worker thread and waits for its result; and a stop."""
    jobs: queue.SimpleQueue[Callable[[], BuildOutcome] | None] = queue.SimpleQueue()
    ends: queue.SimpleQueue[BuildOutcome] = queue.SimpleQueue()

    def work() -> None:
        while (job := jobs.get()) is not None:
            ends.put(job())

    thread = threading.Thread(target=work, daemon=True)
    thread.start()

    def call(job: Callable[[], BuildOutcome]) -> BuildOutcome:
        jobs.put(job)
        return ends.get()

    def stop() -> None:
        jobs.put(None)
        thread.join()

    return call, stop


def builds_alone_worker(
    backend: str, n: int, handed: bool, reps: int = 1, one_cpu: bool = False
) -> dict[str, Any]:
    """Seconds for the ``n``-step random graph's builds without a runner (see the module
    docstring); the median of ``reps``, each on a fresh prefix, the heap frozen as a run's is.
    ``one_cpu``: the whole process (both threads) on one CPU of its set."""
    if one_cpu:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    targets, steps, _ = lowered("random", n)
    # A fresh prefix holds nothing: the plan a runner makes there builds every step.
    plan = plan_graph(steps, targets, {}, Policy())
    assert len(plan.to_build) == len(steps), "a fresh prefix must build every step"
    runs: list[float] = []
    switches: list[int] = []
    for rep in range(reps):
        with fresh_prefix(backend, f"builds{int(handed)}r{rep}") as prefix:
            location = open_prefix(prefix)
            location.check_writable()
            built: dict[str, ArtifactRecord] = {}
            call, stop = _handed_to_a_thread() if handed else (lambda job: job(), lambda: None)
            gc.freeze()
            before = context_switches()
            t0 = time.perf_counter()
            for spec in steps:
                ups = plan.upstream(spec, built)  # as the run loop passes them

                def job(spec: StepSpec = spec, ups: Any = ups, at: Any = location) -> Any:
                    return waited_here(
                        build_step(BuildRequest(spec, at, decision=plan.of(spec), upstream=ups))
                    )

                built[spec.output_path] = call(job).record
            runs.append(time.perf_counter() - t0)
            switches.append(context_switches() - before)
            gc.unfreeze()
            stop()
    return {
        "n": len(steps),
        "seconds": statistics.median(runs),
        "runs": runs,
        "context_switches": statistics.median(switches),
    }


def _round_trips(count: int, cpus: tuple[int, int]) -> float:
    """Seconds for ``count`` round trips between this thread and another; ``cpus``: the CPU of
    each."""
    there: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[int] = queue.SimpleQueue()

    def echo() -> None:
        os.sched_setaffinity(0, {cpus[1]})
        while (item := there.get()) is not None:
            back.put(item)

    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpus[0]})
    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    try:
        for _ in range(1000):  # warm up: both threads started and settled
            there.put(1)
            back.get()
        t0 = time.perf_counter()
        for _ in range(count):
            there.put(1)
            back.get()
        return time.perf_counter() - t0
    finally:
        there.put(None)
        thread.join()
        os.sched_setaffinity(0, before)


def round_trip_worker(count: int, reps: int) -> dict[str, Any]:
    """Microseconds per round trip, median of ``reps``: across two CPUs (None where this
    process has one), and on one."""
    cpus = sorted(os.sched_getaffinity(0))
    out: dict[str, Any] = {"across": None}
    pairs = {"across": (cpus[0], cpus[1])} if len(cpus) > 1 else {}
    for name, pair in {**pairs, "same": (cpus[0], cpus[0])}.items():
        runs = [_round_trips(count, pair) / count * 1e6 for _ in range(reps)]
        out[name] = statistics.median(runs)
        out[f"{name}_runs"] = runs
    return out
