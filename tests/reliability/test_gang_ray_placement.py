"""A Ray gang the cluster cannot place: one node on loopback, three ranks that must each have a
node of their own (``strict_spread``). The wait for placement is bounded and said."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.test_gang import JAX, gang_run
from tests.reliability.test_remote import setup

pytest.importorskip("ray.job_submission")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A head alone, with CPUs enough for the gang: only ``strict_spread`` cannot be met."""
    from marin_testing.ray import RayCluster

    root = tmp_path_factory.mktemp("ray")
    _, env = setup(root, MARIN_TEST_BACKEND="ray")
    with RayCluster(env, num_cpus=3) as ray:
        yield root, {**env, "RAY_ADDRESS": ray.address}


def test_a_gang_ray_cannot_place_fails_within_its_placement_timeout(
    one_node: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Three ``strict_spread`` ranks on one node: the log says what the gang waits for and
    what the cluster has; once ``placement_timeout`` passes the step fails naming the step,
    the fields and the fix, no rank ran, nothing is committed, and the placement group is
    removed. ``retries=1`` is not spent on it (``fn`` never ran)."""
    root, env = one_node
    prefix = str(tmp_path / "prefix")
    env = {**env, "MARIN_TEST_RANK_PLACEMENT": "strict_spread",
           "MARIN_TEST_PLACEMENT_TIMEOUT": "8s", "MARIN_TEST_RETRIES": "1"}  # fmt: skip
    proc = gang_run("jax_gang", prefix, env, tmp_path / "err", "--json")
    out, _ = proc.communicate(timeout=300)
    err = (tmp_path / "err").read_text()
    assert proc.returncode != 0, err
    assert "gang/jax@v1" in err and "rank_placement='strict_spread'" in err, err
    assert "within placement_timeout=8s" in err and "raise placement_timeout" in err, err
    assert "3 bundles of {CPU: 1} (STRICT_SPREAD)" in err and "1 live node(s)" in err, err
    assert json.loads(out)["ok"] is False, out
    assert "retry gang/jax@v1" not in err and "not retried" in err, err
    assert read_record(open_prefix(prefix), JAX) is None
    assert not (root / "calls").exists()  # no rank started
    logs = "".join(p.read_text() for p in Path(prefix).rglob("log.txt"))
    assert "gang of 3: waiting up to 8s for placement: 3 bundles" in logs, logs
    from ray.util.state import list_placement_groups

    groups = list_placement_groups(address=env["RAY_ADDRESS"], detail=True)
    assert groups and all(g.state == "REMOVED" for g in groups), groups
