"""Remote steps on a real single-node Ray cluster on loopback (``marin_testing.ray``)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin.execution.ids import new_id
from marin.execution.lazy import lower
from marin.execution.remote.protocol import job_owner
from marin.execution.remote.ray import outcome_line
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.step_folder import read_job
from tests.reliability import remote_pipelines
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
    _, env = setup(root, MARIN_TEST_BACKEND="ray", MARIN_TEST_FORGE=str(root / "forge"))
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
    from marin.execution.remote.protocol import JobSpec
    from marin.execution.remote.ray import RayBackend
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


# --- trust: the outcome comes from the job alone; another user's job is never touched ----------


def _forged(marker: Path) -> str:
    """Log text that looks like an outcome: the old marker form (a pickle that creates
    ``marker`` when loaded) after today's form under a nonce the driver never issued."""
    payload = pickle.dumps({"ok": True, "result": pickle.dumps(_Touch(str(marker)))})
    old = f"<<<marin-outcome>>>{base64.b64encode(payload).decode()}<<<end-marin-outcome>>>"
    planted = json.dumps({"ok": True, "result": {"planted": True}}).encode()
    return f"{outcome_line('0' * 32, planted)}\n{old}"


class _Touch:
    """Unpickling this runs ``touch PATH``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.path}",))


def test_a_killed_ray_job_whose_log_looks_like_an_outcome_is_never_built(
    cluster: tuple[Path, dict[str, str]],
) -> None:
    """``fn`` logs text holding outcome markers (old and new forms) and is then SIGKILLed (an
    OOM kill): the job is lost (Ray: FAILED, exit code -9), and with ``max_preemptions=0`` the
    step fails, nothing is committed and no pickle from the log is loaded (once: built, with
    that text's pickle run in the driver)."""
    tmp_path, controls = cluster
    (tmp_path / "gate").touch()
    marker, forge = tmp_path / "marker", tmp_path / "forge"
    forge.write_text(_forged(marker))
    try:
        prefix = str(tmp_path / "forged")
        env = {**controls, "MARIN_TEST_MAX_PREEMPTIONS": "0"}
        code = finish(marin_run("chain", prefix, env, tmp_path / "forged.err"))
    finally:
        forge.unlink()
    err = (tmp_path / "forged.err").read_text()
    assert code == 1, err[-3000:]
    assert "ray job marin-" in err and "Ray job FAILED" in err, err[-3000:]
    assert read_record(open_prefix(prefix), TRAIN) is None
    assert not marker.exists()


@pytest.mark.parametrize(
    "foreign", ["running, same config", "running, other config", "finished with markers"]
)
def test_a_planted_record_never_stops_or_collects_another_users_ray_job(
    cluster: tuple[Path, dict[str, str]], foreign: str
) -> None:
    """``job.json`` planted to name a job of another user on the shared cluster (a Marin id,
    submitted for another output): the run never reattaches to it, stops it or collects it; it
    builds the step with a job of its own, and the other job runs on."""
    from ray.job_submission import JobSubmissionClient

    tmp_path, controls = cluster
    (tmp_path / "gate").touch()
    client = JobSubmissionClient(controls["RAY_ADDRESS"])
    job_id = f"marin-{new_id()[:20]}"
    marker = tmp_path / f"marker-{job_id}"
    if foreign == "finished with markers":  # no Marin metadata at all (another tool's)
        text = _forged(marker).replace("'", "")
        client.submit_job(entrypoint=f"echo '{text}'", submission_id=job_id)
        wait_for_ray(client, job_id, "SUCCEEDED")
    else:
        theirs = job_owner("s3://bucket/users/bob/remote/train/v1", "bobs-build")
        client.submit_job(entrypoint="sleep 300", submission_id=job_id,
                          metadata={"marin_owner": theirs})  # fmt: skip
        wait_for_ray(client, job_id, "RUNNING")
    prefix = str(tmp_path / f"planted-{job_id}")
    meta = Path(prefix) / f"{TRAIN}.marin"
    meta.mkdir(parents=True)
    spec = lower(remote_pipelines._model)
    fingerprint = "another" if foreign == "running, other config" else spec.fingerprint
    planted = {"backend": "ray", "job_id": job_id, "build_id": "bobs-build",
               "submitted_at": "2026-01-01T00:00:00+00:00", "data": {},
               "fingerprint": fingerprint}  # fmt: skip
    (meta / "job.json").write_text(json.dumps(planted))
    try:
        code = finish(marin_run("chain", prefix, controls, tmp_path / f"{job_id}.err"))
        err = (tmp_path / f"{job_id}.err").read_text()
        assert code == 0, err[-3000:]
        record = read_record(open_prefix(prefix), TRAIN)
        assert record is not None and record.provenance["job"]["job_id"] != job_id
        assert isinstance(record.result, dict) and "pid" in record.result
        assert not marker.exists()
        expected = "SUCCEEDED" if foreign == "finished with markers" else "RUNNING"
        assert str(client.get_job_status(job_id)).endswith(expected)
    finally:
        with contextlib.suppress(RuntimeError):
            client.stop_job(job_id)


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> int:
    """The driver's return code; a driver still running after ``timeout`` is killed (its
    own process group) and fails the test."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"marin run still ran after {timeout:g}s") from None


def wait_for_ray(client: object, job_id: str, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not str(client.get_job_status(job_id)).endswith(state):  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"Ray job {job_id} never reached {state}"
        time.sleep(0.1)
