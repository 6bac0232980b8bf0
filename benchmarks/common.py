"""What the benchmark workers share: fresh prefixes, lowered graphs, timed rounds, counters."""

from __future__ import annotations

import contextlib
import gc
import os
import random
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import file_systems
import graphs

from marin.execution.lazy import lower
from marin.execution.pipeline.graph import collect_steps
from marin.execution.step_spec import StepSpec

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def rss_kb() -> int:
    """Peak resident set size of this process so far, in KiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def clear_memory_store() -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs.clear()
    MemoryFileSystem.pseudo_dirs.append("")


@contextlib.contextmanager
def fresh_prefix(backend: str, tag: str) -> Iterator[str]:
    """A new empty prefix on ``local`` disk, on ``tmpfs`` (a local path in memory: the same
    code as local disk, without the disk), or ``memory://``; removed afterwards.

    On local disk the file system is synced first: the files an earlier run created and removed
    are otherwise written back by the kernel during the next one, which then measures that
    writeback (a local row moved severalfold between runs without it)."""
    if backend == "memory":
        clear_memory_store()
        yield f"memory://bench-{tag}"
        clear_memory_store()
        return
    os.sync()
    where = file_systems.TMPFS if backend == "tmpfs" else None
    root = tempfile.mkdtemp(prefix=f"marin-bench-{tag}-", dir=where)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def timed_rounds(
    variants: Mapping[str, Callable[[str], Any]],
    reps: int,
    *,
    seed: int,
    tag: str,
    idle_gap_s: float = 0.0,
    after_warmup: Callable[[], None] | None = None,
) -> tuple[dict[str, list[float]], list[list[str]]]:
    """Each variant once untimed (the warm-up: first runs pay for imports and caches), then
    ``reps`` rounds, each in a fresh random order (seeded: run order biases a comparison),
    each run on a fresh local prefix after ``idle_gap_s``. Returns the wall times per variant
    and each round's order."""
    for name, fn in variants.items():
        with fresh_prefix("local", f"{tag}-warm-{name}") as prefix:
            fn(prefix)
    if after_warmup is not None:
        after_warmup()
    times: dict[str, list[float]] = {name: [] for name in variants}
    orders: list[list[str]] = []
    rng = random.Random(seed)
    for rep in range(reps):
        order = list(variants)
        rng.shuffle(order)
        orders.append(order)
        for name in order:
            time.sleep(idle_gap_s)
            with fresh_prefix("local", f"{tag}-{name}-{rep}") as prefix:
                t0 = time.perf_counter()
                variants[name](prefix)
                times[name].append(time.perf_counter() - t0)
    return times, orders


def stub_build_step() -> None:
    """Replace ``build_step`` in the runner with a no-I/O stub: what is left is the scheduler."""
    import marin.execution.run.executors as executors
    import marin.execution.run.loop as orchestrate
    from marin.execution.builder.commit import BuildOutcome
    from marin.execution.vocabulary import BuildOutcomeKind

    def build_step(request: Any, *_: Any, **__: Any) -> BuildOutcome:
        record: Any = None
        spec = getattr(request, "spec", request)  # a BuildRequest, or (older trees) a spec
        return BuildOutcome(spec, BuildOutcomeKind.BUILT, record, "")

    # Where the tree builds: the executors' job (a BuildRequest), or older trees' loop.
    for module in (executors, orchestrate):
        if hasattr(module, "build_step"):
            module.build_step = build_step  # type: ignore[attr-defined]


def lowered(kind: str, n: int, seed: int = 0) -> tuple[list[StepSpec], list[StepSpec], float]:
    _, targets = graphs.make(kind, n, seed=seed)
    gc.collect()
    t0 = time.perf_counter()
    specs = lower(targets, memo={})
    return specs, collect_steps(specs), time.perf_counter() - t0


def context_switches() -> int:
    """This process's context switches so far, all its threads (voluntary: a thread blocked, on
    a lock, the GIL or I/O; involuntary: the kernel preempted it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw
