"""Resumable steps as ``local`` remote jobs: a killed driver and job resume from the job's
checkpoints, and a displaced job is fenced off the new holder's (docs/remote.md, "Resumable
remote steps")."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest

from marin.execution.builder.attempt import start_attempt
from marin.execution.digest.code import code_digest
from marin.execution.errors import RemoteJobError
from marin.execution.ids import new_id
from marin.execution.lazy import lower
from marin.execution.pipeline.context import StepContext
from marin.execution.pipeline.isolation import call_payload
from marin.execution.pipeline.provenance import now_iso
from marin.execution.remote import fence
from marin.execution.remote.fence import JobCheck, UnseenJobError, fence_previous, stop_job
from marin.execution.remote.local import LocalBackend
from marin.execution.remote.protocol import JobHandle, JobSpec, job_owner
from marin.execution.store.lease import Lease
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.step_folder import (
    Attempt,
    JobRecord,
    attempt_path,
    create_job,
    delete_job,
    read_attempt_record,
    read_job,
)
from marin.execution.vocabulary import JobState, Leftover
from tests.reliability.conftest import child_env
from tests.reliability.pipelines import wait_for_file
from tests.reliability.resumable_pipeline import counting_step
from tests.reliability.test_resumable import finish, iterations, runner, wait_gone

COUNT = "count/v1"


def wait_for_attempt(prefix: str, number: int, job_id: str = "", timeout: float = 30) -> None:
    """Until ``attempt.json`` is attempt ``number`` (running in job ``job_id``, if given)."""
    location, deadline = open_prefix(prefix), time.monotonic() + timeout
    while True:
        attempt = read_attempt_record(location, COUNT)
        job = attempt.job.job_id if attempt is not None and attempt.job else ""
        if attempt is not None and attempt.number == number and job_id in ("", job):
            return
        assert time.monotonic() < deadline, f"attempt {number} never ran in {job_id}: {attempt}"
        time.sleep(0.02)


def first_job(prefix: str) -> str:
    attempt = read_attempt_record(open_prefix(prefix), COUNT)
    assert attempt is not None and attempt.job is not None, attempt
    return attempt.job.job_id


def test_killed_driver_and_job_resume_from_the_jobs_checkpoint(tmp_path: Path) -> None:
    """The job holds at iteration 55; its driver and its process group are SIGKILLed; the next
    run fences the dead job, keeps its output (the checkpoints live there, as Levanter's do)
    and a new job counts on from 50: 106 iterations, not 156, one record."""
    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    started, never = tmp_path / "started", tmp_path / "never"
    base = child_env(MARIN_TEST_COUNTER=str(counter), MARIN_REMOTE_POLL_MAX_S="0.2")
    driver = runner(
        prefix, {**base, "MARIN_TEST_HOLD_AT": f"55:{started}:{never}"}, "out", "remote"
    )
    wait_for_file(str(started), timeout=60)
    job_pid = int(started.read_text())
    driver.kill()
    os.killpg(job_pid, signal.SIGKILL)  # the job's own session: its whole group
    finish(driver)
    wait_gone(job_pid)
    assert iterations(counter) == list(range(55))
    code, out, err = finish(runner(prefix, base, "out", "remote"))
    assert code == 0, err[-3000:]
    assert iterations(counter) == list(range(55)) + list(range(50, 101))
    assert "resume count@v1: partial output from attempt 1" in err, err[-3000:]
    assert "resubmit count@v1: local job" in err  # the dead job was not reattached
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"attempt": {"number": 2, "resumed": True}, "result": {"started_at": 50}}
    record = read_record(open_prefix(prefix), COUNT)
    assert record is not None and record.provenance["job"]["job_id"] in err
    assert not os.path.exists(f"{prefix}/{COUNT}.marin/attempt.json")


def test_a_reattached_job_still_holds_its_build(tmp_path: Path) -> None:
    """Only the driver is SIGKILLed: the next driver takes the lease over under a token of its
    own and reattaches; the job's still_holds_lease() stays True (job.json names its build),
    so it publishes on and finishes: 101 iterations, one job."""
    prefix, counter = str(tmp_path / "prefix"), tmp_path / "counter"
    started, release = tmp_path / "started", tmp_path / "release"
    base = child_env(
        MARIN_TEST_COUNTER=str(counter),
        MARIN_TEST_HOLD_AT=f"55:{started}:{release}",
        MARIN_REMOTE_POLL_MAX_S="0.2",
    )
    driver = runner(prefix, base, "out", "remote")
    wait_for_file(str(started), timeout=60)
    driver.kill()
    finish(driver)
    second = runner(prefix, base, "out", "remote")
    wait_for_attempt(prefix, 2)  # the lease is the second driver's now
    release.touch()
    code, out, err = finish(second)
    assert code == 0, err[-3000:]
    assert iterations(counter) == list(range(101))
    assert json.loads(out.strip().splitlines()[-1])["result"] == {"started_at": 0}
    assert "reattach count@v1: local job" in err and "submit count@v1" not in err


def test_displaced_job_is_cancelled_before_the_new_job_resumes(tmp_path: Path) -> None:
    """A's heartbeat pauses while its job J1 holds at 35; B takes the lease over and reattaches
    to J1 (a running job is reattached, not resumed). A wakes, finds its lease lost and cancels
    J1; B fences J1 (confirmed ended) and submits J2, which resumes from 30 and holds at 65.
    J1 never publishes after the takeover, J2's checkpoint is intact, B commits once."""
    prefix, published = str(tmp_path / "prefix"), tmp_path / "published"
    a_started, a_release, wake = tmp_path / "a-started", tmp_path / "a-release", tmp_path / "wake"
    b_started, b_release = tmp_path / "b-started", tmp_path / "b-release"
    base = child_env(
        MARIN_TEST_PUBLISHED=str(published), MARIN_LEASE_TTL="2", MARIN_REMOTE_POLL_MAX_S="0.2"
    )
    a = runner(
        prefix,
        {**base, "MARIN_FAULT_PAUSE_HEARTBEAT": f"until:{wake}",
         "MARIN_TEST_HOLD_AT": f"35:{a_started}:{a_release}"},
        "ckpt", "remote",
    )  # fmt: skip
    wait_for_file(str(a_started), timeout=60)
    j1_pid, j1 = int(a_started.read_text()), first_job(prefix)
    # J2 inherits B's environment: it holds at 65 (J1, holding at 35, would never get there).
    b = runner(prefix, {**base, "MARIN_TEST_HOLD_AT": f"65:{b_started}:{b_release}"}, "ckpt",
               "remote")  # fmt: skip
    try:
        wait_for_attempt(prefix, 2, j1)  # B took over and reattached to J1
        wake.touch()  # A's heartbeat finds the lease lost: A cancels J1
        wait_for_file(str(b_started), timeout=60)
    except (AssertionError, TimeoutError):
        for proc in (a, b):
            proc.kill()
        raise AssertionError(f"A:\n{finish(a)[2][-3000:]}\nB:\n{finish(b)[2][-3000:]}") from None
    wait_gone(j1_pid)
    a_release.touch()  # a live J1 would publish 40 now, over J2's 60
    checkpoint = tmp_path / f"prefix/{COUNT}.marin/checkpoints/state.json"
    assert json.loads(checkpoint.read_text())["next"] == 60  # J2's, intact
    b_release.touch()
    code_b, out_b, err_b = finish(b)
    code_a, _, err_a = finish(a)
    assert code_b == 0, err_b[-3000:]
    assert code_a == 0 and "skip count@v1: built by another runner" in err_a, err_a[-3000:]
    assert f"reattach count@v1: local job {j1}" in err_b
    assert "lost the lease while local job" in err_a, err_a[-3000:]
    lines = [line.split() for line in published.read_text().splitlines()]
    assert [int(n) for pid, n in lines if int(pid) == j1_pid] == [10, 20, 30], lines
    report = json.loads(out_b.strip().splitlines()[-1])
    assert report == {"attempt": {"number": 2, "resumed": True}, "result": {"started_at": 30}}
    record = read_record(open_prefix(prefix), COUNT)
    assert record is not None and record.provenance["job"]["job_id"] != j1


# --- the fence, in one process, on real local jobs ---------------------------------------------


def block(ctx: StepContext) -> None:
    """A job that runs until it is killed (it waits for a file nobody writes)."""
    wait_for_file(os.environ["MARIN_TEST_NEVER"], timeout=300)


def start_job(tmp_path: Path, output: str) -> JobRecord:
    """A real local job of build ``build-1`` of the step whose full output path is ``output``."""
    ctx = StepContext(str(tmp_path), str(tmp_path), None, runtime_args={})
    call = call_payload(block, ctx, "count@v1", "remote")
    env = {"MARIN_TEST_NEVER": str(tmp_path / "never")}
    key = f"marin-{new_id()[:20]}"
    owner = job_owner(output, "build-1")
    LocalBackend().submit(JobSpec("count@v1", call, env=env, owner=owner), key)
    return JobRecord("local", key, "build-1", now_iso(), {})


class CancelIgnored(LocalBackend):
    """The real local backend, whose cancel is lost (a fault): the job runs on."""

    def cancel(self, handle: JobHandle) -> None:
        pass


def test_the_fence_cancels_only_this_steps_job_that_no_record_reattaches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = open_prefix(str(tmp_path / "prefix"))
    spec = lower(counting_step("ckpt", remote="local"), memo={})
    job = start_job(tmp_path, location.path(spec.output_path))
    backend = LocalBackend()
    try:
        assert backend.status(job.handle).state == JobState.RUNNING
        code = spec.code or code_digest(spec.run)
        previous = Attempt(1, spec.fingerprint, code, now_iso(), "a-holder", job=job)
        assert Attempt.parse(previous.to_json()) == previous
        create_job(location, spec.output_path, job)
        check = JobCheck(location, spec.output_path, "build-1")
        assert check() and not JobCheck(location, spec.output_path, "build-2")()
        fence_previous(location, spec, previous)  # job.json names it, and it runs: reattached
        assert backend.status(job.handle).state == JobState.RUNNING
        stranger = dataclasses.replace(job, build_id="build-2")  # its job vouches for build-1
        delete_job(location, spec.output_path)
        assert not check()  # the job's still_holds_lease() says False once the record is gone
        # A record naming another build of a job that writes this output (edited by hand):
        # the build stops, the job is never touched (red-team round 1, finding 9).
        with pytest.raises(UnseenJobError, match="it writes this output for build build-1"):
            fence_previous(location, spec, dataclasses.replace(previous, job=stranger))
        assert backend.status(job.handle).state == JobState.RUNNING  # never another's job
        monkeypatch.setattr(fence, "STOP_WAIT_S", 0.3)
        with pytest.raises(RemoteJobError, match="still runs 0.3s after it was cancelled") as err:
            stop_job(CancelIgnored(), job, spec.step_id)
        assert err.value.step == spec.step_id
        fence_previous(location, spec, previous)  # only the attempt record names it: cancelled
        assert backend.status(job.handle).state == JobState.STOPPED
    finally:
        backend.cancel(job.handle)  # a failed check leaves no job behind


def test_a_cleared_attempt_cancels_its_job_and_submits_anew(tmp_path: Path) -> None:
    """Under ``--on-code-drift rebuild`` a partial output of other code is cleared: its job,
    though ``job.json`` names it and it runs, is cancelled and forgotten, never reattached."""
    location = open_prefix(str(tmp_path / "prefix"))
    spec = lower(counting_step("ckpt", remote="local"), memo={})
    job = start_job(tmp_path, location.path(spec.output_path))
    backend = LocalBackend()
    try:
        other_code = code_digest(block)  # the partial output was written by other code
        previous = Attempt(1, spec.fingerprint, other_code, now_iso(), "a-holder", job=job)
        create_job(location, spec.output_path, job)  # (it makes the metadata folder)
        location.put_file(location.path(attempt_path(spec.output_path)), previous.to_json())
        lease = Lease(location, spec.output_path, ttl=60)
        assert lease.try_acquire() is None
        try:
            attempt = start_attempt(location, spec, lease, Leftover.DEBRIS, "rebuild")
        finally:
            lease.release()
        assert attempt is not None and not attempt.resumed
        assert backend.status(job.handle).state == JobState.STOPPED
        assert read_job(location, spec.output_path) is None  # the next submit is a new job
    finally:
        backend.cancel(job.handle)
