"""Watching and steering a Ray job from the command line (issue 55), on a real single-node Ray
cluster on loopback (``marin_testing.ray``): the job's output streams into the step's log and
the terminal while it runs (``tail_job_logs``), ``marin logs [-f]`` and ``show`` read it (by
lines: a huge one cut), and ``marin cancel`` stops it through Ray."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.step_folder import read_job
from tests.reliability.conftest import REPO
from tests.reliability.test_remote import wait_for_text
from tests.reliability.test_watch import (
    PIPELINE,
    TRAIN,
    env_for,
    marin,
    out,
    spawn,
    start,
    step_log,
)

pytest.importorskip("ray.job_submission")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A Ray cluster for the module; its jobs see ``<root>/gate`` (``env_for``)."""
    from marin_testing.ray import RayCluster

    root = tmp_path_factory.mktemp("watch-ray")
    env = env_for(root, MARIN_TEST_BACKEND="ray")
    with RayCluster(env) as ray:
        yield root, {**env, "RAY_ADDRESS": ray.address}


def test_a_ray_jobs_output_streams_and_the_job_is_followed_and_cancelled(
    ray_env: tuple[Path, dict[str, str]],
) -> None:
    root, env = ray_env
    prefix, err = root / "p", root / "run.err"
    driver = start(env, prefix, err)
    follow = None
    try:
        wait_for_text(out(err), f"{TRAIN} | tick 0", timeout=120)  # while the job runs
        wait_for_text(out(err), f"{TRAIN} | colour \\x1b[31mred\\x1b[0m and a bell \\x07")
        wait_for_text(step_log(prefix), "tick 1")
        job = read_job(open_prefix(str(prefix)), "watch/train/v1")
        assert job is not None and job.backend == "ray"
        shown = marin(env, "show", TRAIN, "--prefix", str(prefix)).stdout
        assert f"ray job {job.job_id}, running" in shown, shown
        assert f"ray job logs {job.job_id} --address {env['RAY_ADDRESS']}" in shown, shown
        logs = marin(env, "logs", TRAIN, "--prefix", str(prefix), "-n", "5")
        assert re.search(r"^tick \d+$", logs.stdout, re.M) and "<<<marin" not in logs.stdout
        follow = subprocess.Popen(
            [sys.executable, "-m", "marin.cli", "logs", TRAIN, "--prefix", str(prefix), "-f"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert follow.stdout is not None
        first = [follow.stdout.readline() for _ in range(3)]  # Ray's own line comes first
        assert "tick 0\n" in first, first
        done = marin(env, "cancel", TRAIN, "--prefix", str(prefix), timeout=90)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"cancelled {TRAIN}: stopped ray job {job.job_id}")
        assert driver.wait(timeout=90) == 1
        rest, end = follow.communicate(timeout=60)
        assert follow.returncode == 0 and "ended (stopped)" in end, end
        assert re.search(r"^tick \d+$", rest, re.M), rest
    finally:
        (root / "gate").touch()
        driver.kill()
        if follow is not None:
            follow.kill()
    assert f"ray job {job.job_id} was stopped" in err.read_text()
    text = step_log(prefix).read_text()
    assert text.count("tick 0\n") == 1 and "<<<marin-outcome" not in text, text


def test_the_live_display_names_a_running_ray_job_and_its_last_line(
    ray_env: tuple[Path, dict[str, str]],
) -> None:
    """Issue 55.1 on Ray, on a terminal: the live display shows the job id, its state and its
    last line while it runs (as ``test_watch.py`` checks on ``local``)."""
    root, env = ray_env
    (root / "gate").unlink(missing_ok=True)  # the first test leaves it open
    child = spawn(env, "run", PIPELINE, "--prefix", str(root / "live"))
    try:
        child.expect(r"ray job marin-[0-9a-f]{20} running: tick \d+", timeout=180)
        (root / "gate").touch()
        child.expect(re.escape(f"{TRAIN} | done ticking"), timeout=120)
        child.expect(pexpect.EOF, timeout=120)
    finally:
        (root / "gate").touch()
        child.close()
    assert child.exitstatus == 0, child.before


def test_logs_of_a_running_ray_job_show_the_lines_around_a_huge_one(
    ray_env: tuple[Path, dict[str, str]],
) -> None:
    """``marin logs -n 3`` of a running Ray job whose last lines are a line, a 3 MB line and a
    line shows all three, the long one cut (``... (N bytes)``), as on ``local``."""
    from marin.execution.remote.log_tail import LINE_CAP

    root, env = ray_env
    (root / "gate").unlink(missing_ok=True)  # the tests before leave it open
    prefix, err, step = root / "long", root / "long.err", "watch/long@v1"
    driver = start(env, prefix, err, target=PIPELINE.replace(":pipeline", ":long_line"))
    try:
        wait_for_text(out(err), f"{step} | after the long line", timeout=180)
        logs = marin(env, "logs", step, "--prefix", str(prefix), "-n", "3")
        assert driver.poll() is None and "running" in logs.stderr, logs.stderr
        assert logs.stdout.splitlines() == [
            "before the long line",
            "x" * LINE_CAP + " ... (3000000 bytes)",
            "after the long line",
        ], logs.stdout[:300]
    finally:
        (root / "gate").touch()
    assert driver.wait(timeout=120) == 0, err.read_text()[-2000:]
