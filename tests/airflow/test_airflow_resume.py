"""A resumable step as an Airflow task whose process is SIGKILLed: the next run resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from marin_airflow.export import build_export, write_export
from tests.reliability.resumable_pipeline import COUNTER_ENV, KILL_ENV

pytest.importorskip("airflow.sdk")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_killed_task_resumes_on_the_next_dag_run(tmp_path: Path, sandbox: Any) -> None:
    dags, prefix, counter = tmp_path / "dags", tmp_path / "prefix", tmp_path / "counter"
    result = build_export(f"{ROOT / 'tests/reliability/resumable_pipeline.py'}:counting", str(dags))
    write_export(result)
    env = {COUNTER_ENV: str(counter), "MARIN_PREFIX": str(prefix)}
    first = sandbox.dags_test(result.dag_id, str(dags), env={**env, KILL_ENV: "55"})
    assert first.returncode != 0
    done = [int(line.split()[1]) for line in counter.read_text().splitlines()]
    assert done == list(range(55)), first.stderr[-3000:]
    second = sandbox.dags_test(result.dag_id, str(dags), env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    done = [int(line.split()[1]) for line in counter.read_text().splitlines()]
    assert done == list(range(55)) + list(range(50, 101))
    assert (prefix / "count/v1.marin/record.json").exists()
