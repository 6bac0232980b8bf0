"""Airflow on Celery for tests: Redis, moto's S3 server and Celery workers set up as machines.

Beside :class:`~marin_testing.airflow.AirflowServices` (api-server, scheduler, dag-processor on
loopback), :class:`CeleryServices` runs the CeleryExecutor with a real Redis broker and real
``airflow celery worker`` processes. Each worker is set up as a separate machine would be: its
own working directory, ``HOME``, ``TMPDIR``, ``AIRFLOW_HOME`` (task logs) and its own copy of the
DAG folder. The workers share only the engine's services (broker, metadata database, execution
API) and the object store the artifacts live on.

The metadata database is PostgreSQL, as in a deployment (Airflow calls SQLite development-only):
Debian's server, started by the harness on a Unix socket in a temporary directory of its own
(:class:`~marin_testing.postgres.PostgresServer`), migrated once per harness, and removed
at teardown. Every service is its own process in its own session, killed by session at
teardown (:func:`~marin_testing.airflow.stop_sessions`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marin_testing.airflow import (
    AirflowSandbox,
    AirflowServices,
    free_port,
    session_members,
    stop_session,
    stop_sessions,
)
from marin_testing.postgres import PostgresServer

S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}

LOST_WORKER_SETTINGS = {
    # How fast a task whose worker vanished is noticed and run again (defaults: 300 s, 300 s).
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "15",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "3",
    "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "2",
}
"""The Airflow settings that decide how soon a lost worker's task is retried (docs/airflow.md)."""


class ServiceProcess:
    """One long-running program in a session of its own, its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: str, **popen: Any) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **popen,
            )
        except BaseException:
            self._log.close()
            raise

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f"--- {self.name}\n{f.read()[-chars:]}"

    def kill_session(self) -> None:
        """SIGKILL every process of the session at once, as a lost machine: nothing cleans up."""
        sid = self.proc.pid
        while members := session_members(sid):
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.2)
        self._log.close()

    def stop(self) -> None:
        stop_session(self.proc)
        self._log.close()


def wait_for(what: str, ready: Any, timeout: float, alive: Any = None) -> None:
    """Poll ``ready()`` until it is true; fail at once if ``alive()`` raises."""
    deadline = time.monotonic() + timeout
    while not ready():
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def _answers(port: int, request: bytes, expect: bytes) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(request)
            return conn.recv(64).startswith(expect)
    except OSError:
        return False


def start_redis(root: str) -> tuple[ServiceProcess, int]:
    """Debian's ``redis-server`` on a free loopback port, nothing persisted; until it answers."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: apt-get install -y redis-server")
    port = free_port()
    data = os.path.join(root, "redis")
    os.makedirs(data, exist_ok=True)
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly"]
    service = ServiceProcess("redis", [*argv, "no", "--dir", data], f"{data}.log")
    wait_for("redis", lambda: _answers(port, b"PING\r\n", b"+PONG"), 30, service.check_alive)
    return service, port


def start_moto(root: str, bucket: str) -> tuple[ServiceProcess, dict[str, str]]:
    """moto's S3 server on a free loopback port, with ``bucket`` made; the env that points
    boto and s3fs at it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [os.path.join(os.path.dirname(sys.executable), "moto_server")]
    service = ServiceProcess(
        "moto", [*argv, "-H", "127.0.0.1", "-p", str(port)], f"{root}/moto.log"
    )

    def bucket_made() -> bool:
        # The bucket's creation doubles as the readiness check.
        import urllib.request

        try:
            with urllib.request.urlopen(urllib.request.Request(f"{url}/{bucket}", method="PUT")):
                return True
        except OSError:
            return False

    wait_for("moto_server", bucket_made, 60, service.check_alive)
    env = {**S3_KEYS, "AWS_ENDPOINT_URL": url, "FSSPEC_S3_ENDPOINT_URL": url}
    return service, env


@dataclass
class WorkerSpec:
    """A Celery worker: its name (its Celery host is ``<name>@<host>``), queues and env."""

    name: str
    queues: tuple[str, ...]
    concurrency: int = 2
    env: Mapping[str, str] = field(default_factory=dict)


class CeleryServices(AirflowServices):
    """Airflow with the CeleryExecutor: Redis, the three Airflow components, and workers.

    Usage::

        workers = [WorkerSpec("cpu", ("default",)), WorkerSpec("gpu", ("default", "gpu"))]
        with CeleryServices(sandbox, dags, workers, env=s3_env) as services:
            services.wait_for_dags(["my_dag"])
            run_id = services.trigger("my_dag")  # through the REST API, as a user does
            assert services.wait_for_run("my_dag", run_id) == "success"
            services.kill_worker("cpu")          # the machine is lost
    """

    def __init__(
        self,
        sandbox: AirflowSandbox,
        dags_folder: str,
        workers: Sequence[WorkerSpec],
        *,
        env: Mapping[str, str] | None = None,
        parallelism: int = 8,
    ) -> None:
        super().__init__(sandbox, dags_folder, env=env, parallelism=parallelism)
        self.workers = {w.name: w for w in workers}
        self.redis_port = 0
        self._redis: ServiceProcess | None = None
        self._postgres: PostgresServer | None = None
        self._workers: dict[str, ServiceProcess] = {}
        self.sessions: list[int] = []
        """Every session this harness started (lost workers too): empty after :meth:`stop`."""

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                # Every machine names the one metadata database (the result backend too).
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url(),
                "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self.database_url()}",
                **LOST_WORKER_SETTINGS,
            }
        )
        env.update(self._extra)
        return env

    def database_url(self) -> str:
        """The PostgreSQL metadata database's SQLAlchemy URL (only once :meth:`start` runs)."""
        if self._postgres is None:
            raise RuntimeError("the metadata database is not started: call start() first")
        return self._postgres.sqlalchemy_url()

    def migrate(self) -> None:
        """``airflow db migrate`` into the harness's PostgreSQL (a fresh cluster every time)."""
        proc = self.airflow("db", "migrate", timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"airflow db migrate:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")

    def start(self) -> CeleryServices:
        os.makedirs(self.log_dir, exist_ok=True)
        try:
            # Before anything that reads env(): every component names this database.
            self._postgres = PostgresServer().start()
            self.sessions.append(self._postgres.pid)
            self._redis, self.redis_port = start_redis(self.log_dir)
            self.sessions.append(self._redis.proc.pid)
            try:
                super().start()
            finally:
                self.sessions += [p.pid for p in self._procs.values()]
            # All at once: each takes tens of seconds to come up on a busy machine.
            for name in self.workers:
                self._launch_worker(name)
            for name in self.workers:
                self._wait_for_worker(name)
        except BaseException:
            self.stop()
            raise
        return self

    def worker_root(self, name: str) -> str:
        """The worker's machine: its working directory, with ``home``, ``tmp``, ``airflow``."""
        return os.path.join(self.sandbox.root, "machines", name)

    def _launch_worker(self, name: str) -> None:
        spec = self.workers[name]
        root = self.worker_root(name)
        dags = os.path.join(root, "dags")  # the DAG files as shipped to this machine
        shutil.rmtree(dags, ignore_errors=True)
        shutil.copytree(self.dags_folder, dags, ignore=shutil.ignore_patterns("__pycache__"))
        for sub in ("home", "tmp", "airflow"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        env = self.env()
        env.update(
            {
                "HOME": os.path.join(root, "home"),
                "TMPDIR": os.path.join(root, "tmp"),
                "AIRFLOW_HOME": os.path.join(root, "airflow"),
                "AIRFLOW__CORE__DAGS_FOLDER": dags,
                **spec.env,
            }
        )
        argv = [sys.executable, "-m", "airflow", "celery", "worker", "--skip-serve-logs"]
        argv += ["--queues", ",".join(spec.queues), "--concurrency", str(spec.concurrency)]
        argv += ["--celery-hostname", self.celery_host(name)]
        log_path = os.path.join(self.log_dir, f"worker-{name}.log")
        self._workers[name] = ServiceProcess(f"worker {name}", argv, log_path, env=env, cwd=root)
        self.sessions.append(self._workers[name].proc.pid)

    def _wait_for_worker(self, name: str, timeout: float = 180) -> None:
        worker = self._workers[name]

        def ready() -> bool:
            with open(worker.log_path, errors="replace") as f:
                return f"{self.celery_host(name)} ready." in f.read()

        wait_for(f"Celery worker {name}", ready, timeout, worker.check_alive)

    def celery_host(self, name: str) -> str:
        return f"{name}@{socket.gethostname()}"

    def worker_session(self, name: str) -> int:
        """The session id of worker ``name``'s machine: every task process it runs is in it."""
        return self._workers[name].proc.pid

    def task_instance(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> Any:
        """One try of a task instance as the REST API reports it (its ``pid``, ``hostname``)."""
        import urllib.parse

        run = urllib.parse.quote(run_id, safe="")
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run}/taskInstances/{task_id}/tries/{try_number}"
        return self.rest("GET", path)

    def kill_worker(self, name: str) -> None:
        """SIGKILL worker ``name``'s whole session (it and every task runner it started)."""
        self._workers.pop(name).kill_session()

    def celery_control(self, *args: str) -> None:
        """``airflow celery <args>`` (add-queue, remove-queue, ...) against the live workers."""
        proc = self.airflow("celery", *args, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"airflow celery {' '.join(args)}:\n{proc.stdout}{proc.stderr}")

    def stop(self) -> None:
        """Kill every worker and Airflow component (each by its session), then stop Redis."""
        for worker in self._workers.values():
            worker.kill_session()
        stop_sessions(list(self._procs.values()), graceful=False)
        self._workers.clear()
        super().stop()  # nothing left to signal: closes the component logs
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        if self._postgres is not None:  # last: every client of it is gone
            self._postgres.stop()
            # Its directory is gone now; its log stays beside the other services' logs.
            log = os.path.join(self.log_dir, "postgres.log")
            with contextlib.suppress(OSError), open(log, "w") as f:
                f.write(self._postgres.last_log)
            self._postgres = None

    def unpaused_dags(self) -> set[str]:
        """The unpaused DAGs, from the REST API (the database is not a file to read here)."""
        import urllib.error

        try:
            listing = self.rest("GET", "/api/v2/dags?paused=false&limit=1000")
        except (urllib.error.URLError, OSError):
            return set()
        return {str(d["dag_id"]) for d in listing.get("dags", [])}

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        """A DAG run's state from the REST API (None until the run is visible there)."""
        import urllib.error
        import urllib.parse

        path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}"
        try:
            state = self.rest("GET", path).get("state")
        except (urllib.error.URLError, OSError):  # 404 until the run exists; a busy server
            return None
        return str(state) if state is not None else None

    def _check_alive(self) -> None:
        if self._postgres is not None:
            self._postgres.check_alive()
        super()._check_alive()
        for worker in self._workers.values():
            worker.check_alive()

    def log_tail(self, chars: int = 4000) -> str:
        parts = [super().log_tail(chars)]
        if self._postgres is not None:
            parts.append(self._postgres.log_tail(chars))
        parts += [w.log_tail(chars) for w in self._workers.values()]
        return "\n".join(parts)

    def task_log(self, worker: str, dag_id: str, run_id: str, task_id: str, attempt: int) -> str:
        """A task attempt's log as the worker machine wrote it (empty if it has none)."""
        logs = os.path.join(self.worker_root(worker), "airflow", "logs")
        path = os.path.join(
            logs,
            f"dag_id={dag_id}",
            f"run_id={run_id}",
            f"task_id={task_id}",
            f"attempt={attempt}.log",
        )
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""
