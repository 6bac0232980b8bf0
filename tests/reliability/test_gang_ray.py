"""Gang steps on a real 3-node Ray cluster on loopback (one CPU a node): a placement group of
one bundle per rank, three ranks that meet through ``jax.distributed.initialize()`` (the first
test), or over TCP at the gang's torch master (``tcp_gang``: no JAX start-up in each rank)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin.execution.remote.procs import start_time
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.test_gang import JAX, TCP, assert_rank_log, gang_run, rank_starts, wait_gone
from tests.reliability.test_remote import setup, wait_for_text

pytest.importorskip("ray.job_submission")
pytest.importorskip("jax")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A head and two worker nodes of one CPU each: a 3-rank gang fills the cluster."""
    from marin_testing.ray import RayCluster

    root = tmp_path_factory.mktemp("ray")
    _, env = setup(root, MARIN_TEST_BACKEND="ray", MARIN_TEST_FAIL=str(root / "fail"))
    with RayCluster(env, num_cpus=1, workers=2) as ray:
        yield root, {**env, "RAY_ADDRESS": ray.address}


def fresh(root: Path, tmp_path: Path) -> str:
    """A new prefix; the cluster's control files (shared by the module) cleared."""
    for name in ("calls", "gate", "fail"):
        (root / name).unlink(missing_ok=True)
    return str(tmp_path / "prefix")


def test_a_ray_gang_all_reduces_in_one_placement_group(
    cluster: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Three ranks, one per node (``rank_placement="strict_spread"``: Ray's STRICT_SPREAD),
    meet and sum ``rank + 1``: one Ray job, one record, rank 0's value; each rank's log
    readable on its own."""
    root, env = cluster
    prefix = fresh(root, tmp_path)
    (root / "gate").touch()
    env = {**env, "MARIN_TEST_RANK_PLACEMENT": "strict_spread"}
    proc = gang_run("jax_gang", prefix, env, tmp_path / "err", "--json")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, (tmp_path / "err").read_text()
    record = read_record(open_prefix(prefix), JAX)
    assert record is not None and record.result["sum"] == 6.0 and record.result["rank"] == 0
    assert record.provenance["job"]["backend"] == "ray"
    for rank in range(3):
        seen = json.loads((Path(prefix) / JAX / f"rank-{rank}.json").read_text())
        assert seen == {"process_index": rank, "devices": 3}
    assert len((root / "calls").read_text().splitlines()) == 3
    log = (Path(prefix) / "gang/jax/v1.marin/log.txt").read_text()
    assert "gang of 3: placement group reserved in" in log and "(STRICT_SPREAD)" in log, log
    nodes = log.split("gang of 3: ranks on nodes ", 1)[1].splitlines()[0].split(", ")
    assert len(set(nodes)) == 3, nodes  # one rank a node
    assert record.provenance["job"]["rank_placement"] == "strict_spread"
    assert json.loads(out)["steps"][0]["job"]["preemptions"] == 0
    assert_rank_log(prefix, env, 2)  # Ray's forwarded lines, labelled by rank


def test_a_ray_rank_that_raises_ends_every_rank_and_retries_count_it(
    cluster: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Rank 1's ``fn`` raises: the Ray job fails as one (every rank's process ends, none
    left waiting in the all-reduce) and ``retries=1`` runs one new gang; no preemption."""
    root, env = cluster
    prefix = fresh(root, tmp_path)
    (root / "fail").touch()
    (root / "gate").touch()
    proc = gang_run("tcp_gang", prefix, {**env, "MARIN_TEST_RETRIES": "1"}, tmp_path / "err")
    wait_gone(rank_starts(root, 3, timeout=300), timeout=120)  # the failed gang, all of it
    assert proc.wait(timeout=600) == 0, (tmp_path / "err").read_text()
    assert "rank 1: rank 1 diverged" in (tmp_path / "err").read_text()
    record = read_record(open_prefix(prefix), TCP)
    assert record is not None and record.result["sum"] == 6.0
    assert record.provenance["job"]["preemptions"] == 0
    assert len((root / "calls").read_text().splitlines()) == 6  # two gangs: the retry's


def test_a_killed_driver_reattaches_to_its_one_ray_gang(
    cluster: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """SIGKILL ``marin run`` while its Ray gang runs: the gang runs on, and the next run
    reattaches to that Ray job (one gang, never two) and commits its value."""
    root, env = cluster
    prefix = fresh(root, tmp_path)
    first = gang_run("tcp_gang", prefix, env, tmp_path / "first.err")
    ranks = rank_starts(root, 3, timeout=300)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert all(start_time(pid) is not None for pid in ranks)  # the gang outlived its driver
    second = gang_run("tcp_gang", prefix, env, tmp_path / "second.err")
    wait_for_text(tmp_path / "second.err", "reattach gang/tcp@v1", timeout=120)
    (root / "gate").touch()
    assert second.wait(timeout=600) == 0, (tmp_path / "second.err").read_text()
    assert len((root / "calls").read_text().splitlines()) == 3  # one gang
    record = read_record(open_prefix(prefix), TCP)
    assert record is not None and record.result["sum"] == 6.0
    assert record.provenance["job"]["backend"] == "ray"
    assert record.provenance["job"]["preemptions"] == 0


def test_a_killed_ray_rank_ends_the_gang_and_it_is_resubmitted_once(
    cluster: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """SIGKILL one rank's process: every rank ends, the Ray job is lost (not failed), and one
    new gang builds the step."""
    root, env = cluster
    prefix = fresh(root, tmp_path)
    proc = gang_run("tcp_gang", prefix, env, tmp_path / "err")
    first = rank_starts(root, 3, timeout=300)
    os.kill(first[0], signal.SIGKILL)
    wait_gone(first)
    second = rank_starts(root, 6, timeout=300)[3:]
    assert not set(second) & set(first)
    (root / "gate").touch()
    assert proc.wait(timeout=600) == 0, (tmp_path / "err").read_text()
    assert "preempted gang/tcp@v1" in (tmp_path / "err").read_text()
    record = read_record(open_prefix(prefix), TCP)
    assert record is not None and record.result["sum"] == 6.0
    assert record.provenance["job"]["preemptions"] == 1
    assert len((root / "calls").read_text().splitlines()) == 6
