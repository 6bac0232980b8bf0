"""Red team round 15, finding 2: a helper process an isolated ``fn`` started (a data loader)
outlived the killed driver and its isolated child, and wrote into the output a later run
committed. The child leads its own process group, and the kernel's signal that its runner
died ends that whole group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.reliability.conftest import REPO, child_env
from tests.reliability.pipelines import wait_for_file


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for this purpose
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_drivers_isolated_step_leaves_no_helper_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "helper.pid"
    env = child_env(MARIN_TEST_HELPER_PID=str(pid_file), MARIN_TEST_GATE=str(tmp_path / "gate"))
    driver = subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run",
         "tests/reliability/isolated_helper_pipeline.py:loader", "--prefix", str(tmp_path / "p")],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    helper = 0
    try:
        wait_for_file(str(pid_file), timeout=60)
        helper = int(pid_file.read_text().split()[0])
        assert _alive(helper)
        os.kill(driver.pid, signal.SIGKILL)  # the driver only: its child has its own session
        driver.wait()
        deadline = time.monotonic() + 30
        while _alive(helper):
            assert time.monotonic() < deadline, f"helper {helper} outlived its killed driver"
            time.sleep(0.02)
    finally:
        if helper and _alive(helper):
            os.kill(helper, signal.SIGKILL)
        (tmp_path / "gate").touch()
