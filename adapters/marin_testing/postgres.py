"""A throw-away PostgreSQL server for tests: Debian's binaries, one temporary cluster, no TCP.

The Celery harness (:mod:`marin_testing.celery`) runs Airflow's metadata database on it,
as a deployment would (Airflow calls SQLite development-only). ``initdb`` makes a cluster in a
temporary directory of its own; ``postgres`` listens only on a Unix socket in that directory
(``listen_addresses=''``), so nothing else on the machine can reach it and two test runs never
collide on a port. :meth:`PostgresServer.stop` stops the server and removes the directory, also
when the start failed half-way.

PostgreSQL refuses to run as root, and CI runs as root: then ``initdb`` and ``postgres`` run as
the ``postgres`` system user (``setpriv``, which execs in place, so the server is the process
the harness started and signals) and the directory is handed to that user. Otherwise they run as
the current user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import IO

from marin_testing.airflow import stop_session

BIN_DIRS = ("/usr/lib/postgresql/*/bin",)
"""Where Debian installs the server binaries (``initdb`` and ``postgres`` are not on PATH)."""

INSTALL_HINT = "apt-get install -y postgresql"
SYSTEM_USER = "postgres"
"""The user Debian's package creates, which the server runs as when the harness is root."""

DATABASE = "airflow"

SETTINGS = {
    # Unix socket only: no port to race for, nothing reachable from outside the directory.
    "listen_addresses": "",
    # A test database is thrown away: durability costs seconds for nothing.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    # Every Airflow component and Celery worker keeps a pool of connections.
    "max_connections": "200",
}

_SOCKET_PATH_MAX = 107
"""``sun_path`` is 108 bytes on Linux, with its terminating NUL."""


class PostgresUnavailable(RuntimeError):
    """PostgreSQL's server binaries are not installed here (the reason a test may skip)."""


def find_bin_dir() -> str:
    """The newest Debian PostgreSQL ``bin`` directory that has ``initdb`` and ``postgres``."""
    found = []
    for pattern in BIN_DIRS:
        for path in glob.glob(pattern):
            if all(os.access(os.path.join(path, b), os.X_OK) for b in ("initdb", "postgres")):
                found.append(path)
    if not found:
        initdb = shutil.which("initdb")
        if initdb is not None and shutil.which("postgres") is not None:
            return os.path.dirname(initdb)
        raise PostgresUnavailable(f"PostgreSQL is not installed: {INSTALL_HINT}")

    def major(path: str) -> int:
        version = os.path.basename(os.path.dirname(path))
        return int(version) if version.isdigit() else 0

    return max(found, key=major)


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, listening on a Unix socket there.

    Usage::

        server = PostgresServer().start()
        try:
            url = server.sqlalchemy_url()  # postgresql+psycopg2://postgres@/airflow?host=...
        finally:
            server.stop()
    """

    def __init__(self, bin_dir: str | None = None) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.root = ""
        self.log_path = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._as_system_user = os.geteuid() == 0
        self.last_log = ""
        """The server's log as :meth:`stop` found it (its directory is removed)."""

    @property
    def data_dir(self) -> str:
        return os.path.join(self.root, "data")

    @property
    def socket_dir(self) -> str:
        return self.root

    def _bin(self, name: str) -> str:
        return os.path.join(self.bin_dir, name)

    def _as_owner(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as the cluster's owner: the ``postgres`` user when this process is root."""
        if not self._as_system_user:
            return list(argv)
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise PostgresUnavailable(
                "running as root needs setpriv (util-linux) to drop to postgres"
            )
        return [setpriv, f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups", *argv]

    def _run(self, argv: Sequence[str], what: str) -> None:
        proc = subprocess.run(
            self._as_owner(argv), capture_output=True, text=True, timeout=120, cwd=self.root
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{what} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")

    def start(self, timeout: float = 60) -> PostgresServer:
        """``initdb``, then ``postgres`` in a session of its own; until ``airflow`` exists."""
        if self._as_system_user:
            try:
                owner = pwd.getpwnam(SYSTEM_USER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root needs the {SYSTEM_USER} system user: {INSTALL_HINT}"
                ) from None
        # Not under pytest's tmp_path: its parents are private to root, and the socket path
        # must stay short (``<dir>/.s.PGSQL.5432``).
        self.root = tempfile.mkdtemp(prefix="marin-pg-")
        try:
            if len(os.path.join(self.root, ".s.PGSQL.5432")) > _SOCKET_PATH_MAX:
                raise RuntimeError(
                    f"the socket path under {self.root} is too long for a Unix socket: set "
                    "TMPDIR to a shorter directory"
                )
            if self._as_system_user:
                os.chown(self.root, owner.pw_uid, owner.pw_gid)
            initdb = [self._bin("initdb"), "-D", self.data_dir, "-U", "postgres"]
            initdb += ["--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"]
            self._run(initdb, "initdb")
            self.log_path = os.path.join(self.root, "postgres.log")
            log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
            self._log = log
            argv = [self._bin("postgres"), "-D", self.data_dir, "-k", self.socket_dir]
            for key, value in SETTINGS.items():
                argv += ["-c", f"{key}={value}"]
            self._proc = subprocess.Popen(
                self._as_owner(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.root,
            )
            self._wait_ready(timeout)
            self._run(
                [self._bin("createdb"), "-h", self.socket_dir, "-U", "postgres", DATABASE],
                "createdb",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        ping = [self._bin("pg_isready"), "-q", "-h", self.socket_dir, "-U", "postgres"]
        while subprocess.run(ping, capture_output=True, timeout=30).returncode != 0:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited {self._proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"postgres not ready after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def sqlalchemy_url(self, driver: str = "psycopg2") -> str:
        """The database's SQLAlchemy URL (libpq takes a socket directory as ``host``)."""
        return f"postgresql+{driver}://postgres@/{DATABASE}?host={self.socket_dir}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f"--- postgres\n{f.read()[-chars:]}"
        except OSError:
            return "--- postgres: no log"

    @property
    def pid(self) -> int:
        """The server's process id, which is also its session's id."""
        if self._proc is None:
            raise RuntimeError("postgres is not running")
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"postgres exited {self._proc.returncode}:\n{self.log_tail()}")

    def stop(self) -> None:
        """Fast shutdown (SIGINT: roll back, disconnect), then the session's stragglers; then the
        directory is removed. Safe to call twice, and after a failed start."""
        if self._proc is not None:
            if self._proc.poll() is None:
                os.kill(self._proc.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=15)
            stop_session(self._proc)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.root:
            with contextlib.suppress(OSError), open(self.log_path, errors="replace") as f:
                self.last_log = f.read()
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = ""
