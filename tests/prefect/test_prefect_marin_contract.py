"""The compiled Prefect flow runs a hand-written Marin pipeline (``run`` takes the config)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin_prefect import to_prefect_flow
from tests import marin_contract_pipeline as mp

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_compiled_flow_runs_hand_written_steps_with_their_config_and_context(
    tmp_path: Path,
) -> None:
    prefix = str(tmp_path)
    state = to_prefect_flow(mp.pipeline, prefix=prefix)(return_state=True)
    assert state.is_completed(), state
    location = open_prefix(prefix)
    for name, tpu in (("contract/count", "v4-8"), ("contract/count-isolated", "v5-16")):
        record = read_record(location, f"{name}/v1")
        assert record is not None
        result = dict(record.result)
        pid = result.pop("pid")
        assert result == mp.expected(prefix, name, tpu)
        assert (pid != os.getpid()) == name.endswith("isolated")
    assert (tmp_path / "contract/pinned-corpus/data.txt").read_text() == mp.TEXT
