"""A real single-node Ray cluster on loopback for tests: ``ray start --head --block``.

Free ports, its own ``--temp-dir`` (short: Ray's socket paths have a length limit), usage stats
off, the dashboard (which serves the Jobs API) on 127.0.0.1. Stopped by ending the ``--block``
process's own process group (never ``ray stop``, which stops every Ray cluster of this user on
the machine). Jobs run with the environment given here (``PATH`` decides their ``python``).

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

STARTUP_TIMEOUT_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` (``/proc/PID/stat`` field 6): only what it started."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            if int(fields[3]) == sid:
                found.append(int(entry))
    return found


class RayCluster:
    """``ray start --head`` on loopback; see the module docstring."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = {**env, "RAY_USAGE_STATS_ENABLED": "0"}
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
             "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={self.temp_dir}",
             "--include-dashboard=true"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

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
        proc = self._proc
        if proc is not None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            # Ray's workers have groups of their own, in the session ``ray start`` began.
            for pid in _session_members(proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
