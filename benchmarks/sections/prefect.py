"""Section ``prefect``: the compiled Prefect flow against a hand-written one.

On ``prefect server start`` over a throw-away PostgreSQL (``prefect_server.py``), 200-task flows
in random order after a warm-up: the compiled flow, a plain flow with and without the compiled
flow's tags, and the local ``StepRunner``. Full runs only."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import graphs
from common import timed_rounds
from harness import Harness

from marin.execution.lazy import lower
from marin.execution.pipeline.graph import collect_steps
from marin.execution.step_spec import StepSpec

if TYPE_CHECKING:
    from prefect import Flow


def spread(values: list[float]) -> str:
    return f"min {min(values):.3g}, max {max(values):.3g}, {len(values)} runs"


STARTUP_NOTES = {
    "postgresql": "PostgreSQL, then `prefect server start` on it",
    "sqlite": "Prefect's test harness on SQLite (PostgreSQL is not installed)",
}
"""The server startup row's note, by the database the section's server ran on."""


def bench(h: Harness) -> None:
    """(6) Compiled Prefect flow vs a hand-written plain Prefect flow vs the local runner."""
    if h.quick:
        h.add(
            "prefect",
            "compiled/plain (skipped in --quick)",
            None,
            "x",
            note="starts PostgreSQL and a Prefect server, then times 200-task flows for minutes",
        )
        return
    try:
        import marin_prefect.compile  # noqa: F401
    except ImportError as exc:
        h.add("prefect", "compiled/plain", None, "x", note=f"adapter not importable: {exc}")
        return
    r = h.worker("prefect", 420, n=200, reps=4, idle_gap_s=2.0)
    if not r:
        return
    m, times = r["medians"], r["times"]
    database = r["server_database"]
    h.add("prefect", "server startup", r["startup_s"], "s", note=STARTUP_NOTES[database])
    h.add("prefect", "compiled flow n=200", m["compiled"], "s", note=spread(times["compiled"]))
    h.add("prefect", "hand-written plain flow n=200", m["plain"], "s", note=spread(times["plain"]))
    h.add("prefect", "local StepRunner n=200", m["local"], "s", note=spread(times["local"]))
    h.add(
        "prefect",
        "hand-written plain flow with the compiled flow's tags n=200",
        m["plain-tagged"],
        "s",
        note=spread(times["plain-tagged"]),
    )
    ratios = r["compiled_over_plain"]
    sqlite = "; server on SQLite: its 2 s back-offs on a locked database land in the times"
    h.judge(
        "prefect",
        "compiled / plain",
        statistics.median(ratios),
        "x",
        "prefect.compiled_over_plain",
        1.1,
        note=f"median of per-round ratios ({spread(ratios)}); random order, "
        f"{r['idle_gap_s']:.0f} s idle before each run"
        "; no flow-run heartbeat (its 1 s sleeps round a run's end)"
        + (sqlite if database == "sqlite" else ""),
    )
    tagged = r["compiled_over_plain_tagged"]
    h.add(
        "prefect",
        "compiled / plain with the same tags",
        statistics.median(tagged),
        "x",
        note=f"median of per-round ratios ({spread(tagged)}); each tagged task run asks "
        "the server for its tags' concurrency slots before it starts",
    )
    h.add("prefect", "local StepRunner / plain Prefect", m["local"] / m["plain"], "x")


def prefect_variants(
    n: int, max_concurrent: int = 8
) -> tuple[list[StepSpec], dict[str, Callable[[str], Any]]]:
    """The ``prefect`` section's runs of the ``n``-step random graph, each a function of a fresh
    prefix (also profiled by ``prefect_profile.py``); call inside a Prefect harness."""
    from marin.execution.plan.options import RunOptions
    from marin.execution.step_runner import StepRunner
    from marin_prefect.compile import to_prefect_flow

    _, handles = graphs.random_dag(n, seed=3)
    targets = lower(handles, memo={})
    steps = collect_steps(targets)

    variants: dict[str, Callable[[str], Any]] = {
        "compiled": lambda prefix: to_prefect_flow(
            list(handles), prefix=prefix, options=RunOptions(max_concurrent=max_concurrent)
        )(),
        "plain": lambda prefix: plain_flow(steps, prefix, max_concurrent)(),
        # The same hand-written flow with the compiled flow's tags: Prefect's task engine asks
        # the server for the slots of every tag's limit (``tag:<name>``) before each tagged
        # task runs, limit or none, so this variant isolates that round trip's cost.
        "plain-tagged": lambda prefix: plain_flow(steps, prefix, max_concurrent, tagged=True)(),
        "local": lambda prefix: StepRunner(
            RunOptions(max_concurrent=max_concurrent), prefix=prefix
        ).run(targets),
    }
    return steps, variants


def plain_flow(
    steps: list[StepSpec], prefix: str, max_concurrent: int, tagged: bool = False
) -> Flow[[], None]:
    """What a Prefect user writes by hand: one task per step, ``wait_for`` its deps; with
    ``tagged``, each task carries the compiled flow's tags for its step (``task_tags``)."""
    from prefect import Flow, Task
    from prefect.cache_policies import NO_CACHE
    from prefect.task_runners import ThreadPoolTaskRunner

    from marin.execution.builder.commit import BuildRequest, build_step
    from marin.execution.builder.outcome import waited_here
    from marin.execution.store.location import open_prefix
    from marin_prefect.resources import task_tags

    runner: Any = ThreadPoolTaskRunner(max_workers=max_concurrent)

    def body() -> None:
        location = open_prefix(prefix)
        location.check_writable()
        futures: dict[str, Any] = {}
        for spec in steps:

            def fn(spec: StepSpec = spec) -> str:
                return waited_here(build_step(BuildRequest(spec, location))).output_url

            task: Any = Task(
                fn,
                name=spec.step_id,
                task_run_name=spec.step_id,
                cache_policy=NO_CACHE,
                tags=task_tags(spec) if tagged else None,
            )
            futures[spec.output_path] = task.submit(
                wait_for=[futures[d.output_path] for d in spec.deps]
            )
        for future in futures.values():
            future.result()

    return Flow(
        body,
        name="plain-prefect",
        task_runner=runner,
        validate_parameters=False,
    )


def prefect(n: int, reps: int, max_concurrent: int = 8, idle_gap_s: float = 3.0) -> dict[str, Any]:
    """The compiled flow vs a hand-written plain Prefect flow vs the local StepRunner."""
    from prefect_server import section_server, without_flow_heartbeat

    from marin_testing.prefect import isolate_prefect_home

    isolate_prefect_home()
    t0 = time.perf_counter()
    with section_server() as database:
        startup = time.perf_counter() - t0
        logging.getLogger("prefect").setLevel(logging.WARNING)
        steps, variants = prefect_variants(n, max_concurrent)
        # Run order biases the result: a flow run right after a 200-task flow is slower while
        # the Prefect server catches up. So every round runs the variants in a fresh random
        # order (seeded) and waits an idle gap before each timed run.
        with without_flow_heartbeat():
            times, orders = timed_rounds(variants, reps, seed=11, tag="pf", idle_gap_s=idle_gap_s)
    ratios = [c / p for c, p in zip(times["compiled"], times["plain"], strict=True)]
    tagged = [c / p for c, p in zip(times["compiled"], times["plain-tagged"], strict=True)]
    return {
        "n": len(steps),
        "startup_s": startup,
        "server_database": database,
        "times": times,
        "orders": orders,
        "idle_gap_s": idle_gap_s,
        "flow_heartbeat": False,
        "medians": {k: statistics.median(v) for k, v in times.items()},
        "compiled_over_plain": ratios,
        "compiled_over_plain_tagged": tagged,
    }


WORKERS: dict[str, str] = {
    "prefect": "sections.prefect:prefect",
}
