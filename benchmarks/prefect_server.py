"""A Prefect server for the ``prefect`` section, run as a deployment runs one.

``prefect server start`` on loopback, its database on PostgreSQL (a throw-away cluster on a Unix
socket: ``marin_airflow.postgres_testing``), the flows in the calling process talking to it over
``PREFECT_API_URL``. Prefect's test harness keeps its database in SQLite, and on it the timings
fall on levels about two seconds apart: while the server writes a finished flow's events, a
request finds the database locked, the server answers 503 and the client backs off for about
2 s (``2**1`` with jitter) before it asks again, at a flow run's creation, a task's first tag
slot request or the flow's final state, whichever the flow. Prefect's own documentation names
PostgreSQL for production servers; there no request finds the database locked.

The server's keep-alive is raised above the section's idle gaps, or the client's pooled
connection, closed by the server while the benchmark waits, fails its next request and backs
off the same two seconds.

Where PostgreSQL is not installed, the section falls back to the test harness and says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

STARTUP_TIMEOUT_S = 120.0
KEEP_ALIVE_S = 600
"""Longer than any idle gap the section waits, so no pooled connection is closed under it."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def prefect_server_on_postgres() -> Iterator[str]:
    """Start PostgreSQL and a Prefect server on it (its own ``PREFECT_HOME``); yield the API
    URL, which this process's environment then names; stop both.

    Raises ``PostgresUnavailable`` (before starting anything) where PostgreSQL is not installed.
    Call before ``import prefect``: Prefect reads ``PREFECT_API_URL`` at import time.
    """
    from marin_airflow.postgres_testing import PostgresServer

    database = PostgresServer().start()
    home = tempfile.mkdtemp(prefix="marin-bench-prefect-server-")
    log_path = os.path.join(home, "server.log")
    server: subprocess.Popen[bytes] | None = None
    try:
        port = _free_port()
        api_url = f"http://127.0.0.1:{port}/api"
        env = {
            **os.environ,
            "PREFECT_HOME": home,
            "PREFECT_API_URL": api_url,
            "PREFECT_API_DATABASE_CONNECTION_URL": database.sqlalchemy_url("asyncpg"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
        }
        prefect_cli = os.path.join(os.path.dirname(sys.executable), "prefect")
        argv = [prefect_cli, "server", "start", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--keep-alive-timeout", str(KEEP_ALIVE_S)]
        with open(log_path, "wb") as log:
            server = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _healthy(api_url):
            if server.poll() is not None or time.monotonic() > deadline:
                with open(log_path, errors="replace") as f:
                    raise RuntimeError(
                        f"prefect server not healthy on {api_url}:\n{f.read()[-3000:]}"
                    )
            time.sleep(0.2)
        os.environ["PREFECT_API_URL"] = api_url
        yield api_url
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        database.stop()
        shutil.rmtree(home, ignore_errors=True)
