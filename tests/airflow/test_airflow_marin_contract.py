"""The Airflow task runtime builds a hand-written Marin pipeline (``run`` takes the config)."""

from __future__ import annotations

import os
from pathlib import Path

from marin.execution.lazy import lower
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin_airflow import runtime
from tests import marin_contract_pipeline as mp


def test_task_runtime_builds_hand_written_steps_with_their_config_and_context(
    tmp_path: Path,
) -> None:
    prefix = str(tmp_path / "p")
    target = "tests.marin_contract_pipeline:pipeline"
    runtime.clear_cache()
    results = {}
    for handle in (mp.CORPUS, mp.COUNT, mp.ISOLATED):  # the order the DAG's edges give
        out = runtime.run_step(
            target=target, step=handle.step_id, fingerprint=lower(handle).fingerprint,
            prefix=prefix, dag_dir=str(tmp_path),
        )  # fmt: skip
        assert out["action"] == "built", out
        results[handle.name] = out
    assert (tmp_path / "p/contract/pinned-corpus/data.txt").read_text() == mp.TEXT
    location = open_prefix(prefix)
    for name, tpu in (("contract/count", "v4-8"), ("contract/count-isolated", "v5-16")):
        record = read_record(location, f"{name}/v1")
        assert record is not None
        result = dict(record.result)
        pid = result.pop("pid")
        assert result == mp.expected(prefix, name, tpu)
        assert (pid != os.getpid()) == name.endswith("isolated")
