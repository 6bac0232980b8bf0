"""Two real ``marin run`` processes on one prefix: two concurrent ``--force`` of one step, and
the summary of a run that served a step another runner built."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from tests.reliability import pipelines
from tests.reliability.conftest import REPO, child_env
from tests.reliability.test_processes import calls_per_step

CLI = [sys.executable, "-m", "marin.cli", "run", "tests/reliability/pipelines.py:held"]


class Watched:
    """A ``marin run`` process whose stderr is read as it comes: ``saw(text)`` is an event set
    when a line containing ``text`` appears (no sleeping while waiting for it)."""

    def __init__(self, args: list[str], env: dict[str, str], text: str) -> None:
        self.proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.saw = threading.Event()
        self.err: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(text,), daemon=True)
        self._reader.start()

    def _read(self, text: str) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)
            if text in line:
                self.saw.set()

    def finish(self) -> tuple[int, str, str]:
        out, _ = self.proc.communicate(timeout=120)
        self._reader.join(30)
        return self.proc.returncode, out, "".join(self.err)


def test_two_concurrent_forced_runs_build_once_and_the_second_says_so(tmp_path: Path) -> None:
    prefix = str(tmp_path / "prefix")
    calls, started, release = tmp_path / "calls.log", tmp_path / "started", tmp_path / "release"
    env = child_env(MARIN_TEST_CALLS=str(calls), MARIN_TEST_SLEEP="0")
    first = subprocess.run([*CLI, "--prefix", prefix], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    forced = [*CLI, "--prefix", prefix, "--force", "held/one", "--no-progress"]
    holding = {**env, "MARIN_TEST_HOLD": f"held/one:{started}:{release}"}
    a = subprocess.Popen(forced, cwd=REPO, env=holding, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        pipelines.wait_for_file(str(started), timeout=60)  # A is inside fn, holding the lease
        b = Watched(forced, env, "wait held/one@v1: lease held by")
        assert b.saw.wait(60), "the second run never waited for the lease"
    finally:
        release.touch()
    a_out, a_err = a.communicate(timeout=120)
    assert a.returncode == 0, a_err[-3000:]
    code, b_out, b_err = b.finish()
    assert code == 0, b_err[-3000:]
    assert calls_per_step(calls)["held/one"] == 2, "the forced step was built twice"
    assert "built 1 step(s), skipped 0" in a_out
    assert "built 0 step(s), 1 built by another runner, skipped 0" in b_out, b_out
