"""A Prefect server for the ``prefect`` section, run as a deployment runs one.

``prefect server start`` on loopback, its database on PostgreSQL (a throw-away cluster on a Unix
socket: ``marin_testing.postgres``), the flows in the calling process talking to it over
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

The section's flows also run without the flow-run heartbeat (``without_flow_heartbeat``): its
thread sleeps in whole seconds and a flow's end joins it, which rounds a run's wall time up by
as much as a second. Users keep their heartbeat.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

KEEP_ALIVE_S = 600
"""Longer than any idle gap the section waits, so no pooled connection is closed under it."""


@contextlib.contextmanager
def prefect_server_on_postgres() -> Iterator[str]:
    """Start PostgreSQL and a Prefect server on it (its own ``PREFECT_HOME``); yield the API
    URL, which this process's environment then names; stop both.

    Raises ``PostgresUnavailable`` (before starting anything) where PostgreSQL is not installed.
    Call before ``import prefect``: Prefect reads ``PREFECT_API_URL`` at import time.
    """
    from marin_testing.postgres import PostgresServer
    from marin_testing.prefect import loopback_server

    database = PostgresServer().start()
    home = tempfile.mkdtemp(prefix="marin-bench-prefect-server-")
    try:
        url = database.sqlalchemy_url("asyncpg")
        with loopback_server(home, database_url=url, keep_alive_s=KEEP_ALIVE_S) as (api_url, _):
            os.environ["PREFECT_API_URL"] = api_url
            try:
                yield api_url
            finally:
                _drain_prefect_workers()
    finally:
        database.stop()
        shutil.rmtree(home, ignore_errors=True)


def _drain_prefect_workers() -> None:
    """Send what this process's Prefect log and event workers still hold while the server is
    up: at exit they would send it to a stopped server and print connection errors."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=5)


@contextlib.contextmanager
def section_server() -> Iterator[str]:
    """The ``prefect`` section's server for as long as the block runs: on PostgreSQL, or
    Prefect's SQLite test harness where PostgreSQL is not installed; yields which database
    (``"postgresql"`` or ``"sqlite"``). Call after ``isolate_prefect_home()`` and before
    ``import prefect``."""
    from marin_testing.postgres import PostgresUnavailable
    from marin_testing.prefect import start_harness

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(prefect_server_on_postgres())
            database = "postgresql"
        except PostgresUnavailable:
            start_harness()  # SQLite: its 503 back-offs land in the times
            database = "sqlite"
        yield database


def without_flow_heartbeat() -> Any:
    """Prefect settings with no flow-run heartbeat, for every flow the section times alike."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
