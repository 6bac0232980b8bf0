"""Gang steps (``with_options(remote="local", ranks=3)``): real drivers, real detached jobs,
three real ranks that meet through ``jax.distributed.initialize()`` on CPU (the first test), or
over TCP at the gang's torch master (``tcp_gang``: the same gang without JAX's start-up)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marin.execution.errors import InvalidStepError
from marin.execution.lazy import OUT, apply, lower
from marin.execution.pipeline.remote_option import DEFAULT_PLACEMENT_TIMEOUT_S
from marin.execution.remote.local import LocalBackend
from marin.execution.remote.procs import start_time
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.step_folder import read_job
from marin.execution.vocabulary import RankPlacement
from tests.reliability.conftest import REPO
from tests.reliability.gang_pipelines import all_reduce
from tests.reliability.test_remote import job_folders, marin_cli, setup, wait_for_text

GANG = "tests/reliability/gang_pipelines.py"
JAX = "gang/jax/v1"
TCP = "gang/tcp/v1"


def gang_run(target: str, prefix: str, env: dict[str, str], err: Path, *extra: str):
    cli = [sys.executable, "-m", "marin.cli", "run", f"{GANG}:{target}", "--prefix", prefix]
    return subprocess.Popen(
        [*cli, *extra], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err.open("w"),
        text=True, start_new_session=True,
    )  # fmt: skip


def gang_plan(prefix: str, env: dict[str, str], *extra: str, target: str = "tcp_gang") -> str:
    done = subprocess.run(
        [sys.executable, "-m", "marin.cli", "plan", f"{GANG}:{target}", "--prefix", prefix,
         *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def rank_starts(tmp_path: Path, count: int, timeout: float = 120) -> list[int]:
    """The pids of the first ``count`` rank starts, once there are that many."""
    path = tmp_path / "calls"
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return [int(line.split()[-1]) for line in lines[:count]]
        assert time.monotonic() < deadline, f"{len(lines)} of {count} ranks started"
        time.sleep(0.02)


def wait_gone(pids: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(start_time(pid) is not None for pid in pids):
        assert time.monotonic() < deadline, "a rank outlived its gang"
        time.sleep(0.02)


def test_a_jax_gang_all_reduces_and_commits_once(tmp_path: Path) -> None:
    """Three ranks meet through ``jax.distributed.initialize()`` (no arguments) and sum
    ``rank + 1``: one job, one record, rank 0's value, every rank's files in one output."""
    pytest.importorskip("jax")
    prefix, env = setup(tmp_path)
    (tmp_path / "gate").touch()
    proc = gang_run("jax_gang", prefix, env, tmp_path / "err", "--json")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, (tmp_path / "err").read_text()
    record = read_record(open_prefix(prefix), JAX)
    assert record is not None
    assert record.result["sum"] == 6.0 and record.result["rank"] == 0
    assert record.result["world_size"] == 3
    assert record.result["env"] == {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0",
                                    "MASTER_ADDR": "127.0.0.1", "JAX_PROCESS_ID": "0",
                                    "JAX_NUM_PROCESSES": "3"}  # fmt: skip
    output = Path(prefix) / JAX
    for rank in range(3):
        seen = json.loads((output / f"rank-{rank}.json").read_text())
        assert seen == {"process_index": rank, "devices": 3}  # one JAX cluster of three
    assert len(rank_starts(tmp_path, 3)) == 3 and len((tmp_path / "calls").read_text().split("\n")) == 4
    step = json.loads(out)["steps"][0]
    assert step["job"]["job_id"] == record.provenance["job"]["job_id"]
    assert step["job"]["preemptions"] == 0
    log = (Path(prefix) / "gang/jax/v1.marin/log.txt").read_text()
    assert all(f"[rank {rank}]" in log for rank in range(3))
    assert job_folders(prefix) == []  # committed: the job's files (ranks' too) are gone
    host = socket.gethostname()
    ranks = [{"rank": k, "host": host, "state": "returned"} for k in range(3)]
    assert record.provenance["job"]["ranks"] == ranks  # the record keeps each rank's end
    shown = _show(prefix, env)
    assert f"ranks        0 returned on {host}, 1 returned on {host}, 2 returned on" in shown
    assert "marin logs gang/jax@v1 --rank N" in shown
    assert_rank_log(prefix, env, 1)


def assert_rank_log(prefix: str, env: dict[str, str], rank: int, step: str = "gang/jax") -> None:
    """``marin logs --rank K`` prints rank K's lines alone, unlabelled; a rank the gang does
    not have is an error."""
    mine = rank_log(prefix, env, rank, step)
    assert f"rank {rank} of 3 met" in mine.splitlines(), mine
    assert not any(f"rank {k} of 3 met" in mine for k in range(3) if k != rank), mine
    assert "[rank " not in mine
    done = subprocess.run(
        [sys.executable, "-m", "marin.cli", "logs", step, "--prefix", prefix, "--rank", "7"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "no line of rank 7" in done.stderr, done.stderr


def rank_log(prefix: str, env: dict[str, str], rank: int, step: str = "gang/jax") -> str:
    done = subprocess.run(
        [sys.executable, "-m", "marin.cli", "logs", step, "--prefix", prefix, "--rank",
         str(rank)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_killed_rank_ends_every_rank_and_the_gang_is_resubmitted_once(tmp_path: Path) -> None:
    """SIGKILL rank 1 while the gang runs: ranks 0 and 2 end too, the job is lost (a
    preemption, not a failure: retries=0), one new gang runs, one record says so."""
    prefix, env = setup(tmp_path)
    proc = gang_run("tcp_gang", prefix, env, tmp_path / "err", "--json")
    first = rank_starts(tmp_path, 3)
    os.kill(first[1], signal.SIGKILL)
    wait_gone(first)  # all three ended
    second = rank_starts(tmp_path, 6)[3:]  # one new gang of three
    assert not set(second) & set(first)
    plan = json.loads(gang_plan(prefix, env, "--json"))
    job = plan["steps"][0]["job"]
    assert job["preemptions"] == 1  # the running gang's record says so
    assert [(r["rank"], r["state"]) for r in job["ranks"]] == [(0, "running"), (1, "running"),
                                                              (2, "running")]  # fmt: skip
    text = gang_plan(prefix, env)
    assert "after 1 preemption; ranks: 0 running on " in text, text
    # not built: its job's ranks, each rank's log on its own
    running = _show(prefix, env, built=False, step=TCP)
    assert "ranks        0 running on " in running and "2 running on " in running, running
    assert "rank 2 of 3 met" in rank_log(prefix, env, 2, "gang/tcp")
    (tmp_path / "gate").touch()
    out, _ = proc.communicate(timeout=300)
    err = (tmp_path / "err").read_text()
    assert proc.returncode == 0, err
    assert "preempted gang/tcp@v1" in err and "was killed by SIGKILL" in err
    record = read_record(open_prefix(prefix), TCP)
    assert record is not None and record.result["sum"] == 6.0
    assert record.provenance["job"]["preemptions"] == 1
    assert json.loads(out)["steps"][0]["job"]["preemptions"] == 1
    assert len((tmp_path / "calls").read_text().splitlines()) == 6  # two gangs, never three
    assert "preemptions  1" in _show(prefix, env, step=TCP)


def _show(prefix: str, env: dict[str, str], built: bool = True, step: str = JAX) -> str:
    return marin_cli("show", "", f"{prefix}/{step}", env, ok=built)


def test_cancelling_a_gang_ends_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend's ``cancel`` (what a lost lease does) kills the supervisor's whole group:
    all three ranks end, and the driver never commits."""
    prefix, env = setup(tmp_path)
    proc = gang_run("tcp_gang", prefix, env, tmp_path / "err")
    ranks = rank_starts(tmp_path, 3)
    job = read_job(open_prefix(prefix), TCP)
    assert job is not None
    monkeypatch.setenv("MARIN_LOCAL_JOBS", env["MARIN_LOCAL_JOBS"])
    LocalBackend().cancel(job.handle)
    wait_gone(ranks)
    assert proc.wait(timeout=120) != 0
    assert "was stopped (cancelled)" in (tmp_path / "err").read_text()  # watch: no cause to fix
    assert read_record(open_prefix(prefix), TCP) is None


def test_a_lost_lease_cancels_every_rank_of_the_gang(tmp_path: Path) -> None:
    """Driver A stalls (heartbeat paused) until B takes its lease over and reattaches to A's
    gang; A wakes, finds its lease lost and cancels the gang: all three ranks end. B sees the
    job stopped, submits one new gang and commits it; A commits nothing."""
    prefix, env = setup(tmp_path, MARIN_LEASE_TTL="1")
    resume = tmp_path / "resume"
    a = gang_run("tcp_gang", prefix, {**env, "MARIN_FAULT_PAUSE_HEARTBEAT": f"until:{resume}"},
                 tmp_path / "a.err")  # fmt: skip
    first = rank_starts(tmp_path, 3)
    job = read_job(open_prefix(prefix), TCP)
    assert job is not None
    b = gang_run("tcp_gang", prefix, env, tmp_path / "b.err")
    wait_for_text(tmp_path / "b.err", f"reattach gang/tcp@v1: local job {job.job_id}", 120)
    resume.touch()
    wait_gone(first)  # A cancelled the gang: every rank, not only the supervisor
    second = rank_starts(tmp_path, 6)[3:]
    assert not set(second) & set(first)
    (tmp_path / "gate").touch()
    assert b.wait(timeout=300) == 0, (tmp_path / "b.err").read_text()
    a.wait(timeout=120)
    assert "lost the lease while local job" in (tmp_path / "a.err").read_text()
    record = read_record(open_prefix(prefix), TCP)
    assert record is not None and record.result["sum"] == 6.0
    assert record.provenance["job"]["job_id"] != job.job_id
    assert len((tmp_path / "calls").read_text().splitlines()) == 6  # two gangs, never three


def test_a_rank_that_raises_fails_the_attempt_and_retries_count_it(tmp_path: Path) -> None:
    """Rank 1's ``fn`` raises: the gang fails as one (every rank ends) and ``retries=1``
    submits one new gang, which builds; no preemption is counted."""
    prefix, env = setup(tmp_path, MARIN_TEST_FAIL=str(tmp_path / "fail"), MARIN_TEST_RETRIES="1")
    (tmp_path / "fail").touch()
    (tmp_path / "gate").touch()
    proc = gang_run("tcp_gang", prefix, env, tmp_path / "err")
    wait_gone(rank_starts(tmp_path, 3))  # the failed gang, all of it: none left in the sum
    assert proc.wait(timeout=300) == 0, (tmp_path / "err").read_text()
    assert "rank 1: rank 1 diverged" in (tmp_path / "err").read_text()
    wait_gone(rank_starts(tmp_path, 6))
    record = read_record(open_prefix(prefix), TCP)
    assert record is not None and record.result["sum"] == 6.0
    assert record.provenance["job"]["preemptions"] == 0


def test_a_killed_driver_reattaches_to_its_one_gang(tmp_path: Path) -> None:
    """SIGKILL ``marin run`` while the gang runs: the next run reattaches to that gang (its
    three ranks), never starting a second."""
    prefix, env = setup(tmp_path)
    first = gang_run("tcp_gang", prefix, env, tmp_path / "first.err")
    ranks = rank_starts(tmp_path, 3)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert all(start_time(pid) is not None for pid in ranks)  # the gang outlived its driver
    second = gang_run("tcp_gang", prefix, env, tmp_path / "second.err")
    wait_for_text(tmp_path / "second.err", "reattach gang/tcp@v1")
    (tmp_path / "gate").touch()
    assert second.wait(timeout=300) == 0, (tmp_path / "second.err").read_text()
    assert len((tmp_path / "calls").read_text().splitlines()) == 3  # one gang
    job = read_job(open_prefix(prefix), TCP)
    record = read_record(open_prefix(prefix), TCP)
    assert record is not None and job is not None and record.result["sum"] == 6.0
    assert record.provenance["job"]["job_id"] == job.job_id


def test_a_preempted_resumable_gang_resumes(tmp_path: Path) -> None:
    """A resumable gang whose rank is SIGKILLed after its third unit is submitted again and
    resumes from rank 0's checkpoint: no unit before it runs twice in the new gang."""
    prefix, env = setup(tmp_path, MARIN_TEST_UNITS="8",
                        MARIN_TEST_UNITS_LOG=str(tmp_path / "units"))  # fmt: skip
    proc = gang_run("units_gang", prefix, env, tmp_path / "err")
    first = rank_starts(tmp_path, 3)
    checkpoint = Path(prefix) / "gang/units/v1.marin/checkpoints/next_unit"
    deadline = time.monotonic() + 120
    while not (checkpoint.exists() and int(checkpoint.read_text() or 0) >= 3):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(first[2], signal.SIGKILL)
    assert proc.wait(timeout=300) == 0, (tmp_path / "err").read_text()
    record = read_record(open_prefix(prefix), "gang/units/v1")
    assert record is not None and record.result["started_at"] >= 3
    assert record.provenance["job"]["preemptions"] == 1
    done = (tmp_path / "units").read_text().splitlines()
    assert sum(line.startswith("rank 0 ") for line in done) < 8 * 1.5  # the work was kept


@pytest.mark.parametrize("budget", [0, 1])
def test_a_gang_lost_while_no_driver_watches_counts_as_a_preemption(
    tmp_path: Path, budget: int
) -> None:
    """Red team gang2 F1: the driver SIGKILLed, then a rank of its resumable gang (after
    ``budget`` preemptions the live driver counted): ``plan`` says lost, and the next run
    counts it too (it was read "stopped", uncounted, and the gang was resubmitted past
    ``max_preemptions``): past the budget, it fails and submits nothing."""
    prefix, env = setup(tmp_path, MARIN_TEST_UNITS="400", MARIN_TEST_MAX_PREEMPTIONS=str(budget),
                        MARIN_TEST_UNITS_LOG=str(tmp_path / "units"))  # fmt: skip
    first = gang_run("units_gang", prefix, env, tmp_path / "first.err")
    ranks = rank_starts(tmp_path, 3)
    if budget:  # one preemption the live driver counts, in job.json
        os.kill(ranks[1], signal.SIGKILL)
        ranks = rank_starts(tmp_path, 6)[3:]
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    os.kill(ranks[1], signal.SIGKILL)  # preempted while no driver watches
    wait_gone(ranks)
    plan = subprocess.run(
        [sys.executable, "-m", "marin.cli", "plan", f"{GANG}:units_gang", "--prefix", prefix],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "resubmit: local job marin-" in plan.stdout and ", lost " in plan.stdout, plan
    second = gang_run("units_gang", prefix, env, tmp_path / "second.err")
    assert second.wait(timeout=120) == 1
    err = (tmp_path / "second.err").read_text()
    assert f"after {budget} preemptions (max_preemptions={budget})" in err, err
    assert " submit gang/units@v1" not in err, err
    assert len((tmp_path / "calls").read_text().splitlines()) == 3 * (budget + 1)
    assert read_record(open_prefix(prefix), "gang/units/v1") is None


def test_each_rank_sees_its_own_gpus_and_one_master(tmp_path: Path) -> None:
    """``resources={"gpu": 2}`` is per rank: of the 6 devices the job sees, rank K gets the
    K-th pair; every rank has the same torch master and its own RANK."""
    prefix, env = setup(tmp_path, CUDA_VISIBLE_DEVICES="10,11,12,13,14,15")
    proc = gang_run("devices_gang", prefix, env, tmp_path / "err")
    assert proc.wait(timeout=120) == 0, (tmp_path / "err").read_text()
    seen = [json.loads((Path(prefix) / f"gang/devices/v1/rank-{k}.json").read_text())
            for k in range(3)]  # fmt: skip
    assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == ["10,11", "12,13", "14,15"]
    assert [s["RANK"] for s in seen] == [s["LOCAL_RANK"] for s in seen] == ["0", "1", "2"]
    assert {s["MASTER_PORT"] for s in seen} != {None} and len({s["MASTER_PORT"] for s in seen}) == 1
    assert {s["WORLD_SIZE"] for s in seen} == {"3"}
    record = read_record(open_prefix(prefix), "gang/devices/v1")
    assert record is not None and record.result == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"remote": "local", "ranks": 0}, "ranks=0"),
        ({"remote": "local", "ranks": "3"}, "ranks='3'"),
        ({"remote": "local", "ranks": True}, "ranks=True"),
        ({"ranks": 3}, "ranks=3 without remote"),
        ({"remote": "local", "max_preemptions": -1}, "max_preemptions=-1"),
        ({"max_preemptions": 2}, "max_preemptions=2 without remote"),
        ({"remote": "ray", "ranks": 3, "rank_placement": "sideways"}, "rank_placement='sideways'"),
        ({"remote": "ray", "ranks": 3, "rank_placement": 1}, "rank_placement=1"),
        ({"remote": "ray", "rank_placement": "spread"}, "rank_placement='spread' without ranks"),
        ({"remote": "local", "ranks": 3, "rank_placement": "strict_spread"},
         "rank_placement='strict_spread' with remote='local'"),
        ({"remote": "ray", "placement_timeout": "5m"}, "placement_timeout='5m' without ranks"),
        ({"remote": "ray", "ranks": 2, "placement_timeout": 0}, "placement_timeout=0"),
        ({"remote": "ray", "ranks": 2, "placement_timeout": "soon"}, "placement_timeout='soon'"),
    ],
)
def test_gang_options_are_checked_once_naming_step_field_and_fix(
    options: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidStepError) as caught:
        lower([apply("gang/bad", all_reduce, version="v1", out_path=OUT).with_options(**options)])
    message = str(caught.value)
    assert field in message and "gang/bad@v1" in message
    assert "use " in message or "add remote=" in message or "add ranks=" in message


def test_a_rank_placement_reaches_the_job_and_local_may_spread() -> None:
    """``rank_placement`` is typed once at lowering; the default is Ray's ``pack``; a
    ``spread`` (a preference) gang runs on ``local`` too."""
    step = apply("gang/p", all_reduce, version="v1", out_path=OUT)
    (default,) = lower([step.with_options(remote="ray", ranks=2)])
    (spread,) = lower([step.with_options(remote="local", ranks=2, rank_placement="spread")])
    assert default.run.rank_placement is RankPlacement.PACK
    assert spread.run.rank_placement is RankPlacement.SPREAD
    assert default.run.placement_timeout == DEFAULT_PLACEMENT_TIMEOUT_S
    (bounded,) = lower([step.with_options(remote="ray", ranks=2, placement_timeout="90s")])
    assert bounded.run.placement_timeout == 90.0
    assert bounded.fingerprint == default.fingerprint  # placement is not identity
