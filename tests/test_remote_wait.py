"""Issue 45 item 4: waiting remote jobs cost no thread each in the local runner.

The jobs here run on ``timer``, a small backend registered for this test: its "job" is a real
timer recorded on disk (``<folder>/<job id>.json`` holds when it was submitted; it runs until at
least ``SECONDS`` later and the test opens its gate). No process runs ``fn``: the job's value is
its own id. Everything else is the real path: ``StepRunner``, leases and records on a local
prefix, ``job.json``, the one poller, the commit. The ``local`` backend's real processes are
covered by ``tests/reliability/test_remote.py``; 200 of them would take minutes here.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from marin.execution.lazy import OUT, apply, lower
from marin.execution.plan.options import RunOptions
from marin.execution.remote import JobHandle, JobSpec, JobStatus, register_backend
from marin.execution.run.runner import StepRunner
from marin.execution.store.lease import read_lease
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record, read_status_file
from marin.execution.vocabulary import JobState

JOBS = 200
SECONDS = 1.0


class TimerBackend:
    """A job is a timer on disk: RUNNING until ``SECONDS`` after its submit and the gate."""

    def __init__(self, folder: Path, jobs: int) -> None:
        self.folder = folder
        self.gate = threading.Event()
        self.all_submitted = threading.Event()
        self._jobs = jobs
        self._lock = threading.Lock()
        self.submitted = 0

    def submit(self, job: JobSpec, idempotency_key: str) -> JobHandle:
        path = self.folder / f"{idempotency_key}.json"
        with open(path, "x") as f:  # once per key, like a real backend's idempotency
            json.dump({"step": job.step_id, "submitted_at": time.time(), "owner": job.owner}, f)
        with self._lock:
            self.submitted += 1
            if self.submitted == self._jobs:
                self.all_submitted.set()
        return JobHandle("timer", idempotency_key)

    def status(self, handle: JobHandle) -> JobStatus:
        path = self.folder / f"{handle.job_id}.json"
        if not path.exists():
            return JobStatus(JobState.LOST)
        submitted_at = json.loads(path.read_text())["submitted_at"]
        if not self.gate.is_set() or time.time() < submitted_at + SECONDS:
            return JobStatus(JobState.RUNNING)
        outcome = {"ok": True, "result": handle.job_id}  # isolated_child's form
        return JobStatus(JobState.SUCCEEDED, result=json.dumps(outcome).encode())

    def logs(self, handle: JobHandle, tail: int = 40) -> str:
        return ""

    def cancel(self, handle: JobHandle) -> None:
        (self.folder / f"{handle.job_id}.json").unlink(missing_ok=True)

    def owner(self, handle: JobHandle) -> str | None:
        path = self.folder / f"{handle.job_id}.json"
        return json.loads(path.read_text())["owner"] if path.exists() else None


def train(seed: int, out_path: str) -> str:
    raise AssertionError("a timer job never runs fn")


def test_a_thousand_waiting_jobs_cost_one_thread(tmp_path: Path) -> None:
    """200 remote steps wait at once with max_concurrent=2: the driver's live threads stay
    a small constant (one poller, one lease renewer, a few executor threads), and every step
    is committed once, by the job recorded for it."""
    (tmp_path / "jobs").mkdir()
    backend = TimerBackend(tmp_path / "jobs", JOBS)
    register_backend("timer", backend)
    steps = [
        apply(f"wait/{i}", train, version="v1", seed=i, out_path=OUT).with_options(remote="timer")
        for i in range(JOBS)
    ]
    prefix = str(tmp_path / "prefix")
    runner = StepRunner(RunOptions(max_concurrent=2, max_remote=JOBS + 50), prefix=prefix)
    before = threading.active_count()
    ended: list[BaseException | None] = []

    def run() -> None:
        try:
            runner.run([lower(step) for step in steps])
            ended.append(None)
        except BaseException as exc:
            ended.append(exc)

    driver = threading.Thread(target=run, name="test-driver")
    driver.start()
    try:
        assert backend.all_submitted.wait(timeout=120), f"{backend.submitted} submitted"
        waiting = threading.active_count()  # every job waits now: none can end yet
    finally:
        backend.gate.set()
        driver.join(timeout=120)
    assert ended == [None]
    # The driver thread, at most 2 + 4 executor threads, the poller, the lease renewer, and
    # the lineage sender: independent of how many jobs wait (the old build held one each).
    assert waiting - before <= 10, [t.name for t in threading.enumerate()]
    assert backend.submitted == JOBS == len(os.listdir(tmp_path / "jobs"))
    location = open_prefix(prefix)
    for i in range(JOBS):
        record = read_record(location, f"wait/{i}/v1")
        assert record is not None, f"wait/{i} was not committed"
        assert record.result == record.provenance["job"]["job_id"]  # its own job's value


class _Seen(logging.Handler):
    """Sets ``seen`` once a log line holds ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def test_a_pending_build_abandoned_by_a_second_interrupt_frees_its_lease_at_once(
    tmp_path: Path,
) -> None:
    """A second Ctrl-C leaves the loop while a build waits for its job: the build gives up its
    lease at once (its job runs on, for the next run to reattach), commits nothing, and says
    so in its status."""
    (tmp_path / "jobs").mkdir()
    backend = TimerBackend(tmp_path / "jobs", 1)
    register_backend("timer", backend)
    step = apply("wait/abandoned", train, version="v1", seed=0, out_path=OUT)
    spec = lower(step.with_options(remote="timer"))
    prefix = str(tmp_path / "prefix")
    waiting = _Seen("waiting for 1 running step(s) to finish")
    logger = logging.getLogger("marin")
    logger.addHandler(waiting)
    level, logger.level = logger.level, logging.INFO

    def interrupt_twice() -> None:
        assert backend.all_submitted.wait(60)
        os.kill(os.getpid(), signal.SIGINT)
        assert waiting.seen.wait(60)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_twice, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            StepRunner(RunOptions(max_concurrent=1), prefix=prefix).run([spec])
    finally:
        logger.removeHandler(waiting)
        logger.setLevel(level)
    location = open_prefix(prefix)
    try:
        deadline = time.monotonic() + 60  # the build's thread gives it up as it returns
        while read_lease(location, spec.output_path, 60.0) is not None:
            assert time.monotonic() < deadline, "the abandoned build kept its lease"
            time.sleep(0.05)
        status = read_status_file(location, spec.output_path)
        assert status is not None and "AbandonedError" in status["error"]
        assert read_record(location, spec.output_path) is None
        assert len(os.listdir(tmp_path / "jobs")) == 1, "the job was cancelled"
    finally:
        backend.gate.set()


def test_waiting_is_a_value_a_build_returns_and_resumes(tmp_path: Path) -> None:
    """``Wait.RETURN``: a build whose job runs returns ``Pending(JobRunning)`` holding its
    lease, and its ``resume`` commits once the job ended; another build of the step, meeting
    that lease, returns ``Pending(LeaseHeld)`` having written nothing; ``Wait.BLOCK`` never
    returns one."""
    from marin.execution.builder.commit import (
        BuildOutcome,
        BuildRequest,
        LeaseHeld,
        Pending,
        build_step,
    )
    from marin.execution.remote.wait import JobRunning
    from marin.execution.vocabulary import Wait

    (tmp_path / "jobs").mkdir()
    backend = TimerBackend(tmp_path / "jobs", 1)
    register_backend("timer", backend)
    spec = lower(apply("wait/value", train, version="v1", seed=0, out_path=OUT)
                 .with_options(remote="timer"))  # fmt: skip
    location = open_prefix(str(tmp_path / "prefix"))
    pending = build_step(BuildRequest(spec, location, wait=Wait.RETURN))
    assert isinstance(pending, Pending) and isinstance(pending.why, JobRunning)
    assert read_lease(location, spec.output_path, 60.0) is not None  # held while pending
    other = build_step(BuildRequest(spec, location, wait=Wait.RETURN))
    assert isinstance(other, Pending) and isinstance(other.why, LeaseHeld)
    assert read_record(location, spec.output_path) is None
    backend.gate.set()
    pending.why.wait()
    outcome = pending.resume()
    assert isinstance(outcome, BuildOutcome) and outcome.action == "built"
    assert read_lease(location, spec.output_path, 60.0) is None
    again = other.resume()  # the held step, tried again: built by then, and served
    assert isinstance(again, BuildOutcome) and again.record.build_id == outcome.record.build_id
    blocked = build_step(BuildRequest(spec, location))  # Wait.BLOCK: an outcome, always
    assert isinstance(blocked, BuildOutcome) and blocked.action == "cached"


def test_a_pending_build_released_for_later_leaves_its_job_to_be_reattached(
    tmp_path: Path,
) -> None:
    """``Pending.release(None)``, as an Airflow task deferring: the lease goes, no status is
    written, the job runs on; the next build reattaches to that job, never submits another."""
    from marin.execution.builder.commit import BuildOutcome, BuildRequest, Pending, build_step
    from marin.execution.vocabulary import Wait

    (tmp_path / "jobs").mkdir()
    backend = TimerBackend(tmp_path / "jobs", 1)
    register_backend("timer", backend)
    spec = lower(apply("wait/later", train, version="v1", seed=0, out_path=OUT)
                 .with_options(remote="timer"))  # fmt: skip
    location = open_prefix(str(tmp_path / "prefix"))
    pending = build_step(BuildRequest(spec, location, wait=Wait.RETURN_JOB))
    assert isinstance(pending, Pending)
    pending.release(None)
    assert read_lease(location, spec.output_path, 60.0) is None
    assert read_status_file(location, spec.output_path) is None
    backend.gate.set()
    outcome = build_step(BuildRequest(spec, location))  # the task, resumed: collects the job
    assert isinstance(outcome, BuildOutcome) and outcome.action == "built"
    assert backend.submitted == 1
    assert outcome.record.result == pending.why.job.job_id
