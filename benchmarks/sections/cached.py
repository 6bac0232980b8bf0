"""Section ``cached``: a built pipeline checked again.

A re-run of a fully built pipeline (every record read, drift found anywhere) and a full ``plan``
of it, on local disk and ``memory://``; then the same through a store 20 ms away per call
(``latency.py``): the parallel check against a serial one."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from common import clear_memory_store, fresh_prefix, lowered
from harness import Harness

from marin.execution.step_spec import StepSpec


def bench(h: Harness) -> None:
    """(4) Cached re-run and full check of a built pipeline; the same 20 ms from storage."""
    n = 2000 if h.quick else 10000
    for backend in ("local", "memory"):
        for kind in ("experiment", "random"):
            if (backend, kind) != ("local", "experiment") and (h.quick or backend == "memory"):
                continue
            r = h.worker("cached", 180, backend=backend, n=n, kind=kind, reps=1 if h.quick else 3)
            if not r:
                continue
            h.add(
                "cached",
                f"re-run of built {kind} n={r['n']} ({backend})",
                r["rerun_s"],
                "s",
                "",
                None,
                f"every record read (drift is found anywhere), {r['rerun_pruned']} pruned",
            )
            h.add(
                "cached",
                f"plan: check all of {kind} n={r['n']} ({backend})",
                r["plan_s"],
                "s",
                note=f"{r['plan_s'] / r['n'] * 1e6:.0f} us/step",
            )
    _latency(h)


def _latency(h: Harness) -> None:
    """The same check through a store 20 ms away per call: parallel, and serial (estimated)."""
    n = 200 if h.quick else 1000
    r = h.worker(
        "latency",
        240,
        n=n,
        latency_s=0.020,
        serial_sample=10 if h.quick else 50,
        reps=1 if h.quick else 3,
    )
    if r:
        if r["n"] >= 1000:
            h.judge(
                "cached",
                f"plan n={r['n']} @20ms/call",
                r["plan_s"],
                "s",
                "cached.plan_latency",
                3.0,
                note=f"{r['plan_calls']} storage calls",
            )
        else:
            h.add(
                "cached",
                f"plan n={r['n']} @20ms/call",
                r["plan_s"],
                "s",
                note=f"{r['plan_calls']} storage calls",
            )
        h.add(
            "cached",
            f"serial check n={r['n']} @20ms/call (est.)",
            r["serial_estimate_s"],
            "s",
            note=f"measured on {r['serial_sample']} steps, scaled",
        )
        h.add(
            "cached", "speed-up parallel vs serial check", r["serial_estimate_s"] / r["plan_s"], "x"
        )
        h.add(
            "cached",
            f"re-run of built n={r['n']} @20ms/call",
            r["rerun_s"],
            "s",
            note=f"{r['rerun_calls']} storage calls (every record: drift is found anywhere)",
        )


def time_rerun_and_plan(
    targets: list[Any], prefix: str, reps: int, max_concurrent: int
) -> dict[str, Any]:
    """Medians of a re-run of a built pipeline (pruned) and of a full ``plan``-style check."""
    from marin.execution.pipeline.graph import Graph
    from marin.execution.plan.options import RunOptions
    from marin.execution.plan.read import plan_run
    from marin.execution.step_runner import StepRunner
    from marin.execution.store.location import open_prefix

    rerun: list[float] = []
    plan: list[float] = []
    out: dict[str, Any] = {}
    for _ in range(reps):
        t0 = time.perf_counter()
        report = StepRunner(RunOptions(max_concurrent=max_concurrent), prefix=prefix).run(targets)
        rerun.append(time.perf_counter() - t0)
        assert not report.to_build, "a re-run of a built pipeline wanted to build"
        out["rerun_checked"] = len(report.skipped) + len(report.pruned)
        out["rerun_pruned"] = len(report.pruned)
        t0 = time.perf_counter()
        decisions = plan_run(
            Graph.of(targets), open_prefix(prefix), RunOptions()
        ).decisions.values()
        plan.append(time.perf_counter() - t0)
        assert all(d.status == "built" for d in decisions)
    out["rerun_s"] = statistics.median(rerun)
    out["plan_s"] = statistics.median(plan)
    return out


def seed_built(prefix: str, steps: Sequence[StepSpec]) -> None:
    """Make ``prefix`` hold a fully built pipeline: one committed record per step.

    The records are the ones ``build_step`` writes, but put in place directly (no lease, status or
    fsync), so that a 10,000-step built state costs seconds to set up even on a slow disk or on
    ``memory://``, whose fsspec writes are O(files stored).
    """
    from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import ArtifactRecord, record_path

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


def latency(n: int, latency_s: float, serial_sample: int, reps: int = 3) -> dict[str, Any]:
    """Build ``n`` steps on ``memory://``, then check them through a store ``latency_s`` away."""
    import latency as latency_fs

    from marin.execution.pipeline.graph import Graph
    from marin.execution.plan.options import RunOptions
    from marin.execution.plan.read import plan_run, read_stored_step
    from marin.execution.step_runner import StepRunner
    from marin.execution.store.location import open_prefix

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
        decisions = plan_run(Graph.of(targets), slow, RunOptions()).decisions.values()
        plan.append(time.perf_counter() - t0)
        assert all(d.status == "built" for d in decisions)
        out["plan_calls"] = latency_fs.LatencyFileSystem.calls
        latency_fs.LatencyFileSystem.calls = 0
        t0 = time.perf_counter()
        report = StepRunner(RunOptions(max_concurrent=8), prefix="slowmem://lat").run(targets)
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


WORKERS: dict[str, str] = {
    "cached": "sections.cached:cached",
    "latency": "sections.cached:latency",
}
