"""One Prefect test harness per process, shared by every test that runs a flow.

``prefect.testing.utilities.prefect_test_harness`` starts a temporary API server on SQLite, which
costs about 12 s on 2 cores, so a test session starts it once. Prefect keeps cache records and
settings under ``PREFECT_HOME``; ``isolate_prefect_home()`` points it at a fresh directory and must
run before Prefect is imported, so that nothing leaks between sessions or into ``~/.prefect``.

Usage (a session-scoped pytest fixture)::

    from marin_testing.prefect import isolate_prefect_home, start_harness, stop_harness
    isolate_prefect_home()          # at conftest import time, before anything imports prefect
    start_harness()                 # idempotent; stop_harness() at session end

``loopback_server()`` instead runs ``prefect server start`` in a process of its own, as a
deployment does (the deployment tests, and the benchmark's server on PostgreSQL).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack

HARNESS_STARTUP_TIMEOUT_S = 120  # two test workers may start theirs at once

_lock = threading.Lock()
_stack: ExitStack | None = None
_isolated_home: str | None = None
_homes_made: list[str] = []
"""Every temporary Prefect home this process made; removed at exit, after the harness stops."""


def _make_home() -> str:
    home = tempfile.mkdtemp(prefix="marin-prefect-home-")
    if not _homes_made:
        # Registered before the harness's own exit hook, so it runs after it (atexit is LIFO):
        # the server has stopped writing into the home when it is removed.
        atexit.register(_remove_homes)
    _homes_made.append(home)
    return home


def _remove_homes() -> None:
    while _homes_made:
        shutil.rmtree(_homes_made.pop(), ignore_errors=True)


def isolate_prefect_home() -> str | None:
    """Point ``PREFECT_HOME``, the memo store and local result storage at a fresh temporary
    directory, and turn analytics off.

    Call it before the first ``import prefect``: Prefect reads its settings at import time.
    Idempotent within a process. If Prefect is already imported it returns None and changes
    nothing; ``start_harness()`` then isolates the home with temporary settings instead.
    """
    global _isolated_home
    with _lock:
        if _isolated_home is not None:
            return _isolated_home
        if "prefect" in sys.modules:
            return None
        _isolated_home = _make_home()
        os.environ["PREFECT_HOME"] = _isolated_home
        # PREFECT_HOME does not move these two: they default to ~/.prefect regardless.
        os.environ["PREFECT_SERVER_MEMO_STORE_PATH"] = os.path.join(
            _isolated_home, "memo_store.toml"
        )
        os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = os.path.join(_isolated_home, "storage")
        os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
        os.environ.setdefault(
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(HARNESS_STARTUP_TIMEOUT_S)
        )
        # A test session never talks to a configured server or Prefect Cloud.
        os.environ.pop("PREFECT_API_URL", None)
        os.environ.pop("PREFECT_API_KEY", None)
        os.environ.pop("PREFECT_PROFILES_PATH", None)
        return _isolated_home


def start_harness() -> None:
    """Enter ``prefect_test_harness`` once for this process (later calls do nothing)."""
    global _stack
    with _lock:
        if _stack is not None:
            return
    isolated = isolate_prefect_home() is not None
    from prefect.testing.utilities import prefect_test_harness

    with _lock:
        if _stack is not None:
            return
        stack = ExitStack()
        if not isolated:
            # Prefect was imported first, so the environment came too late: override the
            # settings that point into the home for as long as the harness runs.
            from prefect.settings import (
                PREFECT_HOME,
                PREFECT_RESULTS_LOCAL_STORAGE_PATH,
                PREFECT_SERVER_ANALYTICS_ENABLED,
                PREFECT_SERVER_MEMO_STORE_PATH,
                temporary_settings,
            )

            home = _make_home()
            stack.enter_context(
                temporary_settings(
                    updates={
                        PREFECT_HOME: home,
                        PREFECT_RESULTS_LOCAL_STORAGE_PATH: os.path.join(home, "storage"),
                        PREFECT_SERVER_MEMO_STORE_PATH: os.path.join(home, "memo_store.toml"),
                        PREFECT_SERVER_ANALYTICS_ENABLED: False,
                    }
                )
            )
        stack.enter_context(prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_TIMEOUT_S))
        _stack = stack
        atexit.register(_stop_at_exit)


def _stop_at_exit() -> None:
    # At interpreter exit pytest has closed the streams Prefect logs "stopping server" to.
    logging.raiseExceptions = False
    stop_harness()


def stop_harness() -> None:
    global _stack
    with _lock:
        stack, _stack = _stack, None
    if stack is not None:
        stack.close()


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
def loopback_server(
    home: str,
    *,
    database_url: str | None = None,
    keep_alive_s: int | None = None,
    startup_timeout_s: float = 90.0,
) -> Iterator[tuple[str, dict[str, str]]]:
    """``prefect server start`` on loopback, as a deployment runs it, with ``home`` as its
    ``PREFECT_HOME`` (its log is ``home/server.log``); yields the API URL and the environment
    that points a process at it; stops the server's whole session at exit.

    ``database_url`` (``PREFECT_API_DATABASE_CONNECTION_URL``) replaces the default SQLite
    database under ``home``; ``keep_alive_s`` the server's keep-alive timeout (5 s by default).
    """
    os.makedirs(home, exist_ok=True)
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": home,
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
    }
    if database_url is not None:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    prefect_cli = os.path.join(os.path.dirname(sys.executable), "prefect")
    argv = [prefect_cli, "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    if keep_alive_s is not None:
        argv += ["--keep-alive-timeout", str(keep_alive_s)]
    log_path = os.path.join(home, "server.log")
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not _healthy(api_url):
            if server.poll() is not None or time.monotonic() > deadline:
                with open(log_path, errors="replace") as f:
                    raise RuntimeError(
                        f"prefect server did not become healthy on {api_url}:\n{f.read()[-3000:]}"
                    )
            time.sleep(0.3)
        yield api_url, env
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
