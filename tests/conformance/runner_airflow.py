"""Airflow 3 behind the conformance interface: export the target, then ``airflow dags test``.

Each run writes the exported DAG into a fresh dags folder of one shared, migrated SQLite sandbox
and runs it with ``airflow dags test`` in a subprocess (tasks one after another, in-process),
so scenarios that need parallel tasks or fail-fast are reported as unsupported here; the real
scheduler's concurrency is tested in ``tests/airflow/test_airflow_runs.py``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path

from marin_airflow.export import build_export, write_export
from marin_airflow.testing import AirflowSandbox

ROOT = Path(__file__).resolve().parents[2]

# What `airflow dags test` cannot express:
# - concurrency: it runs tasks one at a time;
# - fail-fast: Airflow keeps building independent branches after a failure (like keep_going),
#   and its own DAG fail_fast kills running tasks instead of letting them finish.
UNSUPPORTED = frozenset({"concurrency", "fail-fast"})


class AirflowRunner:
    name = "airflow"

    def __init__(self) -> None:
        self._sandbox: AirflowSandbox | None = None
        self._runs = itertools.count()
        self.last_output = ""

    def supports(self, feature: str) -> bool:
        return feature not in UNSUPPORTED

    @property
    def sandbox(self) -> AirflowSandbox:
        if self._sandbox is None:
            self._sandbox = AirflowSandbox(pythonpath=[str(ROOT)])
            self._sandbox.migrate()
        return self._sandbox

    def run(
        self,
        target: str,
        *,
        prefix: str,
        max_concurrent: int = 8,
        keep_going: bool = False,
        env: dict[str, str] | None = None,
        on_drift: str = "warn",
        force: Sequence[str] = (),
        cascade: bool = True,
    ) -> bool:
        """True iff the DAG run succeeded. Airflow always keeps going on independent branches."""
        n = next(self._runs)
        dags = os.path.join(self.sandbox.root, f"dags-{n}")
        attr = target.rsplit(":", 1)[-1].replace(".", "_")
        result = build_export(
            target, dags, dag_id=f"conformance_{attr}_{n}", max_concurrent=max_concurrent
        )
        write_export(result)
        proc = self.sandbox.dags_test(
            result.dag_id,
            dags,
            conf={"prefix": prefix, "on_drift": on_drift, "force": list(force), "cascade": cascade},
            env=dict(env or {}),
        )
        self.last_output = proc.stdout[-20000:] + proc.stderr[-5000:]
        return proc.returncode == 0

    def __repr__(self) -> str:
        return f"AirflowRunner(sandbox={self._sandbox.root if self._sandbox else None!r})"
