"""A real single-node Ray cluster on loopback for tests: ``ray start --head --block``.

Free ports, its own ``--temp-dir`` (short: Ray's socket paths have a length limit), usage stats
off, the dashboard (which serves the Jobs API) on 127.0.0.1. Stopped by killing the ``--block``
process's session (never ``ray stop``, which stops every Ray cluster of this user on the
machine). Jobs run with the environment given here (``PATH`` decides their ``python``).

Usage::

    with RayCluster(env) as ray:
        os.environ["RAY_ADDRESS"] = ray.address   # http://127.0.0.1:<dashboard port>
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
from pathlib import Path
from types import TracebackType

from marin_testing.airflow import session_members

STARTUP_TIMEOUT_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``ray start --block`` and whatever it started in its session (Ray's workers
    and jobs have groups of their own there): a cluster a test throws away needs no shutdown,
    which took seconds."""
    while members := session_members(proc.pid):
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.2)
    proc.wait()


class RayCluster:
    """``ray start --head`` on loopback; see the module docstring."""

    def __init__(self, env: dict[str, str], num_cpus: int = 2, workers: int = 0) -> None:
        """``num_cpus`` of the head; ``workers``: that many more nodes of one CPU each (a
        cluster of several nodes on loopback: a gang's placement group spans them)."""
        self.num_cpus, self.workers = num_cpus, workers
        self._workers: list[subprocess.Popen[bytes]] = []
        self.env = {**env, "RAY_USAGE_STATS_ENABLED": "0", "RAY_raylet_start_wait_time_s": "120"}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        self.port, self.dashboard_port = _free_port(), _free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RayCluster:
        ray = str(Path(sys.executable).with_name("ray"))
        log = open(os.path.join(self.temp_dir, "start.log"), "wb")
        self._proc = subprocess.Popen(
            [ray, "start", "--head", "--block", f"--port={self.port}",
             "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
             f"--dashboard-port={self.dashboard_port}",
             f"--num-cpus={self.num_cpus}", "--disable-usage-stats", f"--temp-dir={self.temp_dir}",
             "--include-dashboard=true"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        try:
            self._wait_ready()
            for count in range(2, 2 + self.workers):  # one at a time: a busy GCS times out
                self._workers.append(self._start_worker(ray))
                self._wait_nodes(count)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_worker(self, ray: str) -> subprocess.Popen[bytes]:
        """One more node (its own raylet, on its own free ports), joined to the head."""
        ports = [f"--{name}={_free_port()}" for name in (
            "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port",
        )]  # fmt: skip
        with open(os.path.join(self.temp_dir, f"worker-{len(self._workers)}.log"), "wb") as log:
            return subprocess.Popen(
                [ray, "start", "--block", f"--address=127.0.0.1:{self.port}",
                 "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
                 f"--temp-dir={self.temp_dir}", *ports],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def _wait_nodes(self, count: int) -> None:
        """Until the dashboard lists ``count`` live nodes."""
        import json

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        url = f"{self.address}/nodes?view=summary"
        while True:
            with contextlib.suppress(OSError, ValueError, KeyError):
                with urllib.request.urlopen(url, timeout=5) as answer:
                    found = json.loads(answer.read())["data"]["summary"]
                alive = [n for n in found if n.get("raylet", {}).get("state") == "ALIVE"]
                if len(alive) >= count:
                    return
            if time.monotonic() > deadline or self._workers[-1].poll() is not None:
                logs = Path(self.temp_dir).glob("worker-*.log")
                raise TimeoutError(
                    f"{count} Ray nodes never came up: "
                    + "\n".join(log.read_text()[-2000:] for log in logs)
                )
            time.sleep(0.5)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"ray start exited: {self.start_log()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.address}/api/version", timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray's dashboard never answered: {self.start_log()}")
            time.sleep(0.2)

    def start_log(self) -> str:
        with contextlib.suppress(OSError):
            return Path(self.temp_dir, "start.log").read_text()[-3000:]
        return ""

    def stop(self) -> None:
        for proc in [*self._workers, *([self._proc] if self._proc is not None else [])]:
            _kill_session(proc)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
