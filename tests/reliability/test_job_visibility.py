"""A running ``local`` job is never called "lost" by a driver that cannot see it (issue 53,
red-team round 1: findings 1, 2, 9): another user's (another jobs root's) ``run`` refuses the
build and ``gc`` leaves its step alone; a prefix reached through a link and by its real path is
one owner; a hand-edited or deleted ``job.json`` never starts a second job beside the one that
runs. Real drivers (``marin`` in subprocesses) and real detached jobs; each test's job is held
by ``MARIN_TEST_GATE`` and released at its end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin.execution.remote.procs import start_time
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.conftest import REPO
from tests.reliability.test_remote import (
    TRAIN,
    calls,
    driver_killed_while_its_job_runs,
    marin_cli,
    marin_run,
    setup,
    wait_for_text,
)

GC_REMOTE = "tests/gc/pipelines.py:remote"


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], int]]:
    """``chain``'s driver killed while its training job runs (held by the gate): the prefix,
    the environment (its jobs root ``tmp_path/jobs``) and the job's pid. The gate opens at
    the end, so no job outlives the test."""
    prefix, env = setup(tmp_path)
    try:
        yield prefix, env, driver_killed_while_its_job_runs(tmp_path, prefix, env)
    finally:
        (tmp_path / "gate").touch()


def marin(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *argv], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


def jobs_in(root: Path) -> list[str]:
    return sorted(p for p in os.listdir(root) if p.startswith("marin-")) if root.is_dir() else []


def wait_for_text_file(path: Path) -> None:
    """``path`` exists and holds a whole line (a step writes its pid there when it starts)."""
    from tests.reliability.pipelines import wait_for_file

    wait_for_file(str(path), timeout=60)
    wait_for_text(path, "\n")


def test_another_users_driver_never_calls_a_running_job_lost(
    tmp_path: Path, held: tuple[str, dict[str, str], int]
) -> None:
    """Finding 1: bob (his own jobs root) runs the pipeline while alice's dead driver's job
    still trains. ``plan`` says the run refuses (state ``unseen``, naming alice's jobs root);
    ``run`` fails the step without a second job or a cleared output (``unlock`` says why);
    alice's run from her jobs root then reattaches to her job, which commits."""
    prefix, alice, job_pid = held
    bob = {**alice, "MARIN_USER": "bob", "MARIN_LOCAL_JOBS": str(tmp_path / "jobs-bob")}
    unlocked = marin("unlock", "remote/train@v1", "--prefix", prefix, env=bob)  # a dead holder's
    assert unlocked.returncode == 0, unlocked.stderr
    assert "may still run where this driver cannot see it" in unlocked.stdout, unlocked.stdout
    plan = json.loads(marin_cli("plan", "chain", prefix, bob, "--json"))
    (job,) = [s["job"] for s in plan["steps"] if s["step"] == "remote/train@v1"]
    assert job["state"] == "unseen" and f"jobs root {tmp_path / 'jobs'}" in job["why"], job
    done = marin("run", "tests/reliability/remote_pipelines.py:chain", "--prefix", prefix,
                 env=bob)  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"names local job {job['job_id']}, which may still run" in last, last
    assert f"MARIN_LOCAL_JOBS={tmp_path / 'jobs'}" in last and "(step remote/train@v1)" in last
    assert jobs_in(tmp_path / "jobs-bob") == []  # never a second job
    assert start_time(job_pid) is not None and calls(tmp_path) == [f"remote/train {job_pid}"]
    assert read_record(open_prefix(prefix), TRAIN) is None
    again = marin_run("chain", prefix, alice, tmp_path / "alice.err")
    wait_for_text(tmp_path / "alice.err", f"reattach remote/train@v1: local job {job['job_id']}")
    (tmp_path / "gate").touch()
    assert again.wait(timeout=90) == 0, (tmp_path / "alice.err").read_text()
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.result == {"pid": job_pid}


def test_gc_by_another_user_leaves_a_running_orphan_alone(tmp_path: Path) -> None:
    """Finding 2: alice's driver dies while its job of ``gc/rtrain@v1`` runs; the pipeline
    moves to v2. Bob's ``gc`` (his own jobs root), even with ``--cancel-orphans``, lists the
    job as ``unseen``, never deletes its step nor stops it."""
    prefix, alice = setup(tmp_path)
    driver = subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", GC_REMOTE, "--prefix", prefix, "--no-progress"],
        cwd=REPO, env=alice, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        started = tmp_path / "started" / "gc_rtrain"
        wait_for_text_file(started)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        job_pid = int(started.read_text().split()[0])
        bob = {**alice, "MARIN_USER": "bob", "MARIN_LOCAL_JOBS": str(tmp_path / "jobs-bob"),
               "MARIN_TEST_GC_TRAIN": "v2"}  # fmt: skip
        for extra in ([], ["--cancel-orphans"]):
            done = marin("gc", GC_REMOTE, "--prefix", prefix, "--json", *extra, env=bob)
            assert done.returncode == 0, done.stderr[-3000:]
            report = json.loads(done.stdout)
            assert report["collected"] == [], report
            (orphan,) = report["orphans"]
            assert (orphan["step"], orphan["state"]) == ("gc/rtrain@v1", "unseen"), orphan
            assert f"jobs root {tmp_path / 'jobs'}" in orphan["action"], orphan
            assert start_time(job_pid) is not None
            assert (Path(prefix) / "gc/rtrain/v1.marin/job.json").is_file()
    finally:
        (tmp_path / "gate").touch()


def test_a_prefix_by_link_and_by_real_path_is_one_owner(tmp_path: Path) -> None:
    """Finding 9: a driver on ``--prefix LINK`` dies while its job runs; a driver on the real
    path reattaches to that job (``plan`` says so) instead of submitting a second one."""
    prefix, env = setup(tmp_path)
    os.makedirs(prefix)
    link = tmp_path / "link"
    link.symlink_to(prefix)
    try:
        job_pid = driver_killed_while_its_job_runs(tmp_path, str(link), env)
        plan = json.loads(marin_cli("plan", "chain", prefix, env, "--json"))
        (job,) = [s["job"] for s in plan["steps"] if s["step"] == "remote/train@v1"]
        assert job["state"] == "running", job
        second = marin_run("chain", prefix, env, tmp_path / "second.err")
        wait_for_text(
            tmp_path / "second.err", f"reattach remote/train@v1: local job {job['job_id']}"
        )
        (tmp_path / "gate").touch()
        assert second.wait(timeout=90) == 0, (tmp_path / "second.err").read_text()
    finally:
        (tmp_path / "gate").touch()
    assert calls(tmp_path) == [f"remote/train {job_pid}"]  # one job, fn ran once
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None and record.result == {"pid": job_pid}


@pytest.mark.parametrize("edit", ["backend", "build_id", "job_id", "deleted"])
def test_a_hand_edited_job_record_never_starts_a_second_job(
    tmp_path: Path, held: tuple[str, dict[str, str], int], edit: str
) -> None:
    """Finding 9: ``job.json`` of a running job edited by hand (another backend, build or job
    id) or deleted: ``plan`` says the run refuses, and ``run`` fails the step naming the job
    that runs, never submitting a second one beside it nor clearing its output."""
    prefix, env, job_pid = held
    path = Path(prefix) / f"{TRAIN}.marin" / "job.json"
    record = json.loads(path.read_text())
    running = record["job_id"]
    if edit == "deleted":
        path.unlink()
    else:
        record[edit] = {"backend": "bogus", "build_id": "another-build"}.get(
            edit, "marin-" + "e" * 20
        )
        path.write_text(json.dumps(record))
    plan = json.loads(marin_cli("plan", "chain", prefix, env, "--json"))
    (job,) = [s["job"] for s in plan["steps"] if s["step"] == "remote/train@v1"]
    assert job["state"] in ("unseen", "unrecorded"), job
    done = marin("run", "tests/reliability/remote_pipelines.py:chain", "--prefix", prefix,
                 env=env)  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "(step remote/train@v1)" in last and "nothing was cleared" in last, last
    assert running in last or record["job_id"] in last, last
    assert jobs_in(tmp_path / "jobs") == [running]  # never a second job
    assert start_time(job_pid) is not None and calls(tmp_path) == [f"remote/train {job_pid}"]
    assert read_record(open_prefix(prefix), TRAIN) is None
