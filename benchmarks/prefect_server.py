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
import tempfile
from collections.abc import Iterator

KEEP_ALIVE_S = 600
"""Longer than any idle gap the section waits, so no pooled connection is closed under it."""


@contextlib.contextmanager
def prefect_server_on_postgres() -> Iterator[str]:
    """Start PostgreSQL and a Prefect server on it (its own ``PREFECT_HOME``); yield the API
    URL, which this process's environment then names; stop both.

    Raises ``PostgresUnavailable`` (before starting anything) where PostgreSQL is not installed.
    Call before ``import prefect``: Prefect reads ``PREFECT_API_URL`` at import time.
    """
    from marin_airflow.postgres_testing import PostgresServer
    from marin_prefect.testing import loopback_server

    database = PostgresServer().start()
    home = tempfile.mkdtemp(prefix="marin-bench-prefect-server-")
    try:
        url = database.sqlalchemy_url("asyncpg")
        with loopback_server(home, database_url=url, keep_alive_s=KEEP_ALIVE_S) as (api_url, _):
            os.environ["PREFECT_API_URL"] = api_url
            yield api_url
    finally:
        database.stop()
        shutil.rmtree(home, ignore_errors=True)
