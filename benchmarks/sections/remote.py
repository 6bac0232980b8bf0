"""Section ``remote``: what a driver pays to wait on remote steps (docs/remote.md).

- A driver with ``max_concurrent=2`` waiting on N ``local`` jobs of 1 s each: its makespan
  against the backend's own (the same jobs submitted and polled directly, no Marin), and the
  driver's CPU time per job (submit, wait, commit).
- Reattach latency after a driver restart: ``marin run`` is interrupted (Ctrl-C) while its
  job runs; a new driver's time to reattach to the running job, and to collect and commit one
  that ended meanwhile. (After a SIGKILL add the lease's TTL: the dead driver's lease expires.)
- The per-step cost of a remote hop: a chain of no-op steps, in-thread against ``local`` jobs
  (and ``ray`` on a loopback cluster, full runs only).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import remote_jobs
from common import ROOT, fresh_prefix
from harness import Harness

from marin.execution.lazy import lower

_NOTE_CPU = "user+system CPU of the driver process over the run, divided by N"


def bench(h: Harness) -> None:
    """The rows of the section (no targets: the numbers describe; docs/remote.md explains).
    ``--quick`` keeps a few seconds: 2 jobs of 0.2 s, no baseline, no ended-job restart, a
    one-step "chain"."""
    n, seconds = (2, 0.2) if h.quick else (200, 1.0)
    r = h.worker(
        "remote_wait", 120 if h.quick else 1200, n=n, seconds=seconds, baseline=not h.quick
    )
    if r:
        jobs = f"{n} local jobs of {seconds:g} s"
        h.add("remote", f"{jobs}, max_concurrent=2: makespan", r["driver_s"], "s")
        if r["backend_s"] is not None:
            h.add("remote", f"{jobs}: the backend alone", r["backend_s"], "s",
                  note="the same jobs submitted and polled directly, no Marin")  # fmt: skip
            h.add("remote", "makespan / the backend alone", r["driver_s"] / r["backend_s"], "x")
        h.add("remote", "driver CPU per waiting job", r["cpu_ms_per_job"], "ms", note=_NOTE_CPU)
        h.add("remote", "driver threads at most while waiting", r["max_threads"], "threads")
    r = h.worker("remote_restart", 120, reps=1 if h.quick else 3, ended=not h.quick)
    if r:
        h.add("remote", "restart: reattach to a running job", r["reattach_ms"], "ms",
              note="a new driver's run() start to the reattach, after Ctrl-C")  # fmt: skip
        if r["collect_ms"] is not None:
            h.add("remote", "restart: collect and commit an ended job", r["collect_ms"], "ms",
                  note="a new driver's whole run() of the step")  # fmt: skip
    hops = 1 if h.quick else 10
    r = h.worker(
        "remote_hop", 300, n=hops, remotes=["", "local"] if h.quick else ["", "local", "ray"]
    )
    for backend, per_step_ms in (r or {}).get("per_step_ms", {}).items():
        h.add("remote", f"per-step hop: {backend or 'in-thread'}", per_step_ms, "ms",
              note=f"a chain of {hops} no-op steps")  # fmt: skip


def remote_wait(n: int, seconds: float, baseline: bool) -> dict[str, Any]:
    """The driver's makespan and CPU on ``n`` jobs, and (``baseline``) the backend's own."""
    from marin.execution.plan.options import RunOptions
    from marin.execution.step_runner import StepRunner

    backend_s = _backend_alone(n, seconds) if baseline else None
    targets = lower(remote_jobs.sleepers(n, seconds))
    most = [threading.active_count()]
    stop = threading.Event()
    watcher = threading.Thread(target=_count_threads, args=(most, stop), daemon=True)
    with fresh_prefix("local", "remote-wait") as prefix:
        watcher.start()
        cpu0, t0 = _cpu_s(), time.perf_counter()
        StepRunner(RunOptions(max_concurrent=2, max_remote=n), prefix=prefix).run(targets)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        stop.set()
    return {
        "driver_s": wall,
        "backend_s": backend_s,
        "cpu_ms_per_job": cpu * 1000 / n,
        "max_threads": max(most) - 1,  # not the watcher itself
    }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _count_threads(most: list[int], stop: threading.Event) -> None:
    while not stop.wait(0.05):
        most.append(threading.active_count())


def _backend_alone(n: int, seconds: float) -> float:
    """``n`` jobs straight through ``LocalBackend``, polled every 50 ms until all ended."""
    from marin.execution.remote.local import LocalBackend

    backend = LocalBackend()
    saved = os.environ.get("MARIN_LOCAL_JOBS")
    with tempfile.TemporaryDirectory(prefix="marin-bench-jobs-") as root:
        os.environ["MARIN_LOCAL_JOBS"] = root  # the jobs' folders go with it
        try:
            return _submit_and_poll(backend, root, n, seconds)
        finally:
            if saved is None:
                os.environ.pop("MARIN_LOCAL_JOBS", None)
            else:
                os.environ["MARIN_LOCAL_JOBS"] = saved


def _submit_and_poll(backend: Any, root: str, n: int, seconds: float) -> float:
    from marin.execution.remote.protocol import JobSpec
    from marin.execution.vocabulary import JobState

    meta = pickle.dumps({"sys_path": sys.path, "module_files": {}})
    t0 = time.perf_counter()
    handles = []
    for i in range(n):
        kwargs = {"seconds": seconds, "out_path": os.path.join(root, f"o{i}")}
        call = {"target": remote_jobs.sleep_step, "args": (), "kwargs": kwargs, "context": None}
        spec = JobSpec(f"s{i}@v1", meta + pickle.dumps(call))
        handles.append(backend.submit(spec, f"marin-{i:020x}"))
    while handles:
        handles = [h for h in handles if backend.status(h).state == JobState.RUNNING]
        time.sleep(0.05)
    return time.perf_counter() - t0


class _Reattached(logging.Handler):
    """Notes when the runner logs its reattach."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("reattach "):
            self.at = time.perf_counter()
            self.event.set()


def remote_restart(reps: int, ended: bool) -> dict[str, Any]:
    """Per repetition: ``marin run`` interrupted while its job runs, then a new driver (this
    process) reattaches (the job still running) or collects (``ended``: it ended meanwhile)."""
    reattach: list[float] = []
    collect: list[float] = []
    for rep in range(reps):
        for ended_now in (False, True) if ended else (False,):
            with fresh_prefix("local", f"restart{rep}{int(ended_now)}") as prefix:
                (collect if ended_now else reattach).append(_restart_once(prefix, ended_now))
    return {
        "reattach_ms": statistics.median(reattach) * 1000,
        "collect_ms": statistics.median(collect) * 1000 if collect else None,
        "reattach_s": reattach,
        "collect_s": collect,
    }


def _restart_once(prefix: str, ended: bool) -> float:
    """One restart: the seconds to reattach to the running job, or (``ended``) to collect and
    commit the ended one."""
    from marin.execution.plan.options import RunOptions
    from marin.execution.step_runner import StepRunner

    gate = prefix + ".gate"  # beside the prefix: the step's folders stay its own
    _interrupted_driver(prefix, gate)
    if ended:
        open(gate, "w").close()
        _wait_for_result(prefix)
    handler = _Reattached()
    marin_log = logging.getLogger("marin")
    marin_log.addHandler(handler)
    marin_log.setLevel(logging.INFO)
    opener = threading.Thread(target=_open_gate_on, args=(handler.event, gate))
    opener.start()
    try:
        t0 = time.perf_counter()
        StepRunner(RunOptions(max_concurrent=2), prefix=prefix).run(lower(remote_jobs.restart))
        wall = time.perf_counter() - t0
    finally:
        opener.join()
        marin_log.removeHandler(handler)
        os.unlink(gate)
    assert handler.at is not None, "the new driver did not reattach"
    return wall if ended else handler.at - t0


def _open_gate_on(event: threading.Event, gate: str) -> None:
    event.wait(60)
    open(gate, "w").close()


def _interrupted_driver(prefix: str, gate: str) -> None:
    """``marin run`` of the restart pipeline, interrupted (SIGINT) once its job runs."""
    env = {**os.environ, remote_jobs.GATE_ENV: gate, "MARIN_REMOTE_POLL_MAX_S": "0.2"}
    cmd = [sys.executable, "-m", "marin.cli", "run", "benchmarks/remote_jobs.py:restart",
           "--prefix", prefix]  # fmt: skip
    driver = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not _job_wrote(prefix, "pid.json"):
        if time.monotonic() > deadline or driver.poll() is not None:
            driver.kill()
            raise RuntimeError("the first driver's job never started")
        time.sleep(0.01)
    driver.send_signal(signal.SIGINT)
    driver.wait(timeout=60)


def _job_wrote(prefix: str, name: str) -> bool:
    """Whether the restart step's local job wrote ``name`` in its folder (under the jobs root,
    named by the job id in the step's ``job.json``)."""
    from marin.execution.remote.local import jobs_root_path

    try:
        with open(os.path.join(prefix, "restart", "job", "v1.marin", "job.json")) as f:
            job_id = json.load(f)["job_id"]
    except (OSError, ValueError, KeyError):
        return False
    return os.path.exists(os.path.join(jobs_root_path(), str(job_id), name))


def _wait_for_result(prefix: str) -> None:
    deadline = time.monotonic() + 60
    while not _job_wrote(prefix, "result.json"):
        if time.monotonic() > deadline:
            raise RuntimeError("the job never ended")
        time.sleep(0.01)


def remote_hop(n: int, remotes: list[str]) -> dict[str, Any]:
    """Wall time per step of a chain of ``n`` no-op steps, in-thread (``""``) or each a job of
    one of ``remotes`` (``ray``: on a loopback cluster started first, not timed)."""
    from marin.execution.plan.options import RunOptions
    from marin.execution.step_runner import StepRunner

    cluster = _ray_cluster() if "ray" in remotes else None
    per_step: dict[str, float] = {}
    try:
        for remote in remotes:
            targets = lower(remote_jobs.chain(n, remote or None))
            with fresh_prefix("local", f"hop-{remote}") as prefix:
                t0 = time.perf_counter()
                StepRunner(RunOptions(max_concurrent=2), prefix=prefix).run(targets)
                per_step[remote] = (time.perf_counter() - t0) * 1000 / n
    finally:
        if cluster is not None:
            cluster.__exit__(None, None, None)
    return {"per_step_ms": per_step}


def _ray_cluster() -> Any:
    """A loopback Ray cluster (``marin_testing.ray``), ``$RAY_ADDRESS`` pointing at it."""
    from marin_testing.ray import RayCluster

    cluster = RayCluster(dict(os.environ)).__enter__()
    os.environ["RAY_ADDRESS"] = cluster.address
    return cluster


WORKERS: dict[str, str] = {
    "remote_wait": "sections.remote:remote_wait",
    "remote_restart": "sections.remote:remote_restart",
    "remote_hop": "sections.remote:remote_hop",
}
