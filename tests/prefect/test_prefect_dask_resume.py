"""A resumable step on a real Dask cluster: the worker that builds it is SIGKILLed at iteration
55; Dask reruns the task on the other worker, which resumes from the dead one's checkpoint."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect_dask")

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin_prefect.compile import to_prefect_flow
from marin_testing.dask import DaskCluster
from tests.reliability.conftest import REPO, child_env
from tests.reliability.pipelines import wait_for_file
from tests.reliability.test_resumable import iterations

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

TARGET = "tests/reliability/resumable_pipeline.py:counting"  # checkpoints under its output


def test_a_killed_dask_worker_resumes_on_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL
    from prefect_dask import DaskTaskRunner

    monkeypatch.chdir(REPO)  # the relative target resolves here
    counter, held, release = tmp_path / "counter", tmp_path / "held", tmp_path / "release"
    env = child_env(
        MARIN_TEST_COUNTER=str(counter),
        MARIN_TEST_HOLD_AT=f"55:{held}:{release}",  # each worker's attempt holds at 55
        PREFECT_API_URL=str(PREFECT_API_URL.value()),
    )
    prefix = str(tmp_path / "prefix")
    with DaskCluster(tmp_path / "cluster", env) as dask:
        pids = {dask.add_worker(name): name for name in ("a", "b")}
        dask.wait_for_workers(2)
        flow = to_prefect_flow(
            TARGET, prefix=prefix, task_runner=DaskTaskRunner(address=dask.address)
        )
        result: list[Any] = []
        thread = threading.Thread(target=lambda: result.append(flow(return_state=True)))
        thread.start()
        wait_for_file(str(held), timeout=120)
        victim = pids[int(held.read_text())]  # fn runs in the worker's own process
        dask.kill_worker(victim)
        release.touch()  # the rerun on the other worker holds at 55 too, until now
        thread.join(180)
        assert not thread.is_alive() and result[0].is_completed(), result
    assert iterations(counter) == list(range(55)) + list(range(50, 101))
    record = read_record(open_prefix(prefix), "count/v1")
    assert record is not None, "committed once"
    assert record.provenance["attempt"] == {"number": 2, "resumed": True}
    assert record.provenance["engine"]["dask_worker"] != victim
    assert record.result == {"started_at": 50}
