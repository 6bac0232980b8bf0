"""Airflow 3 behind the conformance interface: every run goes through a real scheduler.

One ``AirflowServices`` per session (api-server, ``scheduler`` with LocalExecutor, DAG
processor, each its own process on a free loopback port; see ``marin_testing.airflow``) runs every
scenario. Each run exports the target as a new DAG into the services' dags folder, waits for the
DAG processor to register it, triggers it with the run's prefix as conf, and waits for the run to
end. Tasks run in parallel worker processes under the DAG's ``max_active_tasks``, so the
concurrency cap is observed here as it is for the local and Prefect runners.

The workers' environment is fixed when the services start. The one variable that changes per
test, the call log (``$MARIN_TEST_CALLS``), points at a file of this runner's, whose lines are
moved into the test's call log after each run; any other variable restarts the services.

``keep_going`` is passed as the run's conf: the exported DAG's ``keep_going`` param. Off (the
default), a step does not start once another task of the run has failed (it ends skipped, and
so do its dependents) while running steps finish, as with ``marin run`` and Prefect.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marin_airflow.export import build_export, write_export
from marin_testing.airflow import AirflowSandbox, AirflowServices
from tests.conformance.scenarios import CALLS_ENV, LIMIT_ENV, LIMIT_FILE_ENV

ROOT = Path(__file__).resolve().parents[2]
RETRY_DELAY_ENV = "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY"


class AirflowRunner:
    name = "airflow"
    engine = "airflow"

    def __init__(self) -> None:
        self._root = tempfile.mkdtemp(prefix="marin-airflow-conformance-")
        atexit.register(shutil.rmtree, self._root, True)
        self._sandbox = AirflowSandbox(os.path.join(self._root, "sandbox"), pythonpath=[str(ROOT)])
        self._dags = os.path.join(self._root, "dags")
        self._calls = os.path.join(self._root, "calls.jsonl")
        self._limit = os.path.join(self._root, "limit")
        os.makedirs(self._dags, exist_ok=True)
        self._services: AirflowServices | None = None
        self._services_env: dict[str, str] = {}
        self._runs = itertools.count()
        self.last_output = ""
        atexit.register(self.close)  # registered after the rmtree: runs before it

    def supports(self, feature: str) -> bool:
        # A real scheduler: concurrency, fail-fast and keep-going as the other runners.
        return True

    def _ensure_services(self, env: dict[str, str]) -> AirflowServices:
        # The limit goes in a file the workers read: a variable would restart the services.
        with open(self._limit, "w") as f:
            f.write(env.get(LIMIT_ENV, ""))
        wanted = {k: v for k, v in env.items() if k not in (CALLS_ENV, LIMIT_ENV)}
        if self._services is not None and wanted != self._services_env:
            self.close()
        if self._services is None:
            # A task's retry waits 300 s by default; the retry scenario needs seconds.
            worker_env = {**wanted, CALLS_ENV: self._calls, RETRY_DELAY_ENV: "1",
                          LIMIT_FILE_ENV: self._limit}  # fmt: skip
            self._services = AirflowServices(self._sandbox, self._dags, env=worker_env).start()
            self._services_env = wanted
        return self._services

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
        """True iff the DAG run succeeded under the real scheduler."""
        env = dict(env or {})
        services = self._ensure_services(env)
        n = next(self._runs)
        attr = target.rsplit(":", 1)[-1].replace(".", "_")
        result = build_export(
            target, self._dags, dag_id=f"conformance_{attr}_{n}", max_concurrent=max_concurrent
        )
        write_export(result)
        open(self._calls, "w").close()
        services.wait_for_dags([result.dag_id])
        conf = {"prefix": prefix, "keep_going": keep_going, "on_drift": on_drift,
                "force": list(force), "cascade": cascade}  # fmt: skip
        run_id = services.trigger(result.dag_id, conf)
        state = services.wait_for_run(result.dag_id, run_id)
        self._move_calls(env.get(CALLS_ENV))
        self.last_output = services.log_tail(20000)
        return state == "success"

    def engine_unit(self, engine: Mapping[str, Any]) -> dict[str, Any]:
        """What Airflow's metadata database holds about the task instance a record names: the
        process it ran in, and its try."""
        assert self._services is not None
        rows = self._services.sandbox.query(
            "SELECT dag_id, run_id, task_id, map_index, try_number, pid FROM task_instance "
            "WHERE dag_id = ? AND run_id = ? AND task_id = ? AND map_index = ?",
            (engine["dag_id"], engine["run_id"], engine["task_id"], engine["map_index"]),
        )
        assert len(rows) == 1, f"no task instance {dict(engine)}"
        keys = ("dag_id", "run_id", "task_id", "map_index", "try_number", "pid")
        return dict(zip(keys, rows[0], strict=True))

    def _move_calls(self, destination: str | None) -> None:
        with open(self._calls) as f:
            text = f.read()
        if destination and text:
            with open(destination, "a") as out:
                out.write(text)

    def close(self) -> None:
        if self._services is not None:
            self._services.stop()
            self._services = None

    def __repr__(self) -> str:
        return f"AirflowRunner(root={self._root!r})"


class AirflowDagsTestRunner:
    """``airflow dags test``: tasks one after another in a subprocess, no services to start.

    The plan scenarios (tests/conformance/test_plan_scenarios.py) decide, not schedule, so they
    run here: each case's graph travels in the environment, which would restart the services.
    """

    name = "airflow"

    def __init__(self) -> None:
        self._sandbox: AirflowSandbox | None = None
        self._runs = itertools.count()
        self.last_output = ""

    def supports(self, feature: str) -> bool:
        return feature not in ("concurrency", "fail-fast")  # tasks run one at a time

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
        return f"AirflowDagsTestRunner(sandbox={self._sandbox.root if self._sandbox else None!r})"
