"""Declared resources in exported Airflow DAGs: every mapped field on the parsed task objects,
and (slow) a real scheduler that never runs more GPU work than the ``gpu`` pool has slots."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marin_airflow.export import build_export, pod_quantities, pool_slots, write_export
from tests.conformance.scenarios import CALLS_ENV, read_calls
from tests.resources import resource_pipelines as rp

pytest.importorskip("airflow.sdk")

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PIPELINES = ROOT / "tests" / "resources" / "resource_pipelines.py"
GiB = 1024**3


def _placement(sandbox: Any, folder: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "dagbag_placement.py"), str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env=sandbox.env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PLACEMENT-JSON "))
    return dict(json.loads(line[len("PLACEMENT-JSON ") :]))


def test_pool_slots_and_pod_quantities() -> None:
    assert pool_slots("gpu", [("cpu", 8.0), ("gpu", 2.0)]) == 2
    assert pool_slots("memory", [("memory", 20.5 * GiB)]) == 21
    assert pool_slots("gpu", [("cpu", 8.0)]) == 1
    assert pool_slots(None, [("gpu", 4.0)]) == 1
    assert pool_slots("big-pool", [("gpu", 4.0)]) == 1
    assert dict(pod_quantities([("cpu", 0.5), ("memory", 1.5 * GiB), ("gpu", 1.0)])) == {
        "cpu": "500m",
        "memory": "1536Mi",
        "nvidia.com/gpu": "1",
    }


def test_dagbag_tasks_carry_every_mapped_field(tmp_path: Path, sandbox: Any) -> None:
    target = f"{PIPELINES}:placed"
    plain = build_export(target, str(tmp_path / "plain"), dag_id="placed")
    # Tasks on many machines: a shared prefix, and the pipeline by module path.
    k8s = build_export(
        "tests.resources.resource_pipelines:placed",
        str(tmp_path / "k8s"),
        dag_id="placed_k8s",
        executor="kubernetes",
        prefix="s3://bucket/placed",
    )
    write_export(plain)
    write_export(k8s)
    # Byte-stable, data-only: the same export twice gives the same bytes, and the executor
    # choice is recorded in the regeneration command.
    assert build_export(target, str(tmp_path / "plain"), dag_id="placed").text == plain.text
    assert "--executor kubernetes" in k8s.command and "pod_resources" not in plain.text

    parsed = _placement(sandbox, tmp_path / "plain") | _placement(sandbox, tmp_path / "k8s")
    assert parsed["import_errors"] == {}
    tasks = parsed["placed"]
    assert tasks["place/tokenize@v1"] == {
        "queue": "cpu-q", "pool": "default_pool", "pool_slots": 1,
        "execution_timeout_s": 5400.0, "pod": None,
    }  # fmt: skip
    assert tasks["place/train@v1"] == {
        "queue": "default", "pool": "gpu", "pool_slots": 2,  # 2 GPUs in the gpu pool: 2 slots
        "execution_timeout_s": 7200.0, "pod": None,
    }  # fmt: skip
    assert tasks["place/eval@v1"]["pool"] == "gpu 'q\""  # quotes reach Airflow as data
    assert tasks["place/eval@v1"]["queue"] == "gpu-q"
    assert tasks["place/plain@v1"] == {
        "queue": "default", "pool": "default_pool", "pool_slots": 1,
        "execution_timeout_s": None, "pod": None,
    }  # fmt: skip

    pods = {name: t["pod"] for name, t in parsed["placed_k8s"].items()}
    train = {"cpu": "8", "memory": "65536Mi", "nvidia.com/gpu": "2"}
    assert pods["place/train@v1"] == {"container": "base", "requests": train, "limits": train}
    evals = {"cpu": "500m", "memory": "1536Mi", "nvidia.com/gpu": "1", "tpu": "4"}
    assert pods["place/eval@v1"] == {"container": "base", "requests": evals, "limits": evals}
    assert pods["place/plain@v1"] is None
    assert parsed["placed_k8s"]["place/train@v1"]["pool_slots"] == 2


@pytest.mark.slow
def test_scheduler_never_runs_more_gpu_work_than_the_pool_has_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conformance on a real scheduler (LocalExecutor): 4 one-GPU steps and a two-GPU step in a
    ``gpu`` pool of 2 slots. The observed GPUs in use peak at exactly 2."""
    from marin_testing.airflow import AirflowSandbox, AirflowServices

    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv(CALLS_ENV, str(calls))  # the same value when exporting and in workers
    root = tmp_path / "services"
    box = AirflowSandbox(str(root), pythonpath=[str(ROOT)])
    box.migrate()
    dags, prefix = root / "dags", tmp_path / "prefix"
    result = build_export(f"{PIPELINES}:gpu_cap", str(dags), dag_id="gpu_cap", max_concurrent=8)
    write_export(result)
    assert {t.pool_slots for t in result.tasks} == {1, 2}
    pools = box.airflow("pools", "set", "gpu", "2", "GPUs", timeout=120)
    assert pools.returncode == 0, pools.stderr[-2000:]
    services = AirflowServices(
        box, str(dags), env={CALLS_ENV: str(calls), "MARIN_PREFIX": str(prefix)}, parallelism=8
    )
    with services:
        services.wait_for_dags(["gpu_cap"])
        run_id = services.trigger("gpu_cap")
        state = services.wait_for_run("gpu_cap", run_id)
        assert state == "success", services.log_tail(6000)
    timeline = rp.gpu_in_use(read_calls(str(calls)), rp.GPU_CAP)
    assert len(timeline) == 2 * len(rp.GPU_CAP)
    assert max(timeline) == 2, timeline  # never above the pool's 2 slots, and 2 reached
    shutil.rmtree(prefix, ignore_errors=True)
