"""A real Dask cluster on loopback for tests: ``dask scheduler`` and ``dask worker`` processes.

Each worker is set up as its own machine would be: its own working directory, ``HOME`` and
``TMPDIR``, its own process group (``kill_worker`` SIGKILLs the whole group, as a lost machine),
and only the environment a test hands it (the object store's endpoint, the Prefect API). Workers
are named, and may declare resources (``{"GPU": 1}``), so tests can check placement.

Usage::

    with DaskCluster(tmp_path, env) as cluster:
        cluster.add_worker("cpu")
        cluster.add_worker("gpu", resources={"GPU": 1})
        cluster.wait_for_workers(2)
        flow = to_prefect_flow(target, task_runner=DaskTaskRunner(address=cluster.address))
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO

STARTUP_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dask_cli() -> str:
    """The ``dask`` command of this interpreter's environment."""
    return str(Path(sys.executable).with_name("dask"))


class DaskCluster:
    """A ``dask scheduler`` and named ``dask worker`` processes under ``root`` (see the module
    docstring); every process is ended on exit, worker process groups included."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = dict(env)
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self._scheduler: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []

    def __enter__(self) -> DaskCluster:
        self._scheduler = self._start(
            "scheduler",
            [_dask_cli(), "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
             "--no-dashboard"],
        )  # fmt: skip
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if self._scheduler.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"dask scheduler did not start: see {self.log('scheduler')}")
            time.sleep(0.05)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def log(self, name: str) -> Path:
        return self.root / name / "log.txt"

    def add_worker(self, name: str, resources: dict[str, float] | None = None) -> int:
        """Start a one-process worker named ``name`` (2 threads); returns its process id."""
        args = [_dask_cli(), "worker", self.address, "--name", name, "--nworkers", "1",
                "--nthreads", "2", "--no-dashboard", "--no-nanny"]  # fmt: skip
        if resources:
            args += ["--resources", ",".join(f"{k}={v:g}" for k, v in sorted(resources.items()))]
        proc = self._start(name, args, MARIN_TEST_WORKER=name)
        self.workers[name] = proc
        return proc.pid

    def wait_for_workers(self, count: int) -> None:
        """Block until the scheduler has ``count`` workers (asked over its own protocol)."""
        from distributed import Client

        with Client(self.address, timeout=STARTUP_TIMEOUT_S) as client:
            client.wait_for_workers(count, timeout=STARTUP_TIMEOUT_S)

    def worker_addresses(self) -> dict[str, str]:
        """Each live worker's address as the scheduler knows it, by worker name."""
        from distributed import Client

        with Client(self.address, timeout=STARTUP_TIMEOUT_S) as client:
            workers = client.scheduler_info(n_workers=-1)["workers"]
        return {str(info["name"]): str(address) for address, info in workers.items()}

    def kill_worker(self, name: str) -> None:
        """SIGKILL the worker's whole process group, as a machine that is lost."""
        proc = self.workers[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        """Kill the scheduler and every worker (a cluster a test throws away needs no
        shutdown: a worker's own took seconds)."""
        for proc in [*self.workers.values(), *([self._scheduler] if self._scheduler else [])]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def _start(self, name: str, args: list[str], **extra: str) -> subprocess.Popen[bytes]:
        home = self.root / name
        for sub in ("home", "tmp"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        env = {
            **self.env,
            "HOME": str(home / "home"),
            "TMPDIR": str(home / "tmp"),
            "PREFECT_HOME": str(home / "home" / ".prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            **extra,
        }
        log = open(self.log(name), "wb")  # noqa: SIM115 (closed in close())
        self._logs.append(log)
        return subprocess.Popen(
            args, cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
