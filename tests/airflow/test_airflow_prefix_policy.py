"""Issue 11 item 7 under real Airflow: the run's ``prefix`` param cannot leave the worker's roots.

``airflow dags test`` with a ``--conf`` prefix, as a trigger would pass it, on a worker whose
environment sets ``MARIN_ALLOWED_PREFIXES``: outside the roots every task fails before any step's
``fn`` runs and the folder is left as it was; inside, the same DAG builds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from marin_airflow.export import build_export, write_export
from tests.airflow.airflow_pipelines import CALLS_ENV, FAIL_ENV, read_calls

pytest.importorskip("airflow.sdk")
pytestmark = pytest.mark.slow

PIPELINES = Path(__file__).resolve().parent / "airflow_pipelines.py"


def test_prefix_param_outside_the_allowed_roots_fails_every_task(
    tmp_path: Path, sandbox: Any, calls: Path
) -> None:
    dags, allowed, victim = tmp_path / "dags", tmp_path / "allowed", tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    result = build_export(f"{PIPELINES}:toy", str(dags))
    write_export(result)
    env = {CALLS_ENV: str(calls), FAIL_ENV: "", "MARIN_ALLOWED_PREFIXES": str(allowed)}

    refused = sandbox.dags_test(result.dag_id, str(dags), env=env, conf={"prefix": str(victim)})
    assert refused.returncode != 0
    assert "MARIN_ALLOWED_PREFIXES" in refused.stdout + refused.stderr
    states = sandbox.task_states(result.dag_id)
    assert "success" not in states.values(), states
    assert not calls.exists() or read_calls(str(calls)) == []
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]

    built = sandbox.dags_test(
        result.dag_id, str(dags), env=env, conf={"prefix": str(allowed / "runs")}
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert (allowed / "runs" / "af" / "root" / "v1").exists()
