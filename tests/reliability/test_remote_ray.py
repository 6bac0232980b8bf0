"""Remote steps on a real single-node Ray cluster on loopback (``marin_testing.ray``)."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin.execution.pipeline.remote.job_record import read_job
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.pipelines import wait_for_file
from tests.reliability.test_remote import (
    TRAIN,
    calls,
    marin_cli,
    marin_run,
    setup,
    wait_for_text,
)

pytest.importorskip("ray.job_submission")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """One Ray cluster for the module (it takes seconds to start), and the control files
    (under the returned folder) that its jobs see."""
    from marin_testing.ray import RayCluster

    root = tmp_path_factory.mktemp("ray")
    _, env = setup(root, MARIN_TEST_BACKEND="ray")
    with RayCluster(env) as ray:
        yield root, {**env, "RAY_ADDRESS": ray.address}


@pytest.fixture
def controls(cluster: tuple[Path, dict[str, str]]) -> dict[str, str]:
    return cluster[1]


def test_sigkilled_driver_reattaches_one_ray_job(cluster: tuple[Path, dict[str, str]]) -> None:
    """SIGKILL ``marin run`` while its Ray job runs: ``marin plan`` (text and ``--json``)
    shows the live job, the next run reattaches (fn ran once), ``marin show`` names the job."""
    tmp_path, controls = cluster
    prefix = str(tmp_path / "prefix")
    first = marin_run("chain", prefix, controls, tmp_path / "first.err")
    wait_for_file(str(tmp_path / "started" / "remote_train"), timeout=120)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    job = read_job(open_prefix(prefix), TRAIN)
    assert job is not None and job.backend == "ray"
    plan = marin_cli("plan", "chain", prefix, controls)
    assert re.search(rf"reattach: ray job {job.job_id}, running \d+[smh]", plan), plan
    shown = json.loads(marin_cli("plan", "chain", prefix, controls, "--json"))
    planned = next(s["job"] for s in shown["steps"] if s["step"] == "remote/train@v1")
    assert (planned["backend"], planned["job_id"], planned["state"]) == (
        "ray",
        job.job_id,
        "running",
    )
    from ray.job_submission import JobSubmissionClient

    with pytest.raises(RuntimeError):  # Ray itself refuses a second job of this build
        JobSubmissionClient(controls["RAY_ADDRESS"]).submit_job(
            entrypoint="true", submission_id=job.job_id
        )
    second = marin_run("chain", prefix, controls, tmp_path / "second.err")
    wait_for_text(tmp_path / "second.err", f"reattach remote/train@v1: ray job {job.job_id}")
    (tmp_path / "gate").touch()
    assert second.wait(timeout=120) == 0, (tmp_path / "second.err").read_text()
    assert len(calls(tmp_path)) == 1
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.provenance["job"]["job_id"] == job.job_id
    assert read_record(open_prefix(prefix), "remote/eval/v1") is not None
    assert f"job          ray job {job.job_id}" in marin_cli(
        "show", "", f"{prefix}/{TRAIN}", controls
    )


def test_ray_backend_cancel_stops_the_job(
    controls: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a lost lease calls: Ray's stop_job ends a running job (status ``stopped``)."""
    from marin.execution.pipeline.remote.protocol import JobSpec
    from marin.execution.pipeline.remote.ray import RayBackend
    from marin.execution.vocabulary import JobState

    monkeypatch.setenv("RAY_ADDRESS", controls["RAY_ADDRESS"])
    call = pickle.dumps({"sys_path": sys.path, "module_files": {}}) + pickle.dumps(
        {"target": time.sleep, "args": (120,), "kwargs": {}, "context": None}
    )
    backend = RayBackend()
    handle = backend.submit(JobSpec("t@v1", call), "marin-cancel-test")
    assert backend.submit(JobSpec("t@v1", call), "marin-cancel-test") == handle  # idempotent
    backend.cancel(handle)
    deadline = time.monotonic() + 60
    while backend.status(handle).state != JobState.STOPPED:
        assert time.monotonic() < deadline, backend.status(handle)
        time.sleep(0.2)
