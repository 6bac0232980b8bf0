"""Section ``distributed`` (opt-in: ``--distributed``): off one machine's threads.

A 40-step no-op graph by the local runner, the compiled flow on threads and on a real Dask
cluster, and as an Airflow DAG on Celery with two workers; and one against three ``marin run``
drivers sharing a graph of 0.5 s steps (their work spans)."""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import HERE, ROOT, timed_rounds
from harness import Harness

from marin.execution.lazy import lower
from marin.execution.pipeline.graph import collect_steps

if TYPE_CHECKING:
    from marin_testing.celery import CeleryServices

DISTRIBUTED_ROWS = ("local", "prefect-threads", "prefect-dask")


DISTRIBUTED_NOTE = (
    "needs --distributed (starts a Prefect server, a Dask cluster and the Celery harness: minutes)"
)


CELERY_SLOTS = 4
"""Task slots of each of the two Celery workers: eight in all, as the other rows' threads."""


CELERY_MIN_S = 180.0
"""Budget below which the Celery rows are not tried: start-up alone can take a minute."""


CELERY_STOP_S = 45.0
"""Time left to the Celery worker to stop its services after its own deadline."""


def bench(h: Harness) -> None:
    """(6b) Per-step overhead of the Dask path beside the local runner and Prefect's threads on
    one no-op graph, and three ``marin run`` drivers against one on a shared graph."""
    if h.quick or not h.distributed:
        h.add("distributed", "prefect-dask per step (skipped)", None, "ms", note=DISTRIBUTED_NOTE)
        return
    try:
        import prefect_dask  # noqa: F401
    except ImportError as exc:
        h.add("distributed", "prefect-dask per step", None, "ms", note=f"not installed: {exc}")
        return
    r = h.worker("distributed", 600, n=40, reps=3)
    if not r:
        return
    n = r["n"]
    for name in DISTRIBUTED_ROWS:
        spread = f"{min(r['times'][name]):.3g}-{max(r['times'][name]):.3g} s per run"
        h.add("distributed", f"{name} per step (n={n} no-op)", r["per_step_ms"][name], "ms",
              note=spread)  # fmt: skip
    h.judge(
        "distributed",
        "prefect-dask / prefect-threads",
        r["medians"]["prefect-dask"] / r["medians"]["prefect-threads"],
        "x",
        "distributed.dask_over_threads",
        3.0,
        note="the same compiled flow; each build pickled to one of two local Dask workers",
    )
    bench_celery(h)
    one, three = r["drivers"]["1"], r["drivers"]["3"]
    h.judge(
        "distributed",
        "3 drivers / 1 driver (work span)",
        three["work_s"] / one["work_s"],
        "x",
        "distributed.three_drivers",
        0.6,
        note=f"12 steps of {r['drivers_sleep_s']:g} s, three wide, one at a time per driver; "
        f"wall clock {three['wall_s']:.1f} s vs {one['wall_s']:.1f} s",
    )


def bench_celery(h: Harness) -> None:
    """The same no-op graph exported as an Airflow DAG and run on Celery (two workers), beside
    the local runner in the same worker process: per step, harness start-up excluded."""
    try:
        import airflow.providers.celery  # noqa: F401
    except ImportError as exc:
        h.add("distributed", "celery per step", None, "ms", note=f"not installed: {exc}")
        return
    if shutil.which("redis-server") is None:
        h.add("distributed", "celery per step", None, "ms",
              note="redis-server is not installed: apt-get install -y redis-server")  # fmt: skip
        return
    # The worker stops its own services before its deadline: killed by the harness's time
    # limit instead, it would leave Redis, Airflow and the workers running (their own sessions).
    timeout = min(600.0, h.remaining())
    if timeout < CELERY_MIN_S:
        h.add("distributed", "celery per step", None, "ms",
              note="skipped: not enough of the time budget left (--budget)")  # fmt: skip
        return
    budget = timeout - CELERY_STOP_S
    r = h.worker("celery", timeout, n=40, reps=3, worker_slots=CELERY_SLOTS, budget_s=budget)
    if not r:
        return
    n, m, times = r["n"], r["medians"], r["times"]
    h.add(
        "distributed",
        "celery harness startup (excluded)",
        r["startup_s"],
        "s",
        note="Redis, api-server, scheduler, dag-processor, two Celery workers, DAG parsed",
    )
    spread = f"{min(times['celery']):.3g}-{max(times['celery']):.3g} s per run"
    airflow_run = statistics.median(r["airflow_run_s"])
    h.add(
        "distributed",
        f"celery per step (n={n} no-op)",
        r["per_step_ms"]["celery"],
        "ms",
        note=f"REST trigger to the run's success; {spread}; Airflow's own run span "
        f"{airflow_run:.3g} s; two workers x {r['worker_slots']} slots, local prefix",
    )
    h.add(
        "distributed",
        "celery / local",
        m["celery"] / m["local"],
        "x",
        note=f"local StepRunner side by side: {1000 * m['local'] / n:.3g} ms per step",
    )


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

    from marin.execution.pipeline.targets import load_target
    from marin.execution.plan.options import RunOptions
    from marin.execution.step_runner import StepRunner
    from marin_prefect.compile import to_prefect_flow
    from marin_testing.dask import DaskCluster

    logging.getLogger("prefect").setLevel(logging.WARNING)
    logging.getLogger("distributed").setLevel(logging.WARNING)
    target = os.path.join(HERE, "noop_graph.py:pipeline")
    steps = collect_steps(lower(list(load_target(target)), memo={}))
    root = tempfile.mkdtemp(prefix="marin-bench-dask-")
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    try:
        with DaskCluster(Path(root), env) as cluster:
            cluster.add_worker("a")
            cluster.add_worker("b", resources={"GPU": 1})
            cluster.wait_for_workers(2)
            eight = RunOptions(max_concurrent=8)
            variants: dict[str, Callable[[str], Any]] = {
                "local": lambda prefix: StepRunner(eight, prefix=prefix).run(steps),
                "prefect-threads": lambda prefix: to_prefect_flow(
                    target, prefix=prefix, options=eight
                )(),
                "prefect-dask": lambda prefix: to_prefect_flow(
                    target,
                    prefix=prefix,
                    task_runner=DaskTaskRunner(address=cluster.address),
                    options=eight,
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
    from marin.execution.pipeline.targets import load_target
    from marin.execution.plan.options import RunOptions
    from marin.execution.step_runner import StepRunner

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
    services = _celery_services(root, target, dag_id, n, worker_slots)
    airflow_s: list[float] = []
    try:
        t0 = time.perf_counter()
        services.start()
        services.wait_for_dags([dag_id], timeout=max(1.0, deadline - time.monotonic()))
        startup = time.perf_counter() - t0

        def on_celery(prefix: str) -> None:
            left = min(run_timeout_s, deadline - time.monotonic())
            airflow_s.append(_celery_run(services, dag_id, prefix, left))

        variants: dict[str, Callable[[str], Any]] = {
            "local": lambda prefix: StepRunner(
                RunOptions(max_concurrent=2 * worker_slots), prefix=prefix
            ).run(steps),
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


def _celery_services(
    root: str, target: str, dag_id: str, n: int, worker_slots: int
) -> CeleryServices:
    """``target`` exported as ``dag_id`` under ``root``, and the Celery harness (not started yet)
    that runs it on two workers of ``worker_slots`` each."""
    from marin_airflow.export import build_export, write_export
    from marin_testing.airflow import AirflowSandbox
    from marin_testing.celery import CeleryServices, WorkerSpec

    dags = os.path.join(root, "dags")
    write_export(build_export(target, dags, dag_id=dag_id, max_concurrent=2 * worker_slots))
    env = {"MARIN_BENCH_NOOP_N": str(n)}
    workers = [
        WorkerSpec(name, ("default",), concurrency=worker_slots, env=env) for name in ("a", "b")
    ]
    sandbox = AirflowSandbox(os.path.join(root, "airflow"), pythonpath=[ROOT])
    return CeleryServices(sandbox, dags, workers, env=env, parallelism=2 * worker_slots)


def _celery_run(services: CeleryServices, dag_id: str, prefix: str, timeout: float) -> float:
    """Trigger ``dag_id`` on ``prefix`` through the REST API and wait for its end: Airflow's own
    span of the run; a run that does not succeed raises with the log's tail."""
    run_id = services.trigger_rest(dag_id, conf={"prefix": prefix})
    run = _rest_run_end(services, dag_id, run_id, timeout)
    if run["state"] != "success":
        raise RuntimeError(f"run {run_id} ended {run['state']}:\n{services.log_tail()}")
    return _iso_span(run["start_date"], run["end_date"])


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


WORKERS: dict[str, str] = {
    "distributed": "sections.distributed:distributed",
    "celery": "sections.distributed:celery",
}
