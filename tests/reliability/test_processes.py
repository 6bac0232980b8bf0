"""Real OS processes racing, crashing and stalling on one prefix."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest

from marin.execution.faults import CRASH_POINTS
from marin.execution.lazy import lower
from marin.execution.store.lease import Lease
from marin.execution.store.lease.info import LeaseInfo
from marin.execution.store.location import open_prefix
from marin.execution.store.records import (
    TMP_MARK,
    lease_path,
    read_record,
    read_status,
    record_path,
)
from tests.reliability import pipelines
from tests.reliability.conftest import REPO, child_env, run_runner, start_runner


def calls_per_step(calls_file: Path) -> Counter[str]:
    if not calls_file.exists():
        return Counter()
    return Counter(line.split()[0] for line in calls_file.read_text().splitlines() if line)


def race(prefix: str, tmp_path: Path, processes: int, extra_env: dict[str, str]) -> Counter[str]:
    """Start ``processes`` runners of the 30-step pipeline behind a start barrier."""
    calls, go = tmp_path / "calls.log", tmp_path / "go"
    env = child_env(MARIN_TEST_CALLS=str(calls), MARIN_TEST_GO=str(go), **extra_env)
    procs = [start_runner("race", prefix, env) for _ in range(processes)]
    time.sleep(0.3)  # let them import; the barrier makes the start simultaneous either way
    go.touch()
    results = [p.communicate(timeout=150) for p in procs]
    views = []
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, f"runner {proc.pid} failed:\n{err[-3000:]}"
        views.append(json.loads(out.strip().splitlines()[-1]))
    assert len(views[0]) == 30 and all(v == views[0] for v in views), "runners disagree"
    return calls_per_step(calls)


@pytest.mark.slow
def test_eight_processes_race_one_local_prefix(tmp_path: Path) -> None:
    """(a) Every fn runs exactly once in total; every process exits 0 and sees every artifact."""
    counts = race(str(tmp_path / "prefix"), tmp_path, 8, {"MARIN_TEST_SLEEP": "0.03"})
    assert len(counts) == 30
    assert set(counts.values()) == {1}, {s: n for s, n in counts.items() if n != 1}


@pytest.mark.slow
def test_four_processes_race_one_s3_prefix(tmp_path: Path, s3_server: dict[str, str]) -> None:
    """(e) The same race against S3 (moto), where leases use If-None-Match and If-Match."""
    prefix = f"s3://marin-tests/race-{os.getpid()}-{time.time_ns()}"
    counts = race(prefix, tmp_path, 4, {**s3_server, "MARIN_TEST_SLEEP": "0"})
    assert set(counts.values()) == {1} and len(counts) == 30


@pytest.mark.slow
def test_four_processes_race_one_gcs_prefix(tmp_path: Path, gcs_server: dict[str, str]) -> None:
    """The same race against GCS (fake-gcs-server): leases use ``ifGenerationMatch``."""
    prefix = f"gs://marin-tests/race-{os.getpid()}-{time.time_ns()}"
    counts = race(prefix, tmp_path, 4, {**gcs_server, "MARIN_TEST_SLEEP": "0"})
    assert set(counts.values()) == {1} and len(counts) == 30


@pytest.mark.slow
def test_processes_racing_to_take_over_expired_gcs_leases_build_each_step_once(
    tmp_path: Path, gcs_server: dict[str, str]
) -> None:
    """Every step starts with an expired lease of a runner that is gone: four processes race to
    take each one over. Renewal and takeover are generation-matched writes, so exactly one
    wins each step (with read-compare-write, two could both take over and both build)."""
    prefix = f"gs://marin-tests/takeover-{os.getpid()}-{time.time_ns()}"
    location = open_prefix(prefix)
    for spec in lower(*pipelines.race_pipeline(), memo={}):
        stale = Lease(location, spec.output_path, ttl=-10)  # expired ten seconds ago
        assert stale.store.create(stale.path, stale._body())
        assert stale.read() is not None and stale.read().expired  # type: ignore[union-attr]
    counts = race(prefix, tmp_path, 4, {**gcs_server, "MARIN_TEST_SLEEP": "0"})
    assert set(counts.values()) == {1} and len(counts) == 30


# -- crash injection --------------------------------------------------------------------------


def check_committed_steps_are_whole(prefix: str) -> int:
    """No committed step has partial output, and there is one record file per committed step."""
    location = open_prefix(prefix)
    location.fs.invalidate_cache()  # s3fs caches listings; other processes changed the prefix
    committed = 0
    for spec in lower(*pipelines.crash_pipeline(), memo={}):
        record = read_record(location, spec.output_path)
        meta = location.path(record_path(spec.output_path)).rsplit("/", 1)[0]
        if location.fs.exists(meta):
            names = [p.rsplit("/", 1)[-1] for p in location.fs.ls(meta, detail=False)]
            record_files = [n for n in names if n.startswith("record.json")]
            if record is not None:
                assert record_files == ["record.json"], names
            else:
                # Not committed: temporary files of a write killed half-way, and at most a torn
                # record.json (what a crash on a non-atomic store leaves), which must not parse:
                # a whole record is never read as "not built".
                assert all(
                    n == "record.json" or n.startswith("record.json" + TMP_MARK)
                    for n in record_files
                ), names
                if "record.json" in record_files:
                    torn = location.fs.cat_file(location.path(record_path(spec.output_path)))
                    with pytest.raises(ValueError):
                        json.loads(torn)
        if record is None:
            continue
        committed += 1
        out = location.path(spec.output_path)
        parts = [location.fs.cat_file(f"{out}/part{i}").decode() for i in (1, 2)]
        assert parts == [record.result] * 2, f"{spec.step_id}: partial output {parts}"
    return committed


CRASH_KINDS = ("during-fn", *CRASH_POINTS)


def crash_then_recover(prefix: str, point: str, step: str, env: dict[str, str]) -> None:
    killed = run_runner("crash", prefix, {**env, "MARIN_FAULT_CRASH": f"{point}@{step}"})
    assert killed.returncode == -signal.SIGKILL, (point, step, killed.stderr[-2000:])
    check_committed_steps_are_whole(prefix)
    fresh = run_runner("crash", prefix, env)
    assert fresh.returncode == 0, (point, step, fresh.stderr[-3000:])
    assert check_committed_steps_are_whole(prefix) == len(pipelines.CRASH_STEPS)
    location = open_prefix(prefix)
    for spec in lower(*pipelines.crash_pipeline(), memo={}):
        state = (read_status(location, spec.output_path) or {}).get("state")
        # A step killed after its record (the commit) but before its advisory status, possibly
        # on another thread than the crash point, keeps RUNNING beside a valid record, which wins.
        assert state in ("SUCCESS", "RUNNING"), (spec.step_id, state)
        # Such a step may also keep its dead holder's lease; it must never block anyone.
        probe = Lease(location, spec.output_path)
        assert probe.try_acquire() is None, f"{spec.step_id}: a stale lease blocks the next run"
        probe.release()


@pytest.mark.slow
def test_sigkill_at_random_points_then_a_fresh_run_completes(tmp_path: Path) -> None:
    """(b) 24 kills spread over every crash point; each fresh run repairs the prefix."""
    seed = int(os.environ.get("MARIN_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    plan = [(kind, rng.choice(pipelines.CRASH_STEPS)) for kind in CRASH_KINDS for _ in range(3)]
    plan += [(rng.choice(CRASH_KINDS), rng.choice(pipelines.CRASH_STEPS)) for _ in range(3)]
    env = child_env(MARIN_TEST_SLEEP="0")
    print(f"MARIN_CRASH_SEED={seed}: " + ", ".join(f"{p}@{s}" for p, s in plan))

    def one(i: int) -> None:
        point, step = plan[i]
        crash_then_recover(str(tmp_path / f"p{i}"), point, step, env)

    with ThreadPoolExecutor(2) as pool:  # independent prefixes: two at a time
        list(pool.map(one, range(len(plan))))
    assert len(plan) >= 20


@pytest.mark.slow
def test_sigkill_on_s3_then_a_fresh_run_completes(
    tmp_path: Path, s3_server: dict[str, str]
) -> None:
    """(e) Crash safety against S3: kills during fn, between output and record, and in the
    record PUT (all or nothing on S3), one after another on one prefix; then a fresh run."""
    prefix = f"s3://marin-tests/crash-{time.time_ns()}"
    env = child_env(MARIN_TEST_SLEEP="0", **s3_server)
    # Each fault targets a step downstream of the previous one, so that no earlier run can have
    # committed it already (crash/c runs beside crash/b and may finish before b's kill).
    for fault in ("during-fn@crash/b", "after-output@crash/d", "record-write@crash/e"):
        killed = run_runner("crash", prefix, {**env, "MARIN_FAULT_CRASH": fault})
        assert killed.returncode == -signal.SIGKILL, (fault, killed.stderr[-2000:])
        check_committed_steps_are_whole(prefix)
    crash_then_recover(prefix, "after-record", "crash/e", env)


# -- stale and lost leases --------------------------------------------------------------------


def test_stale_lease_of_a_killed_holder_is_taken_over_after_the_ttl(tmp_path: Path) -> None:
    """(c) The holder dies by SIGKILL; with PID checks off, the lease is taken after its TTL."""
    prefix = str(tmp_path / "prefix")
    env = child_env(MARIN_TEST_SLEEP="0", MARIN_LEASE_TTL="1.5", MARIN_LEASE_CHECK_PID="0")
    killed = run_runner("crash", prefix, {**env, "MARIN_FAULT_CRASH": "during-fn@crash/a"})
    assert killed.returncode == -signal.SIGKILL
    location = open_prefix(prefix)
    held = LeaseInfo.parse(location.fs.cat_file(location.path(lease_path("crash/a/v1"))))
    t0 = time.monotonic()
    taker = run_runner("crash", prefix, env)
    assert taker.returncode == 0, taker.stderr[-3000:]
    assert "taking over expired lease" in taker.stderr
    # Not before the dead holder's lease expired (judged on the record, not on how fast the
    # taker started: under load its start alone can outlast a 1.5 s TTL).
    record = read_record(location, "crash/a/v1")
    assert record is not None
    started = datetime.fromisoformat(record.started_at).timestamp()
    assert started >= held.expires_at - 0.001  # started_at keeps milliseconds
    assert time.monotonic() - t0 < 30
    assert check_committed_steps_are_whole(prefix) == 6


def test_lease_of_a_dead_local_process_is_taken_over_at_once(tmp_path: Path) -> None:
    """On one machine a SIGKILLed holder's lease does not stall the next run for its TTL."""
    prefix = str(tmp_path / "prefix")
    env = child_env(MARIN_TEST_SLEEP="0", MARIN_LEASE_TTL="600")
    killed = run_runner("crash", prefix, {**env, "MARIN_FAULT_CRASH": "during-fn@crash/a"})
    assert killed.returncode == -signal.SIGKILL
    t0 = time.monotonic()
    taker = run_runner("crash", prefix, env)
    assert taker.returncode == 0, taker.stderr[-3000:]
    assert "taking over lease of a process that is gone" in taker.stderr
    assert time.monotonic() - t0 < 20


def test_holder_that_lost_its_lease_does_not_commit(tmp_path: Path) -> None:
    """(d) A stalls with its heartbeat blocked past expiry; B takes over and commits; A then
    finishes fn, finds the lease gone, discards its result and serves B's record."""
    prefix = str(tmp_path / "prefix")
    calls, started, release = tmp_path / "calls.log", tmp_path / "started", tmp_path / "release"
    base = child_env(MARIN_TEST_SLEEP="0", MARIN_LEASE_TTL="1", MARIN_TEST_CALLS=str(calls))
    stalled = start_runner(
        "crash",
        prefix,
        {
            **base,
            "MARIN_FAULT_PAUSE_HEARTBEAT": "1",
            "MARIN_TEST_HOLD": f"crash/f:{started}:{release}",
        },
    )
    pipelines.wait_for_file(str(started), timeout=30)
    a_token = started.read_text().strip()
    taker = run_runner("crash", prefix, base)
    assert taker.returncode == 0, taker.stderr[-3000:]
    assert "taking over expired lease" in taker.stderr
    release.touch()
    _, err = stalled.communicate(timeout=60)
    assert stalled.returncode == 0, err[-3000:]
    assert "lost the lease while building" in err and "built by another runner" in err
    record = read_record(open_prefix(prefix), "crash/f/v1")
    assert record is not None and record.result != a_token  # the second runner's record wins
    assert record.result == json.loads(taker.stdout.splitlines()[-1])["crash/f@v1"]
    assert check_committed_steps_are_whole(prefix) == 6
    assert calls_per_step(calls)["crash/f"] == 2  # A ran fn but never committed it


# -- Ctrl-C and SIGTERM ------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_releases_leases_and_leaves_nothing_running(tmp_path: Path, sig: int) -> None:
    prefix = str(tmp_path / "prefix")
    started, release = tmp_path / "started", tmp_path / "release"
    env = child_env(MARIN_TEST_HOLD=f"held/one:{started}:{release}")
    cli = [sys.executable, "-m", "marin.cli", "run", "tests/reliability/pipelines.py:held"]
    proc = subprocess.Popen(
        [*cli, "--prefix", prefix],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pipelines.wait_for_file(str(started), timeout=30)
    location = open_prefix(prefix)
    assert (read_status(location, "held/one/v1") or {}).get("state") == "RUNNING"
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(
            "marin run did not exit within 10 s of the signal: the runner must not join the "
            "worker thread still running fn when interrupted (shut the pool down without "
            "waiting on that path)"
        )
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err
    assert (read_status(location, "held/one/v1") or {}).get("state") == "FAILED"
    assert not location.fs.exists(location.path(lease_path("held/one/v1")))
    assert read_record(location, "held/one/v1") is None
    # The next run does not wait for the (default 60 s) lease: it was released.
    t0 = time.monotonic()
    again = subprocess.run(
        [*cli, "--prefix", prefix],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert time.monotonic() - t0 < 20
    assert read_record(location, "held/one/v1") is not None


PREFECT_RUNNER = """
import json, sys
from marin_testing.prefect import isolate_prefect_home
isolate_prefect_home()
from marin.execution.plan.options import RunOptions
from marin_prefect import to_prefect_flow
flow = to_prefect_flow("tests/reliability/pipelines.py:race", prefix=sys.argv[1], options=RunOptions(max_concurrent=4))
print(json.dumps(flow()), flush=True)
"""


@pytest.mark.slow
def test_mixed_runners_race_steprunner_processes_and_a_prefect_flow(tmp_path: Path) -> None:
    """A Prefect flow run and two StepRunner processes race one prefix: each fn runs once."""
    pytest.importorskip("prefect")
    pytest.importorskip("marin_prefect.compile")
    prefix = str(tmp_path / "prefix")
    calls, go = tmp_path / "calls.log", tmp_path / "go"
    env = child_env(MARIN_TEST_CALLS=str(calls), MARIN_TEST_GO=str(go), MARIN_TEST_SLEEP="0.1")
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "90"
    # The flow's steps take a second each, the local runners' a tenth: however fast Prefect
    # gets, the flow is still building when the local runners (started at its first step) come.
    flow = subprocess.Popen(
        [sys.executable, "-c", PREFECT_RUNNER, prefix],
        cwd=REPO,
        env={**env, "MARIN_TEST_SLEEP": "1.0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Start the local runners the moment the Prefect flow builds its first step.
    deadline = time.monotonic() + 120
    while not (calls.exists() and calls.read_text().strip()):
        assert flow.poll() is None, flow.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the Prefect flow never started a step"
        time.sleep(0.02)
    go.touch()
    locals_ = [start_runner("race", prefix, env) for _ in range(2)]
    for proc in [flow, *locals_]:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
    counts = calls_per_step(calls)
    assert len(counts) == 30 and set(counts.values()) == {1}, counts
    pids = {line.split()[1].split("-")[0] for line in calls.read_text().splitlines()}
    assert str(flow.pid) in pids and len(pids) >= 2, "the runners did not actually share the work"
