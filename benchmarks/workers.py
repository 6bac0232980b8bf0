"""The benchmark workers. Each runs in its own subprocess, started by ``run.py``.

A fresh process per measurement keeps them independent: ``memory://`` is one process-wide store,
peak RSS (``ru_maxrss``) is per process, and a measurement that blows its time budget can be
killed without taking the harness down. A worker prints one JSON object as its last line.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import file_systems
import graphs

from marin.execution.graph import collect_steps
from marin.execution.lazy import lower
from marin.execution.step_spec import StepSpec

logging.getLogger("marin").setLevel(logging.WARNING)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_rerun_and_plan(
    targets: list[Any], prefix: str, reps: int, max_concurrent: int
) -> dict[str, Any]:
    """Medians of a re-run of a built pipeline (pruned) and of a full ``plan``-style check."""
    from marin.execution.inspect import plan_run
    from marin.execution.step_runner import StepRunner
    from marin.execution.storage import open_prefix

    rerun: list[float] = []
    plan: list[float] = []
    out: dict[str, Any] = {}
    for _ in range(reps):
        t0 = time.perf_counter()
        report = StepRunner(max_concurrent, prefix).run(targets)
        rerun.append(time.perf_counter() - t0)
        assert not report.to_build, "a re-run of a built pipeline wanted to build"
        out["rerun_checked"] = len(report.skipped) + len(report.pruned)
        out["rerun_pruned"] = len(report.pruned)
        t0 = time.perf_counter()
        decisions = plan_run(targets, open_prefix(prefix)).decisions.values()
        plan.append(time.perf_counter() - t0)
        assert all(d.status == "built" for d in decisions)
    out["rerun_s"] = statistics.median(rerun)
    out["plan_s"] = statistics.median(plan)
    return out


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
    import marin.execution.orchestrate as orchestrate
    from marin.execution.build import BuildOutcome
    from marin.execution.vocabulary import BuildOutcomeKind

    def build_step(spec: StepSpec, location: Any, **_: Any) -> BuildOutcome:
        record: Any = None
        return BuildOutcome(spec, BuildOutcomeKind.BUILT, record, "")

    orchestrate.build_step = build_step


def lowered(kind: str, n: int, seed: int = 0) -> tuple[list[StepSpec], list[StepSpec], float]:
    _, targets = graphs.make(kind, n, seed=seed)
    gc.collect()
    t0 = time.perf_counter()
    specs = lower(targets, memo={})
    return specs, collect_steps(specs), time.perf_counter() - t0


# --- workers -----------------------------------------------------------------------------------


def pin_run_loop() -> None:
    """Run the loop's thread on one CPU of this process's set for the run's length (the worker
    threads stay free): an experiment on where the GIL's hand-offs cost, not what Marin does."""
    import marin.execution.orchestrate as orchestrate

    run = orchestrate.RunLoop.run

    def pinned(self: Any) -> None:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(before)})
        try:
            run(self)
        finally:
            os.sched_setaffinity(0, before)

    orchestrate.RunLoop.run = pinned  # type: ignore[method-assign]


def overhead(
    backend: str,
    n: int,
    reps: int,
    kind: str = "random",
    stub: bool = False,
    max_concurrent: int = 8,
    pin_loop: bool = False,
) -> dict[str, Any]:
    """StepRunner wall time per no-op step, each repetition on a fresh prefix."""
    from marin.execution.step_runner import StepRunner

    if stub:
        stub_build_step()
    if pin_loop:
        pin_run_loop()
    rss_start = rss_kb()
    targets, steps, lower_s = lowered(kind, n)
    runs: list[float] = []
    switches: list[int] = []
    out: dict[str, Any] = {"n": len(steps), "lower_s": lower_s}
    for rep in range(reps):
        with fresh_prefix(backend, f"{kind}{n}r{rep}") as prefix:
            before = context_switches()
            t0 = time.perf_counter()
            StepRunner(max_concurrent, prefix).run(targets)
            runs.append(time.perf_counter() - t0)
            switches.append(context_switches() - before)
            if rep == 0:
                out["rss_peak_kb"] = rss_kb()
                out["rss_start_kb"] = rss_start
    out["run_s"] = runs
    out["run_median_s"] = statistics.median(runs)
    out["context_switches"] = switches
    return out


def context_switches() -> int:
    """This process's context switches so far, all its threads (voluntary: a thread blocked, on
    a lock, the GIL or I/O; involuntary: the kernel preempted it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def seed_built(prefix: str, steps: Sequence[StepSpec]) -> None:
    """Make ``prefix`` hold a fully built pipeline: one committed record per step.

    The records are the ones ``build_step`` writes, but put in place directly (no lease, status or
    fsync), so that a 10,000-step built state costs seconds to set up even on a slow disk or on
    ``memory://``, whose fsspec writes are O(files stored).
    """
    from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

    from marin.execution.records import ArtifactRecord, record_path
    from marin.execution.storage import open_prefix

    location = open_prefix(prefix)
    memory = isinstance(location.fs, MemoryFileSystem)
    for spec in steps:
        url = location.url_for(spec.output_path)
        record = ArtifactRecord(
            name=spec.name,
            version=spec.version,
            fingerprint=spec.fingerprint,
            fingerprint_payload=spec.fingerprint_payload,
            config={},
            dep_paths={d.step_id: location.url_for(d.output_path) for d in spec.deps},
            output_path=url,
            result=None,
            provenance=dict(spec.provenance),
            started_at="2026-01-01T00:00:00.000+00:00",
            finished_at="2026-01-01T00:00:00.001+00:00",
            duration_s=0.001,
        )
        path = location.path(record_path(spec.output_path))
        data = record.to_json().encode()
        if memory:
            MemoryFile(location.fs, location.fs._strip_protocol(path), data).commit()
        else:
            location.fs.makedirs(os.path.dirname(path), exist_ok=True)
            location.fs.pipe_file(path, data)


def cached(backend: str, n: int, reps: int = 3, kind: str = "experiment") -> dict[str, Any]:
    """A fully built ``n``-step pipeline: the re-run (pruned) and the full check (``plan``)."""

    targets, steps, _ = lowered(kind, n, seed=2)
    out: dict[str, Any] = {"n": len(steps), "targets": len(targets)}
    with fresh_prefix(backend, f"cached{n}") as prefix:
        t0 = time.perf_counter()
        seed_built(prefix, steps)
        out["seed_s"] = time.perf_counter() - t0
        out.update(time_rerun_and_plan(targets, prefix, reps, 8))
    return out


def lowering(kind: str, n: int, reps: int, trace: bool = True) -> dict[str, Any]:
    """``lower()`` time per step (fresh memo each repetition) and traced peak bytes per step."""
    import tracemalloc

    _, targets = graphs.make(kind, n, seed=0)
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        specs = lower(targets, memo={})
        times.append(time.perf_counter() - t0)
        del specs
    out: dict[str, Any] = {"n": n, "lower_s": times, "lower_median_s": statistics.median(times)}
    if trace:
        gc.collect()
        tracemalloc.start()
        specs = lower(targets, memo={})
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["traced_peak_bytes"] = peak
        del specs
    return out


def latency(n: int, latency_s: float, serial_sample: int, reps: int = 3) -> dict[str, Any]:
    """Build ``n`` steps on ``memory://``, then check them through a store ``latency_s`` away."""
    import latency as latency_fs

    from marin.execution.inspect import plan_run, read_stored_step
    from marin.execution.step_runner import StepRunner
    from marin.execution.storage import open_prefix

    latency_fs.register()
    latency_fs.LatencyFileSystem.LATENCY_S = latency_s
    targets, steps, _ = lowered("random", n, seed=1)
    clear_memory_store()
    seed_built("memory://lat", steps)
    slow = open_prefix("slowmem://lat")
    out: dict[str, Any] = {"n": len(steps), "latency_s": latency_s}
    plan, rerun = [], []
    for _ in range(reps):
        latency_fs.LatencyFileSystem.calls = 0
        t0 = time.perf_counter()
        decisions = plan_run(targets, slow).decisions.values()
        plan.append(time.perf_counter() - t0)
        assert all(d.status == "built" for d in decisions)
        out["plan_calls"] = latency_fs.LatencyFileSystem.calls
        latency_fs.LatencyFileSystem.calls = 0
        t0 = time.perf_counter()
        report = StepRunner(8, "slowmem://lat").run(targets)
        rerun.append(time.perf_counter() - t0)
        assert not report.to_build
        out["rerun_calls"] = latency_fs.LatencyFileSystem.calls
    sample = steps[:serial_sample]
    t0 = time.perf_counter()
    for spec in sample:
        read_stored_step(spec, slow)
    serial = time.perf_counter() - t0
    out.update(
        plan_s=statistics.median(plan),
        rerun_s=statistics.median(rerun),
        serial_sample=len(sample),
        serial_sample_s=serial,
        serial_estimate_s=serial / max(len(sample), 1) * len(steps),
    )
    clear_memory_store()
    return out


def _durations(n: int, seed: int, low: float, high: float) -> list[float]:
    rng = random.Random(seed * 7919 + 1)
    return [round(rng.uniform(low, high), 4) for _ in range(n)]


def makespan(
    n: int,
    seeds: Sequence[int],
    concurrency: Sequence[int],
    orders: Sequence[str],
    low: float,
    high: float,
) -> dict[str, Any]:
    """Random DAGs of sleeping steps: makespan / max(critical path, work / max_concurrent)."""
    from marin.execution.step_runner import StepRunner

    results: list[dict[str, Any]] = []
    for seed in seeds:
        durations = _durations(n, seed, low, high)
        _, handles = graphs.random_dag(
            n, seed=seed, durations=durations.__getitem__, tag=f"mk{seed}"
        )
        targets = lower(handles, memo={})
        steps = collect_steps(targets)
        seconds = {s.output_path: durations[int(s.name.rsplit("/s", 1)[1])] for s in steps}
        finish: dict[str, float] = {}
        for s in steps:  # deps first
            start = max((finish[d.output_path] for d in s.deps), default=0.0)
            finish[s.output_path] = start + seconds[s.output_path]
        critical = max(finish.values())
        work = sum(seconds.values())
        for mc in concurrency:
            bound = max(critical, work / mc)
            for order in orders:
                clear_memory_store()
                runner = StepRunner(mc, f"memory://mk{seed}-{mc}-{order}")
                runner.ready_order = order
                t0 = time.perf_counter()
                runner.run(targets)
                wall = time.perf_counter() - t0
                results.append(
                    {
                        "seed": seed,
                        "max_concurrent": mc,
                        "order": order,
                        "makespan_s": wall,
                        "lower_bound_s": bound,
                        "critical_path_s": critical,
                        "work_s": work,
                        "efficiency": wall / bound,
                    }
                )
    clear_memory_store()
    return {"n": n, "runs": results}


def dispatch(n: int, reps: int, stub: bool = False) -> dict[str, Any]:
    """A chain of ``n`` no-op steps on ``memory://``: each waits for the previous one."""
    return overhead("memory", n, reps, kind="chain", stub=stub, max_concurrent=8)


# --- engines -----------------------------------------------------------------------------------


def prefect_variants(
    n: int, max_concurrent: int = 8
) -> tuple[list[StepSpec], dict[str, Callable[[str], Any]]]:
    """The ``prefect`` section's runs of the ``n``-step random graph, each a function of a fresh
    prefix (also profiled by ``prefect_profile.py``); call inside a Prefect harness."""
    from prefect import Flow, Task
    from prefect.cache_policies import NO_CACHE
    from prefect.task_runners import ThreadPoolTaskRunner

    from marin.execution.build import build_step
    from marin.execution.step_runner import StepRunner
    from marin.execution.storage import open_prefix
    from marin_prefect.compile import to_prefect_flow
    from marin_prefect.resources import task_tags

    _, handles = graphs.random_dag(n, seed=3)
    targets = lower(handles, memo={})
    steps = collect_steps(targets)

    def plain_flow(prefix: str, tagged: bool = False) -> Flow[[], None]:
        """What a Prefect user writes by hand: one task per step, ``wait_for`` its deps; with
        ``tagged``, each task carries the compiled flow's tags for its step (``task_tags``)."""
        runner: Any = ThreadPoolTaskRunner(max_workers=max_concurrent)

        def body() -> None:
            location = open_prefix(prefix)
            location.check_writable()
            futures: dict[str, Any] = {}
            for spec in steps:

                def fn(spec: StepSpec = spec) -> str:
                    return build_step(spec, location).output_url

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

    variants: dict[str, Callable[[str], Any]] = {
        "compiled": lambda prefix: to_prefect_flow(
            list(handles), max_concurrent=max_concurrent, prefix=prefix
        )(),
        "plain": lambda prefix: plain_flow(prefix)(),
        # The same hand-written flow with the compiled flow's tags: Prefect's task engine asks
        # the server for the slots of every tag's limit (``tag:<name>``) before each tagged
        # task runs, limit or none, so this variant isolates that round trip's cost.
        "plain-tagged": lambda prefix: plain_flow(prefix, tagged=True)(),
        "local": lambda prefix: StepRunner(max_concurrent, prefix).run(targets),
    }
    return steps, variants


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


def distributed(n: int, reps: int, drivers_sleep_s: float = 0.5) -> dict[str, Any]:
    """Per-step overhead of the same no-op graph (a file target) on the local StepRunner, the
    compiled Prefect flow on threads and on a real Dask cluster (a scheduler and two worker
    processes); then one vs three ``marin run`` drivers sharing a 12-step, three-wide graph."""
    os.environ["MARIN_BENCH_NOOP_N"] = str(n)
    from marin_testing.prefect import isolate_prefect_home, start_harness

    isolate_prefect_home()
    start_harness()
    from prefect.settings import PREFECT_API_URL
    from prefect_dask import DaskTaskRunner

    from marin.execution.step_runner import StepRunner
    from marin.execution.targets import load_target
    from marin_prefect.compile import to_prefect_flow
    from marin_testing.dask import DaskCluster

    logging.getLogger("prefect").setLevel(logging.WARNING)
    logging.getLogger("distributed").setLevel(logging.WARNING)
    target = os.path.join(os.path.dirname(os.path.abspath(__file__)), "noop_graph.py:pipeline")
    steps = collect_steps(lower(list(load_target(target)), memo={}))
    root = tempfile.mkdtemp(prefix="marin-bench-dask-")
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    try:
        with DaskCluster(Path(root), env) as cluster:
            cluster.add_worker("a")
            cluster.add_worker("b", resources={"GPU": 1})
            cluster.wait_for_workers(2)
            variants: dict[str, Callable[[str], Any]] = {
                "local": lambda prefix: StepRunner(8, prefix).run(steps),
                "prefect-threads": lambda prefix: to_prefect_flow(
                    target, max_concurrent=8, prefix=prefix
                )(),
                "prefect-dask": lambda prefix: to_prefect_flow(
                    target,
                    max_concurrent=8,
                    prefix=prefix,
                    task_runner=DaskTaskRunner(address=cluster.address),
                )(),
            }
            times, _ = timed_rounds(variants, reps, seed=5, tag="dk")
        drivers = {k: _drivers(k, drivers_sleep_s) for k in (1, 3)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {
        "n": len(steps),
        "times": times,
        "medians": medians,
        "per_step_ms": {k: 1000 * v / len(steps) for k, v in medians.items()},
        "drivers": drivers,
        "drivers_sleep_s": drivers_sleep_s,
    }


def celery(
    n: int, reps: int, worker_slots: int = 4, run_timeout_s: float = 240, budget_s: float = 540
) -> dict[str, Any]:
    """The same no-op graph exported as an Airflow DAG and run on the Celery harness (Redis, the
    api-server, scheduler and dag-processor, two ``airflow celery worker`` machines of
    ``worker_slots`` each), beside the local StepRunner, rounds in random order: wall time from
    the REST trigger to the DAG run's success as the REST API reports it. The harness start-up
    is timed apart and excluded. Artifacts on a fresh local prefix per run (every worker is on
    this host, so its leases hold), given as the run's ``prefix`` param. Past ``budget_s`` a
    run's wait fails, and the services are stopped before the harness's time limit."""
    from marin.execution.step_runner import StepRunner
    from marin.execution.targets import load_target
    from marin_airflow.export import build_export, write_export
    from marin_testing.airflow import AirflowSandbox
    from marin_testing.celery import CeleryServices, WorkerSpec

    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed: apt-get install -y redis-server")
    deadline = time.monotonic() + budget_s
    os.environ["MARIN_BENCH_NOOP_N"] = str(n)
    # A module path, imported here and on every worker from this checkout (the sandbox puts it
    # on the workers' PYTHONPATH), so no worker depends on where the DAG file was copied.
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    target = "benchmarks.noop_graph:pipeline"
    steps = collect_steps(lower(list(load_target(target)), memo={}))
    dag_id = "bench_celery_noop"
    root = tempfile.mkdtemp(prefix="marin-bench-celery-")
    dags = os.path.join(root, "dags")
    write_export(build_export(target, dags, dag_id=dag_id, max_concurrent=2 * worker_slots))
    env = {"MARIN_BENCH_NOOP_N": str(n)}
    workers = [
        WorkerSpec(name, ("default",), concurrency=worker_slots, env=env) for name in ("a", "b")
    ]
    sandbox = AirflowSandbox(os.path.join(root, "airflow"), pythonpath=[ROOT])
    services = CeleryServices(sandbox, dags, workers, env=env, parallelism=2 * worker_slots)
    airflow_s: list[float] = []
    try:
        t0 = time.perf_counter()
        services.start()
        services.wait_for_dags([dag_id], timeout=max(1.0, deadline - time.monotonic()))
        startup = time.perf_counter() - t0

        def on_celery(prefix: str) -> None:
            run_id = services.trigger_rest(dag_id, conf={"prefix": prefix})
            left = min(run_timeout_s, deadline - time.monotonic())
            run = _rest_run_end(services, dag_id, run_id, left)
            if run["state"] != "success":
                raise RuntimeError(f"run {run_id} ended {run['state']}:\n{services.log_tail()}")
            airflow_s.append(_iso_span(run["start_date"], run["end_date"]))

        variants: dict[str, Callable[[str], Any]] = {
            "local": lambda prefix: StepRunner(2 * worker_slots, prefix).run(steps),
            "celery": on_celery,
        }
        # The warm-up's Airflow span is not one of the timed runs'.
        times, _ = timed_rounds(variants, reps, seed=7, tag="cel", after_warmup=airflow_s.clear)
    finally:
        services.stop()
        shutil.rmtree(root, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {
        "n": len(steps),
        "startup_s": startup,
        "worker_slots": worker_slots,
        "times": times,
        "airflow_run_s": airflow_s,
        "medians": medians,
        "per_step_ms": {k: 1000 * v / len(steps) for k, v in medians.items()},
    }


def _rest_run_end(services: Any, dag_id: str, run_id: str, timeout: float) -> dict[str, Any]:
    """Poll ``GET /api/v2/dags/ID/dagRuns/RUN`` until the run ends (as a user watching it does);
    the run's JSON. The poll interval bounds the timing error of one run."""
    deadline = time.monotonic() + timeout
    while True:
        run: dict[str, Any] = services.rest("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        if run["state"] in ("success", "failed"):
            return run
        services._check_alive()
        if time.monotonic() > deadline:
            tail = services.log_tail()
            raise TimeoutError(f"run {run_id} did not end in {timeout:.0f}s:\n{tail}")
        time.sleep(0.1)


def _iso_span(start: str, end: str) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _drivers(count: int, sleep_s: float) -> dict[str, float]:
    """``count`` ``marin run`` processes (one step at a time each, own cwd/HOME/TMPDIR) on one
    local prefix and the 12-step, three-wide graph of tests/reliability/shared_pipeline.py."""
    import subprocess

    root = tempfile.mkdtemp(prefix="marin-bench-drivers-")
    events = os.path.join(root, "events.txt")
    target = os.path.join(ROOT, "tests", "reliability", "shared_pipeline.py") + ":pipeline"
    env = {**os.environ, "MARIN_SHARED_EVENTS": events, "MARIN_SHARED_SLEEP": str(sleep_s)}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    procs = []
    t0 = time.perf_counter()
    try:
        for i in range(count):
            home = os.path.join(root, f"d{i}")
            for sub in ("home", "tmp"):
                os.makedirs(os.path.join(home, sub))
            own = {**env, "HOME": f"{home}/home", "TMPDIR": f"{home}/tmp"}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "marin.cli", "run", target, "--prefix",
                 os.path.join(root, "prefix"), "--max-concurrent", "1", "--no-progress"],
                cwd=home, env=own, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
        codes = [p.wait(300) for p in procs]
        wall = time.perf_counter() - t0
        if any(codes):
            raise RuntimeError(f"a driver failed: exit codes {codes}")
        with open(events) as f:
            stamps = [float(line.split()[3]) for line in f]
        return {"wall_s": wall, "work_s": max(stamps) - min(stamps)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def airflow_env(home: str, dags: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=home,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=dags,
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
    )
    return env


def airflow_parse(files: Sequence[str], reps: int) -> dict[str, Any]:
    """``DagBag`` parse time of generated DAG files (the caller sets a temp ``AIRFLOW_HOME``)."""
    t0, c0 = time.perf_counter(), time.process_time()
    from airflow.dag_processing.dagbag import DagBag

    import_s, import_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    out: dict[str, Any] = {"import_s": import_s, "import_cpu_s": import_cpu_s, "files": {}}
    for path in files:
        times = []
        cpu = []  # CPU time of this process: what load from other jobs on the machine moves least
        tasks = 0
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.process_time()
            bag = DagBag(dag_folder=path)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            if bag.import_errors:
                raise RuntimeError(f"{path}: {bag.import_errors}")
            tasks = sum(len(d.tasks) for d in bag.dags.values())
        out["files"][path] = {
            "parse_s": times,
            "median_s": statistics.median(times),
            "cpu_s": cpu,
            "median_cpu_s": statistics.median(cpu),
            "tasks": tasks,
        }
    return out


def airflow_cached(reps: int, max_concurrent: int = 4) -> dict[str, Any]:
    """Under a real scheduler on loopback (``marin_testing.airflow.AirflowServices``): a fully
    cached re-run of a 100-step DAG against the first run of a 1-step DAG.

    Each run is timed from the DAG run's ``queued_at`` to its ``end_date`` as the scheduler
    recorded them (the ``airflow dags trigger`` command's own start-up is not the DAG's cost).
    The 1-step DAG builds on a fresh prefix every time; the 100-step DAG is built once, untimed,
    then re-run on the same prefix. The two kinds alternate in a seeded random order.
    """
    from marin_airflow.export import build_export, write_export
    from marin_testing.airflow import AirflowSandbox, AirflowServices

    root = tempfile.mkdtemp(prefix="marin-bench-afsched-")
    here = os.path.dirname(os.path.abspath(__file__))
    dags = os.path.join(root, "dags")
    exports = {
        name: build_export(
            os.path.join(here, f"airflow_graphs.py:{name}"),
            dags,
            dag_id=f"bench_{name}",
            max_concurrent=max_concurrent,
        )
        for name in ("hundred", "one")
    }
    for result in exports.values():
        write_export(result)
    sandbox = AirflowSandbox(os.path.join(root, "sandbox"), pythonpath=[ROOT])
    times: dict[str, list[float]] = {"cached100": [], "first1": []}
    tasks_run: dict[str, list[int]] = {"cached100": [], "first1": []}

    def timed(dag_id: str, prefix: str) -> tuple[float, int]:
        run_id = services.trigger(dag_id, {"prefix": prefix})
        state = services.wait_for_run(dag_id, run_id, timeout=600)
        if state != "success":
            raise RuntimeError(f"{dag_id} run {run_id} ended {state}:\n{services.log_tail()}")
        (span,) = sandbox.query(
            "SELECT (julianday(end_date) - julianday(queued_at)) * 86400 FROM dag_run "
            "WHERE dag_id = ? AND run_id = ?",
            (dag_id, run_id),
        )
        (launched,) = sandbox.query(
            "SELECT COUNT(*) FROM task_instance WHERE dag_id = ? AND run_id = ? "
            "AND pid IS NOT NULL",
            (dag_id, run_id),
        )
        return float(span[0]), int(launched[0])

    try:
        with AirflowServices(sandbox, dags, parallelism=8) as services:
            services.wait_for_dags([r.dag_id for r in exports.values()])
            built = os.path.join(root, "prefix-100")
            timed("bench_hundred", built)  # the build: untimed
            timed("bench_one", os.path.join(root, "prefix-1-warm"))  # warm-up
            rng = random.Random(7)
            for rep in range(reps):
                order = ["cached100", "first1"]
                rng.shuffle(order)
                for kind in order:
                    if kind == "cached100":
                        span, launched = timed("bench_hundred", built)
                    else:
                        span, launched = timed("bench_one", os.path.join(root, f"prefix-1-{rep}"))
                    times[kind].append(span)
                    tasks_run[kind].append(launched)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {
        "times": times,
        "medians": medians,
        "tasks_launched": tasks_run,
        "ratio": medians["cached100"] / medians["first1"],
        "steps": len(exports["hundred"].tasks),
    }


def calls() -> dict[str, Any]:
    import commit_cost

    return commit_cost.calls_worker()


def calls_alone(
    backend: str, n: int, threads: int, kind: str = "random", reps: int = 1
) -> dict[str, Any]:
    import commit_cost

    return commit_cost.calls_alone_worker(backend, n, threads, kind, reps)


def builds_alone(
    backend: str, n: int, handed: bool, reps: int = 1, one_cpu: bool = False
) -> dict[str, Any]:
    import hand_off

    return hand_off.builds_alone_worker(backend, n, handed, reps, one_cpu)


def round_trip(count: int, reps: int) -> dict[str, Any]:
    import hand_off

    return hand_off.round_trip_worker(count, reps)


def commit(n_local: int, n_memory: int, reps: int) -> dict[str, Any]:
    import commit_cost

    return commit_cost.worker(n_local, n_memory, reps)


def reference(reps: int) -> dict[str, Any]:
    import calibration

    return calibration.worker(reps)


def code_digest(n: int, lookups: int, reps: int) -> dict[str, Any]:
    import cache_cost

    return cache_cost.code_digest_worker(n, lookups, reps)


def output_digest(total_mib: int, file_mib: int, small_files: int, reps: int) -> dict[str, Any]:
    import cache_cost

    return cache_cost.output_digest_worker(total_mib, file_mib, small_files, reps)


WORKERS: dict[str, Callable[..., dict[str, Any]]] = {
    "reference": reference,
    "code_digest": code_digest,
    "output_digest": output_digest,
    "commit": commit,
    "calls": calls,
    "calls_alone": calls_alone,
    "builds_alone": builds_alone,
    "round_trip": round_trip,
    "cached": cached,
    "overhead": overhead,
    "lowering": lowering,
    "latency": latency,
    "makespan": makespan,
    "dispatch": dispatch,
    "prefect": prefect,
    "distributed": distributed,
    "celery": celery,
    "airflow_parse": airflow_parse,
    "airflow_cached": airflow_cached,
}


def main(name: str, args_json: str) -> None:
    result = WORKERS[name](**json.loads(args_json))
    result["worker_rss_peak_kb"] = rss_kb()
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
