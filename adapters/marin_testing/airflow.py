"""A throw-away Airflow installation for tests: temporary ``AIRFLOW_HOME``, SQLite, no examples.

``airflow db migrate`` costs seconds, so the first sandbox of a process migrates a template
database and later sandboxes copy it. Every Airflow command runs in a process of its own, so
the test process never imports Airflow's heavy machinery and sandboxes never share state:
``python -m airflow``, or for ``airflow dags test`` a child forked from the sandbox's fork server,
which has Airflow and its execution API loaded already (:mod:`marin_testing.airflow_fork`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import secrets
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

from marin_testing.airflow_fork import ForkServer

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
        self._fork_server: ForkServer | None = None

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
        """``airflow dags test DAG_ID`` (tasks run one by one, in-process); returns the result.

        It runs in a child forked from this sandbox's fork server (:mod:`.airflow_fork`: Airflow
        and its execution API loaded once), unless its Airflow settings differ from the
        server's: then in a plain ``python -m airflow`` process.
        """
        self.migrate()
        args = ["dags", "test", dag_id]
        if conf is not None:
            args += ["--conf", json.dumps(dict(conf))]
        command_env = self.env(dags_folder, env)
        if self._fork_server is None:
            log = os.path.join(self.root, "airflow-fork-server.log")
            self._fork_server = ForkServer(self.env(dags_folder), self.root, log)
        if self._fork_server.accepts(command_env, self.root):
            return self._fork_server.run(args, command_env, timeout)
        return self.airflow(*args, dags_folder=dags_folder, env=env, timeout=timeout)

    def close(self) -> None:
        """Stop this sandbox's fork server, if it started one (it also stops at exit)."""
        if self._fork_server is not None:
            self._fork_server.close()
            self._fork_server = None

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


_PORT_RANGE = (20000, 32000)
"""Below Linux's ephemeral range (32768-60999): a port handed out by ``bind(0)``, or taken by
an outgoing connection, is never one of these, so a port found free stays free more often
until the server that needs it binds."""


def _port_range() -> tuple[int, int]:
    """``_PORT_RANGE``, or this pytest-xdist worker's slice of it: two workers of one test run
    never pick the same port."""
    low, high = _PORT_RANGE
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if count <= 1 or not worker[2:].isdigit():
        return low, high
    span = (high - low) // count
    low += int(worker[2:]) % count * span
    return low, low + span


def free_port() -> int:
    """A loopback port free now, outside the ephemeral range when one can be found there."""
    rng = random.Random()
    for _ in range(50):
        port = rng.randrange(*_port_range())
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTakenError(RuntimeError):
    """The api-server's port was taken by another process between its choice and the bind."""


# --- a real scheduler, component by component ---------------------------------------------------


def session_members(sid: int) -> list[int]:
    """Every live process whose session id is ``sid`` (Linux ``/proc``).

    Airflow's task runners move into process groups of their own, so a process group misses
    them; they all stay in the session the component was started in.
    """
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # Fields after the command name, which is in parentheses and may contain spaces.
        fields = stat[stat.rfind(")") + 2 :].split()
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            members.append(int(entry))
    return members


def stop_session(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """Stop a process started with ``start_new_session=True`` and all of its session.

    SIGTERM, then a second SIGTERM (Airflow's scheduler can hang on the first: "Signal
    again..."), then SIGKILL for whatever is left. Only that session's processes are signalled.
    """
    stop_sessions([proc], grace)


def stop_sessions(
    procs: Sequence[subprocess.Popen[Any]], grace: float = 10.0, *, graceful: bool = True
) -> None:
    """:func:`stop_session` for several sessions at once: each step signals every session
    still running, so stopping them all takes as long as the slowest, not the sum.
    ``graceful=False``: SIGKILL at once (services a test throws away: a scheduler's own
    shutdown takes seconds, and nothing of theirs is read afterwards but their logs)."""
    left = list(procs)

    def signal_all(sig: int) -> None:
        for proc in left:
            for pid in session_members(proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def wait_empty(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            for proc in left:
                proc.poll()  # reaps a leader that has exited
            left[:] = [proc for proc in left if session_members(proc.pid)]
            if not left or time.monotonic() > deadline:
                return not left
            time.sleep(0.1)

    for sig in (signal.SIGTERM, signal.SIGTERM) if graceful else ():
        signal_all(sig)
        if wait_empty(grace):
            break
    else:
        signal_all(signal.SIGKILL)
        wait_empty(grace)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)


class AirflowServices:
    """A real Airflow on loopback: ``api-server``, ``scheduler --skip-serve-logs`` and
    ``dag-processor``, each its own process in its own session, with LocalExecutor and SQLite.

    Not ``airflow standalone``: its log servers bind ``0.0.0.0``/``[::]`` on the fixed ports
    8793/8794, so two test runs on one machine collide. Here the API server takes a free
    loopback port and no log server is started (task logs are files under ``AIRFLOW_HOME``).

    Write the DAG files into ``dags_folder`` *before* :meth:`start`: the DAG processor only
    looks for new files every few minutes. Usage::

        with AirflowServices(sandbox, dags_folder, env={...}) as services:
            services.wait_for_dags(["my_dag"])
            run_id = services.trigger("my_dag", conf={"prefix": "/tmp/p"})
            state = services.wait_for_run("my_dag", run_id)
    """

    COMPONENTS = (
        ("api-server", ("api-server", "--host", "127.0.0.1")),
        ("scheduler", ("scheduler", "--skip-serve-logs")),
        ("dag-processor", ("dag-processor",)),
    )

    def __init__(
        self,
        sandbox: AirflowSandbox,
        dags_folder: str,
        *,
        env: Mapping[str, str] | None = None,
        parallelism: int = 8,
        triggerer: bool = False,
    ) -> None:
        """``triggerer``: also run ``airflow triggerer`` (deferred tasks: remote steps)."""
        self.sandbox = sandbox
        self.components = self.COMPONENTS + (
            (("triggerer", ("triggerer", "--skip-serve-logs")),) if triggerer else ()
        )
        self.dags_folder = os.path.abspath(dags_folder)
        self.port = free_port()
        self.log_dir = os.path.join(sandbox.root, "service-logs")
        self._extra = dict(env or {})
        self._parallelism = parallelism
        self._procs: dict[str, subprocess.Popen[Any]] = {}
        self._logs: list[Any] = []
        self._triggered = 0
        self._token: str | None = None
        # Components started one by one each invent a JWT secret unless they share one, and the
        # execution API then rejects the workers' tokens ("Signature verification failed").
        self._jwt_secret = secrets.token_hex(32)

    def env(self) -> dict[str, str]:
        url = f"http://127.0.0.1:{self.port}"
        return self.sandbox.env(
            self.dags_folder,
            {
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
                "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret,
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": str(self._parallelism),
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
                # An idle scheduler sleeps this long before it sees a task end or a new run
                # (default 1 s, paid once per task of a chain); idle, it costs ~8% of a core.
                "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
                # New DAG files are found within about a second (defaults: 300 s, checked
                # every 5 s).
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "1",
                "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
                **self._extra,
            },
        )

    def migrate(self) -> None:
        """Create the metadata database the components share (the sandbox's SQLite here)."""
        self.sandbox.migrate()

    def start(self) -> AirflowServices:
        self.migrate()
        os.makedirs(self.log_dir, exist_ok=True)
        for attempt in range(3):
            try:
                return self._start_components()
            except PortTakenError:
                if attempt == 2:
                    raise
                self.port = free_port()  # a port race with another process: choose again
        raise AssertionError("unreachable")

    def _start_components(self) -> AirflowServices:
        try:
            for name, _ in self.components:
                self._start_one(name)
            self._wait_for_api()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_one(self, name: str) -> None:
        """Start component ``name`` in a session of its own; its log is appended to."""
        args = dict(self.components)[name]
        log = open(os.path.join(self.log_dir, f"{name}.log"), "a")  # noqa: SIM115
        self._logs.append(log)
        argv = [sys.executable, "-m", "airflow", *args]
        if name == "api-server":
            argv += ["--port", str(self.port)]
        self._procs[name] = subprocess.Popen(
            argv,
            env=self.env(),
            cwd=self.sandbox.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, *names: str) -> None:
        """SIGKILL components and everything they started (the scheduler's LocalExecutor
        workers and their task processes: its session), as a crash would; ``restart`` them."""
        for name in names:
            proc = self._procs.pop(name)
            for pid in session_members(proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=30)
            deadline = time.monotonic() + 30
            while session_members(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def restart(self, *names: str) -> None:
        """Start killed components again, with the same environment."""
        for name in names:
            self._start_one(name)

    def _wait_for_api(self, timeout: float = 180) -> None:
        """Until the api-server answers its health check: tasks started before it would fail
        to reach the execution API."""
        import urllib.error
        import urllib.request

        url = f"http://127.0.0.1:{self.port}/api/v2/monitor/health"
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the api-server never answered {url}:\n{self.log_tail()}")
            time.sleep(0.5)

    def __enter__(self) -> AirflowServices:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Kill every component and everything it started, by session, all at once."""
        stop_sessions(list(self._procs.values()), graceful=False)
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def log_tail(self, chars: int = 4000) -> str:
        parts = []
        for name, _ in self.components:
            path = os.path.join(self.log_dir, f"{name}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    parts.append(f"--- {name}\n{f.read()[-chars:]}")
        return "\n".join(parts)

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                tail = self.log_tail()
                if name == "api-server" and "address already in use" in tail:
                    raise PortTakenError(f"port {self.port} was taken:\n{tail}")
                raise RuntimeError(f"airflow {name} exited {proc.returncode}:\n{tail}")

    def wait_for_dags(self, dag_ids: Sequence[str], timeout: float = 240) -> None:
        """Until the DAG processor has registered every DAG, unpaused."""
        deadline = time.monotonic() + timeout
        wanted = set(dag_ids)
        while True:
            self._check_alive()
            if wanted <= self.unpaused_dags():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the DAG processor never registered {sorted(wanted)}")
            time.sleep(0.1)

    def unpaused_dags(self) -> set[str]:
        """The DAG ids registered and unpaused so far (none while the database is busy)."""
        with contextlib.suppress(sqlite3.OperationalError):
            rows = self.sandbox.query("SELECT dag_id FROM dag WHERE is_paused = 0")
            return {str(r[0]) for r in rows}
        return set()

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        """A DAG run's state now (None while it is not visible yet)."""
        with contextlib.suppress(sqlite3.OperationalError):
            rows = self.sandbox.query(
                "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
            )
            return str(rows[0][0]) if rows and rows[0][0] is not None else None
        return None

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None) -> str:
        """Trigger a run with a run id of ours through the REST API; return the run id."""
        self._triggered += 1
        run_id = f"marin_test_{self._triggered}_{os.getpid()}_{time.time_ns()}"
        body = {"dag_run_id": run_id, "logical_date": None, "conf": dict(conf or {})}
        return str(self.rest("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"])

    def rest(self, method: str, path: str, body: Any = None) -> Any:
        """One call of the api-server's REST API as a user makes it (bearer token), as JSON.

        The harness runs the simple auth manager with every user an admin, so ``GET
        /auth/token`` hands out a token without credentials.
        """
        import json
        import urllib.request

        base = f"http://127.0.0.1:{self.port}"
        if self._token is None:
            with urllib.request.urlopen(f"{base}/auth/token", timeout=30) as response:
                self._token = str(json.load(response)["access_token"])
        request = urllib.request.Request(
            f"{base}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)

    trigger_rest = trigger

    def airflow(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """The ``airflow`` command against these services (their environment and folder)."""
        return subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env(),
            cwd=self.sandbox.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 300) -> str:
        """Until the run ends; return its final state (``success`` or ``failed``)."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} of {dag_id} did not finish:\n{self.log_tail()}")
            time.sleep(0.1)
