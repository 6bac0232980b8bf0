"""Prefect on a real Dask cluster: a ``dask scheduler`` and two ``dask worker`` processes (one
with ``--resources GPU=1``), each set up as its own machine, artifacts on moto's S3 server, and
a pipeline loaded from a file path (its module name exists only where the file is loaded).

Checked through what a user sees: the flow's task-run states, the records' provenance (which
worker process built each step), and the steps' own event log.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect_dask")
pytest.importorskip("s3fs")

from marin.execution.lazy import lower
from marin.execution.pipeline.graph import collect_steps
from marin.execution.pipeline.targets import load_target
from marin.execution.plan.options import RunOptions
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin_prefect.compile import CACHED_STATE_NAME, to_prefect_flow
from marin_testing.dask import DaskCluster
from tests.prefect.prefect_helpers import flow_run_id, task_runs
from tests.reliability.conftest import REPO, child_env

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

TARGET = "tests/prefect/dask_pipeline.py:pipeline"  # relative: the workers run elsewhere
SLOW = "tests/prefect/dask_pipeline.py:slow"
GPU_STEPS = {"dask/train-0@v1", "dask/train-1@v1"}


def events(path: Path) -> list[tuple[str, str, str, int]]:
    if not path.exists():
        return []
    return [(e, s, w, int(p)) for e, s, w, p in (x.split() for x in path.read_text().splitlines())]


def runner(address: str) -> Any:
    from prefect_dask import DaskTaskRunner

    return DaskTaskRunner(address=address)


def start_cluster(root: Path, s3: dict[str, str], log: Path, **extra: str) -> DaskCluster:
    from prefect.settings import PREFECT_API_URL

    env = child_env(
        **s3, MARIN_DASK_TEST_EVENTS=str(log), PREFECT_API_URL=str(PREFECT_API_URL.value()),
        **extra,
    )  # fmt: skip
    cluster = DaskCluster(root, env).__enter__()
    cluster.add_worker("cpu")
    cluster.add_worker("gpu", resources={"GPU": 1})
    cluster.wait_for_workers(2)
    return cluster


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
    s3_server: dict[str, str],
) -> Iterator[tuple[DaskCluster, Path]]:
    root = tmp_path_factory.mktemp("dask")
    log = root / "events.txt"
    cluster = start_cluster(root, s3_server, log)
    try:
        yield cluster, log
    finally:
        cluster.close()


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the relative target resolves here, and only here


def test_steps_build_once_spread_over_both_workers_gpu_steps_on_the_gpu_worker(
    cluster: tuple[DaskCluster, Path], in_repo: None
) -> None:
    dask, log = cluster
    prefix = f"s3://marin-tests/dask-{uuid.uuid4().hex[:10]}"
    specs = collect_steps(lower(list(load_target(TARGET))))
    flow = to_prefect_flow(
        TARGET,
        prefix=prefix,
        task_runner=runner(dask.address),
        options=RunOptions(max_concurrent=4),
    )
    state = flow(return_state=True)
    assert state.is_completed(), state

    ran = [e for e in events(log) if e[1].startswith("dask/") and e[1] != "dask/slow@v1"]
    assert Counter(s for e, s, _, _ in ran if e == "start") == {s.step_id: 1 for s in specs}
    runs = task_runs(flow_run_id(state), expected=len(specs))
    location = open_prefix(prefix)
    addresses = dask.worker_addresses()
    built_on: dict[str, str] = {}
    for spec in specs:
        record = read_record(location, spec.output_path)
        assert record is not None, spec.step_id
        engine = record.provenance["engine"]
        worker = engine["dask_worker"]
        assert worker in dask.workers, (spec.step_id, engine)
        # Who built what: the worker's own process, host and address, and the task run.
        assert record.provenance["pid"] == dask.workers[worker].pid == record.result["pid"]
        assert record.provenance["host"] == socket.gethostname()
        assert engine["dask_address"] == addresses[worker], (engine, addresses)
        assert engine["task_run_id"] == str(runs[spec.step_id].id)
        built_on[spec.step_id] = worker
    assert {built_on[s] for s in GPU_STEPS} == {"gpu"}, built_on
    shards = {built_on[f"dask/shard-{i}@v1"] for i in range(4)}
    assert shards == {"cpu", "gpu"}, built_on  # spread over both (they ran side by side)

    again = to_prefect_flow(
        TARGET,
        prefix=prefix,
        task_runner=runner(dask.address),
        options=RunOptions(max_concurrent=4),
    )
    second = again(return_state=True)
    assert second.is_completed(), second
    runs = task_runs(flow_run_id(second), expected=len(specs))
    assert {n: r.state.name for n, r in runs.items()} == dict.fromkeys(runs, CACHED_STATE_NAME)
    assert len([e for e in events(log) if e[0] == "start"]) == len(ran) // 2, "a re-run built"


def test_a_worker_that_cannot_load_the_pipeline_fails_the_step_naming_it(
    cluster: tuple[DaskCluster, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file exists where the flow runs, but not at that path on the workers (its folder is
    renamed once the flow has loaded it): one clear error, not a task stuck in Pending."""
    dask, _ = cluster
    folder = tmp_path / "here"
    folder.mkdir()
    (folder / "lonely.py").write_text(
        "from marin.execution.lazy import OUT, apply\n"
        "def make(out_path):\n"
        "    return 1\n"
        "pipeline = [apply('lonely/one', make, version='v1', out_path=OUT)]\n"
    )
    flow = to_prefect_flow(
        f"{folder}/lonely.py:pipeline", prefix=str(tmp_path / "p"), task_runner=runner(dask.address)
    )
    folder.rename(tmp_path / "gone")
    t0 = time.monotonic()
    state = flow(return_state=True)
    assert state.is_failed(), state
    message = str(state.message)
    assert "lonely/one@v1" in message
    assert "cannot load the pipeline" in message and f"{folder}/lonely.py:pipeline" in message
    assert "Dask worker" in message and ("cpu at tcp://" in message or "gpu at tcp://" in message)
    assert time.monotonic() - t0 < 60


def test_a_worker_that_imports_code_edited_after_the_driver_lowered_it_fails_the_step(
    cluster: tuple[DaskCluster, Path], tmp_path: Path
) -> None:
    """Round 24 finding 4: a worker loads the pipeline file when its task starts, while the
    record names the code digest the driver lowered. The file edited in between made the worker
    build the edited code under the driver's digest; it now checks, as a remote job does: the
    step fails before ``fn`` runs, naming the step and the fix, and nothing is committed."""
    dask, _ = cluster
    path = tmp_path / "edited_dask.py"
    path.write_text(
        "from marin.execution.lazy import OUT, apply\n"
        "def word(out_path):\n"
        "    return 'ORIGINAL'\n"
        "pipeline = [apply('edited/word', word, version='v1', out_path=OUT)]\n"
    )
    prefix = str(tmp_path / "p")
    flow = to_prefect_flow(f"{path}:pipeline", prefix=prefix, task_runner=runner(dask.address))
    path.write_text(path.read_text().replace("'ORIGINAL'", "'EDITED'"))
    state = flow(return_state=True)
    assert state.is_failed(), state
    message = str(state.message)
    assert "the Dask worker runs other code than the run lowered: word changed" in message
    assert "(step edited/word@v1)" in message and "run again" in message
    assert read_record(open_prefix(prefix), "edited/word/v1") is None


def test_a_worker_killed_mid_build_is_recovered_on_the_other_with_one_commit(
    tmp_path: Path,
    s3_server: dict[str, str],
    in_repo: None,
) -> None:
    """SIGKILL of the building worker's process group; Dask reruns the task on the other
    worker, whose build takes the dead attempt's lease over after its TTL (separate hosts: no
    PID check) and commits once."""
    log = tmp_path / "events.txt"
    lease = {"MARIN_LEASE_CHECK_PID": "0", "MARIN_LEASE_TTL": "3"}
    dask = start_cluster(tmp_path / "cluster", s3_server, log, **lease)
    try:
        prefix = f"s3://marin-tests/dask-kill-{uuid.uuid4().hex[:10]}"
        flow = to_prefect_flow(SLOW, prefix=prefix, task_runner=runner(dask.address))
        import threading

        result: list[Any] = []
        thread = threading.Thread(target=lambda: result.append(flow(return_state=True)))
        thread.start()
        deadline = time.monotonic() + 90
        while not events(log):
            assert time.monotonic() < deadline and thread.is_alive(), "the step never started"
            time.sleep(0.02)  # polls the marker the step's fn writes
        _, _, victim, victim_pid = events(log)[0]
        addresses = dask.worker_addresses()
        dask.kill_worker(victim)
        thread.join(120)
        assert not thread.is_alive() and result[0].is_completed(), result
        survivor = ({"cpu", "gpu"} - {victim}).pop()
        starts = [(w, p) for e, _, w, p in events(log) if e == "start"]
        assert starts == [(victim, victim_pid), (survivor, dask.workers[survivor].pid)]
        assert [w for e, _, w, _ in events(log) if e == "end"] == [survivor]  # one commit
        spec = lower(load_target(SLOW))[0]
        record = read_record(open_prefix(prefix), spec.output_path)
        assert record is not None and record.provenance["engine"]["dask_worker"] == survivor
        # Who built it: the survivor's process, at the address the scheduler knew it by.
        assert record.provenance["pid"] == dask.workers[survivor].pid
        assert record.provenance["engine"]["dask_address"] == addresses[survivor]
    finally:
        dask.close()
