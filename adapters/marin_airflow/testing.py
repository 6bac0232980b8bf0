"""A throw-away Airflow installation for tests: temporary ``AIRFLOW_HOME``, SQLite, no examples.

``airflow db migrate`` costs seconds, so the first sandbox of a process migrates a template
database and later sandboxes copy it. Every Airflow command runs in a subprocess
(``python -m airflow``), so the test process never imports Airflow's heavy machinery and
sandboxes never share state.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

_template_lock = threading.Lock()
_template_db: str | None = None


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.pop("MARIN_PREFIX", None)
    bin_dir = os.path.dirname(sys.executable)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


class AirflowSandbox:
    """An ``AIRFLOW_HOME`` in a temporary folder, migrated and ready for ``airflow dags test``."""

    def __init__(self, root: str | None = None, pythonpath: Sequence[str] = ()) -> None:
        if root is None:  # ours to delete when the process ends
            root = tempfile.mkdtemp(prefix="marin-airflow-")
            atexit.register(shutil.rmtree, root, True)
        self.root = root
        self.home = os.path.join(self.root, "airflow-home")
        self.pythonpath = [os.path.abspath(p) for p in pythonpath]
        os.makedirs(self.home, exist_ok=True)
        self._migrated = False

    @property
    def db_path(self) -> str:
        return os.path.join(self.home, "airflow.db")

    def env(
        self, dags_folder: str | None = None, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        env = _clean_env()
        env.update(
            {
                "AIRFLOW_HOME": self.home,
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": os.path.abspath(
                    dags_folder or os.path.join(self.root, "dags")
                ),
                "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
                # No telemetry and no update checks offline.
                "SCARF_ANALYTICS": "false",
                "AIRFLOW__USAGE_DATA_COLLECTION__ENABLED": "False",
            }
        )
        if self.pythonpath:
            parts = [*self.pythonpath, env.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
        env.update(extra or {})
        return env

    def airflow(
        self,
        *args: str,
        dags_folder: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 300,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``airflow <args>`` in this sandbox; output captured as text."""
        proc = subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env(dags_folder, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"airflow {' '.join(args)} exited {proc.returncode}:\n"
                f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            )
        return proc

    def migrate(self) -> None:
        """Create the SQLite metadata database (copied from a per-process template)."""
        global _template_db
        if self._migrated:
            return
        with _template_lock:
            if _template_db is None or not os.path.exists(_template_db):
                template = AirflowSandbox()
                template.airflow("db", "migrate", check=True, timeout=300)
                _template_db = template.db_path
            shutil.copyfile(_template_db, self.db_path)
        self._migrated = True

    def dags_test(
        self,
        dag_id: str,
        dags_folder: str,
        *,
        conf: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        """``airflow dags test DAG_ID`` (tasks run one by one, in-process); returns the result."""
        self.migrate()
        args = ["dags", "test", dag_id]
        if conf is not None:
            args += ["--conf", json.dumps(dict(conf))]
        return self.airflow(*args, dags_folder=dags_folder, env=env, timeout=timeout)

    # --- reading results back --------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.db_path) as db:
            return list(db.execute(sql, tuple(params)))

    def latest_run_id(self, dag_id: str) -> str:
        rows = self.query(
            "SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (dag_id,)
        )
        if not rows:
            raise AssertionError(f"no run of DAG {dag_id} in {self.db_path}")
        return str(rows[0][0])

    def task_states(self, dag_id: str, run_id: str | None = None) -> dict[str, str | None]:
        run_id = run_id or self.latest_run_id(dag_id)
        rows = self.query(
            "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?",
            (dag_id, run_id),
        )
        return {str(task_id): state for task_id, state in rows}

    def xcoms(self, dag_id: str, key: str, run_id: str | None = None) -> dict[str, Any]:
        run_id = run_id or self.latest_run_id(dag_id)
        rows = self.query(
            "SELECT task_id, value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = ?",
            (dag_id, run_id, key),
        )
        return {str(task_id): json.loads(value) for task_id, value in rows}


def stop_process_group(proc: subprocess.Popen[Any], grace: float = 15.0) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it started.

    ``airflow standalone``'s scheduler can outlive its parent after SIGTERM (it waits for its
    LocalExecutor workers), so wait for the whole group to be gone, then SIGKILL what remains.
    """
    pgid = proc.pid

    def group_alive() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - a foreign process reused the id
            return False
        return True

    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    while group_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while group_alive() and time.monotonic() < deadline:  # SIGKILLed members being reaped
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
