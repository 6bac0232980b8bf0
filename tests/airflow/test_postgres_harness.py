"""The PostgreSQL server the Celery harness runs Airflow's metadata database on.

A real ``initdb`` and ``postgres`` (Debian's binaries): reached only on the Unix socket in its
own temporary directory, as the ``postgres`` user when the tests run as root, and gone (process
and directory) after ``stop()``, also when the start fails half-way.
"""

from __future__ import annotations

import os
import pwd
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _server_class() -> Any:
    from marin_testing.postgres import PostgresServer, PostgresUnavailable, find_bin_dir

    try:  # allowed to be missing outside CI only (tests/skip_policy.py)
        find_bin_dir()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    return PostgresServer


def _uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("Uid:"))
    return int(line.split()[1])


def test_a_server_on_its_own_socket_is_gone_after_stop() -> None:
    pytest.importorskip("psycopg2", reason="pip install -e '.[celery]'")
    import psycopg2

    from marin_testing.airflow import session_members

    server = _server_class()().start()
    root, pid = server.root, server.pid
    try:
        assert server.sqlalchemy_url() == f"postgresql+psycopg2://postgres@/airflow?host={root}"
        with psycopg2.connect(host=root, user="postgres", dbname="airflow") as db:
            cursor = db.cursor()
            cursor.execute("SHOW listen_addresses")
            assert cursor.fetchone() == ("",)  # no TCP port at all
            cursor.execute("SELECT current_database()")
            assert cursor.fetchone() == ("airflow",)
        if os.geteuid() == 0:  # PostgreSQL refuses root: it runs as the postgres user
            assert _uid_of(pid) == pwd.getpwnam("postgres").pw_uid
        else:
            assert _uid_of(pid) == os.geteuid()
    finally:
        server.stop()
    assert not os.path.exists(root)
    assert session_members(pid) == []
    assert "database system is ready to accept connections" in server.last_log  # kept
    server.stop()  # twice is harmless


def test_a_start_that_fails_half_way_leaves_nothing_behind() -> None:
    from marin_testing.airflow import session_members

    started: dict[str, Any] = {}

    class FailsOnceRunning(_server_class()):  # type: ignore[misc]  # a class made at run time
        """The real server; the fault: the database creation after it is up fails."""

        def _run(self, argv: Any, what: str) -> None:
            if what == "createdb":
                started.update(root=self.root, pid=self.pid, alive=self.alive())
                raise RuntimeError("createdb failed (injected)")
            super()._run(argv, what)

    server = FailsOnceRunning()
    with pytest.raises(RuntimeError, match="injected"):
        server.start()
    assert started["alive"], "the fault was injected before the server ran"
    assert not os.path.exists(started["root"])
    assert session_members(started["pid"]) == []
    assert server.root == "" and not server.alive()
