"""``marin export airflow --executor celery|kubernetes``: what only one host sees is refused,
retries default to one, and the ``marin-plan`` task's queue can be chosen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marin.execution.errors import StorageError
from marin_airflow.export import ExportError, build_export, lower_target, write_export
from marin_airflow.runtime import run_step

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MODULE_TARGET = "tests.airflow.celery_pipelines:flaky"
FILE_TARGET = f"{HERE / 'celery_pipelines.py'}:flaky"
S3 = "s3://bucket/runs"


@pytest.mark.parametrize("executor", ["celery", "kubernetes"])
@pytest.mark.parametrize(
    ("target", "prefix", "message"),
    [
        (MODULE_TARGET, None, "needs --prefix"),
        (MODULE_TARGET, "/srv/marin", "is on one host's file storage"),
        (MODULE_TARGET, "relative/dir", "is on one host's file storage"),
        (MODULE_TARGET, "file:///srv/marin", "is on one host's file storage"),
        (MODULE_TARGET, "memory://marin", "is on one host's memory storage"),
        (FILE_TARGET, S3, "is outside the DAG folder"),
    ],
)
def test_multi_host_export_refuses_what_one_host_sees(
    tmp_path: Path, executor: str, target: str, prefix: str | None, message: str
) -> None:
    with pytest.raises(ExportError, match=message) as info:
        build_export(target, str(tmp_path / "dags"), prefix=prefix, executor=executor)
    text = str(info.value)
    assert text.startswith(f"error: --executor {executor}")
    assert info.value.fix.startswith(("pass --prefix", "use a module path"))
    assert not (tmp_path / "dags").exists()


def test_a_file_target_inside_the_dag_folder_is_host_independent(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "pipe.py").write_text((HERE / "celery_pipelines.py").read_text())
    result = build_export(f"{dags / 'pipe.py'}:flaky", str(dags), prefix=S3, executor="celery")
    assert 'TARGET = "pipe.py:flaky"' in result.text


def test_single_host_exports_are_unchanged(tmp_path: Path) -> None:
    """A default export has none of the multi-host lines (committed DAG files keep their bytes)
    and no retries; the executor's default retries are not spelled out in the command."""
    plain = build_export(MODULE_TARGET, str(tmp_path))
    assert "SHARED_PREFIX_ONLY" not in plain.text and "PLAN_QUEUE" not in plain.text
    assert {t.retries for t in plain.tasks} == {0, 2}  # flaky/step declares retries=2
    celery = build_export(MODULE_TARGET, str(tmp_path), prefix=S3, executor="celery")
    assert {t.task_id: t.retries for t in celery.tasks} == {
        "flaky.root__v1": 1,
        "flaky.step__v1": 2,  # the step's own retries win
        "flaky.after__v1": 1,
    }
    assert "--retries" not in celery.command
    none = build_export(MODULE_TARGET, str(tmp_path), prefix=S3, executor="celery", retries=0)
    assert {t.retries for t in none.tasks} == {0, 2} and "--retries 0" in none.command


def test_plan_queue_and_shared_prefix_reach_the_parsed_dag(tmp_path: Path, sandbox: Any) -> None:
    dags = tmp_path / "dags"
    result = build_export(
        MODULE_TARGET, str(dags), prefix=S3, executor="celery", plan_queue="control"
    )
    write_export(result)
    assert "--plan-queue control" in result.command and "--executor celery" in result.command
    assert (
        build_export(
            MODULE_TARGET, str(dags), prefix=S3, executor="celery", plan_queue="control"
        ).text
        == result.text
    )  # byte-stable
    proc = subprocess.run(
        [sys.executable, str(HERE / "dagbag_dump.py"), str(dags)],
        capture_output=True,
        text=True,
        timeout=120,
        env=sandbox.env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("DAGBAG-JSON "))
    bag = json.loads(line[len("DAGBAG-JSON ") :])
    assert bag["import_errors"] == {}
    tasks = bag["dags"][result.dag_id]["tasks"]
    assert tasks["marin-plan"]["queue"] == "control"
    assert {t["queue"] for tid, t in tasks.items() if tid != "marin-plan"} == {"default"}
    assert {t["kwargs"].get("shared_prefix_only") for t in tasks.values()} == {True}


@pytest.mark.parametrize("queue", ["", "a b", "q\n", "x" * 251])
def test_a_bad_plan_queue_is_refused(tmp_path: Path, queue: str) -> None:
    with pytest.raises(ExportError, match="--plan-queue"):
        build_export(MODULE_TARGET, str(tmp_path), plan_queue=queue)


def test_a_multi_host_task_refuses_a_prefix_on_its_own_disk(tmp_path: Path) -> None:
    """Chosen at run time (a run's param, a worker's $MARIN_PREFIX): refused before building."""
    (spec,) = [s for s in lower_target(MODULE_TARGET) if s.step_id == "flaky/root@v1"]
    prefix = tmp_path / "local"
    with pytest.raises(StorageError) as info:
        run_step(
            target=MODULE_TARGET,
            step=spec.step_id,
            fingerprint=spec.fingerprint,
            prefix=str(prefix),
            shared_prefix_only=True,
        )
    text = str(info.value)
    assert "(step flaky/root@v1)" in text and "on this worker's own storage" in text
    assert "'prefix' param on shared storage" in text
    assert not prefix.exists() or not any(prefix.rglob("*")), "something was written"


def test_cli_refuses_celery_without_a_shared_prefix(tmp_path: Path) -> None:
    args = [MODULE_TARGET, "-o", str(tmp_path), "--executor", "celery", "--prefix", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "marin_airflow.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --executor celery --prefix")
    assert ": pass --prefix s3://" in proc.stderr and not list(tmp_path.iterdir())


def test_a_step_built_outside_an_airflow_task_names_no_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_step`` called directly (no task instance) leaves no empty Airflow ids behind."""
    (tmp_path / "events").mkdir()
    monkeypatch.setenv("MARIN_CELERY_TEST_EVENTS", str(tmp_path / "events"))
    (spec,) = [s for s in lower_target(MODULE_TARGET) if s.step_id == "flaky/root@v1"]
    out = run_step(
        target=MODULE_TARGET,
        step=spec.step_id,
        fingerprint=spec.fingerprint,
        prefix=str(tmp_path / "p"),
    )
    assert out["action"] == "built"
    record = json.loads((tmp_path / "p" / f"{spec.output_path}.marin/record.json").read_text())
    assert "engine" not in record["provenance"] and record["provenance"]["pid"] == os.getpid()
