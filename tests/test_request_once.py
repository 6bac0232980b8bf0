"""``marin run`` and the Airflow tasks open the prefix, collect the graph and validate the
options once each (issue 44; the table in docs/architecture.md). The Prefect entry flow's
test is in tests/prefect/test_prefect_once.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import marin.cli  # imported before the counters wrap what it imported
import marin.execution.run.runner
from marin_airflow import runtime
from marin_airflow.contract import target_reference
from marin_airflow.export import build_export, write_export
from tests.request_counts import count_calls

HERE = Path(__file__).resolve().parent
PIPELINE = f"{HERE / 'airflow' / 'airflow_pipelines.py'}:toy"


@pytest.mark.parametrize("extra", [[], ["--select", "af/root"]], ids=["all", "select"])
def test_marin_run_opens_collects_and_validates_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str]
) -> None:
    counts = count_calls(monkeypatch)
    code = marin.cli.main(
        ["run", PIPELINE, "--prefix", str(tmp_path / "p"), "--no-progress", *extra]
    )
    assert code == 0
    assert counts["open"] == 1 and counts["check"] == 1, counts
    assert counts["collect"] == 1, counts
    assert counts["options"] == 1, counts


def test_the_airflow_tasks_open_and_validate_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dags = str(tmp_path / "dags")
    result = build_export(PIPELINE, dags, prefix=str(tmp_path / "p"))
    write_export(result)
    runtime.clear_cache()
    target = target_reference(PIPELINE, dags)
    counts = count_calls(monkeypatch)
    runtime.plan_steps(target=target, dag_dir=dags, default_prefix=str(tmp_path / "p"))
    assert (counts["open"], counts["check"], counts["collect"], counts["options"]) == (1, 1, 1, 1)
    runtime.clear_cache()  # as in a fresh worker process
    counts.clear()
    task = next(t for t in result.tasks if t.step_id == "af/root@v1")
    out = runtime.run_step(
        target=target,
        step=task.step_id,
        fingerprint=task.fingerprint,
        dag_dir=dags,
        default_prefix=str(tmp_path / "p"),
    )
    assert out["action"] == "built"
    # The step task lowers only its step and ancestors: one walk of them.
    assert (counts["open"], counts["check"], counts["collect"], counts["options"]) == (1, 1, 1, 1)
    runtime.clear_cache()
