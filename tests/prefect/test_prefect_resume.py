"""A resumable step's Prefect task retry resumes from the failed attempt's checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin.execution.lazy import OUT, apply
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin_prefect import to_prefect_flow
from tests.reliability import test_resumable as counting

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_a_task_retry_resumes(tmp_path: Path) -> None:
    counting.ran.clear()
    step = apply("retry", counting.fail_once, version="v1", out=OUT, upto=100, where="ckpt")
    prefix = str(tmp_path / "p")
    flow = to_prefect_flow(step.with_options(resumable=True, retries=1), prefix=prefix)
    state = flow(return_state=True)
    assert state.is_completed(), state
    assert counting.ran == list(range(55)) + list(range(50, 101))
    record = read_record(open_prefix(prefix), "retry/v1")
    assert record is not None and record.provenance["attempt"] == {"number": 2, "resumed": True}
