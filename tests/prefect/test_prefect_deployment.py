"""A real deployment end to end: `prefect server start`, a process work pool, `prefect deploy`
from the prefect.yaml that `marin export prefect` wrote, `run_deployment`, and a worker."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from marin_prefect.cli import register
from marin_testing.prefect import loopback_server
from tests.prefect.prefect_helpers import HERE, child_flow_runs, task_runs

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
POOL = "marin-e2e-pool"
SERVER_STARTUP_S = 90


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`prefect server start` on loopback with its own PREFECT_HOME; yields (api url, env)."""
    home = str(tmp_path / "prefect-home")
    with loopback_server(home, startup_timeout_s=SERVER_STARTUP_S) as (api_url, env):
        yield api_url, {**env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_deployment_runs_on_a_process_worker(
    prefect_server: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    api_url, env = prefect_server
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(HERE / "prefect_pipelines.py", project / "toy_pipeline.py")
    prefix = tmp_path / "artifacts"
    calls = tmp_path / "calls.txt"
    env = {**env, "MARIN_PREFECT_TEST_CALLS": str(calls)}

    # 1. The user's existing Prefect setup: a process work pool.
    _run([str(BIN / "prefect"), "work-pool", "create", POOL, "--type", "process"], env, project)

    # 2. `marin export prefect` writes the deployment entry into the project's prefect.yaml.
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "prefect",
            str(project / "toy_pipeline.py") + ":pipeline",
            "--name",
            "toy-e2e",
            "--work-pool",
            POOL,
            "--prefix",
            str(prefix),
            "--max-concurrent",
            "2",
            "-o",
            str(project / "prefect.yaml"),
        ]
    )
    assert args.func(args) == 0

    # 3. `prefect deploy`, the user's usual tool, reads it.
    _run(
        [
            str(BIN / "prefect"),
            "--no-prompt",
            "deploy",
            "--prefect-file",
            "prefect.yaml",
            "-n",
            "toy-e2e",
        ],
        env,
        project,
    )

    # 4. Trigger it with run_deployment (scheduled now; the worker below picks it up).
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        flow_run = run_deployment("marin-pipeline/toy-e2e", timeout=0)
        assert flow_run.parameters["target"] == "toy_pipeline.py:pipeline"

        # 5. A worker of the pool runs it in a subprocess.
        output = _run(
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--run-once"],
            env,
            project,
            timeout=180,
        )
        with get_client(sync_client=True) as client:
            finished = client.read_flow_run(flow_run.id)
        assert finished.state is not None and finished.state.is_completed(), (
            f"{finished.state!r}\n{output[-4000:]}"
        )
        children = child_flow_runs(flow_run.id)
        assert len(children) == 1
        runs = task_runs(children[0].id, expected=7)
        assert len(runs) == 7 and all(r.state.is_completed() for r in runs.values())

    # 6. The artifacts and records exist, built by the worker's process.
    report = prefix / "toy/report/v0"
    assert json.loads(report.read_text())["scores"]
    record = json.loads((prefix / "toy/report/v0.marin/record.json").read_text())
    assert record["name"] == "toy/report"
    assert len(calls.read_text().splitlines()) == 7

    # 7. A flow run whose step's task failed (after its build) ends Failed on a worker too.
    shutil.copy(HERE / "fault_pipeline.py", project / "fault_pipeline.py")
    args = parser.parse_args(
        ["prefect", str(project / "fault_pipeline.py") + ":pipeline", "--name", "fault-e2e", "--work-pool", POOL,
         "--prefix", str(tmp_path / "faulty"), "-o", str(project / "fault.yaml")]
    )  # fmt: skip
    assert args.func(args) == 0
    deploy = [str(BIN / "prefect"), "--no-prompt", "deploy", "--prefect-file", "fault.yaml"]
    _run([*deploy, "-n", "fault-e2e"], env, project)
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        flow_run = run_deployment("marin-pipeline/fault-e2e", timeout=0)
        worker = [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--run-once"]
        output = _run(worker, env, project, timeout=180)
        with get_client(sync_client=True) as client:
            finished = client.read_flow_run(flow_run.id)
        assert finished.state is not None and finished.state.is_failed(), (
            f"{finished.state!r}\n{output[-4000:]}"
        )
        (child,) = child_flow_runs(flow_run.id)
        assert child.state is not None and child.state.is_failed()
        assert "f/b@v1" in str(child.state.message)
