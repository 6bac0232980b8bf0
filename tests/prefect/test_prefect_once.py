"""The Prefect entry flow opens its prefix, parses its target, collects the graph and
validates its options once each (issue 44; the table in docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

import marin_prefect.compile  # noqa: F401  (imported before the counters wrap its imports)
from marin_prefect.flows import marin_pipeline
from tests.prefect.prefect_helpers import TOY_TARGET
from tests.request_counts import count_calls

pytestmark = pytest.mark.usefixtures("prefect_harness", "calls")


def test_the_entry_flow_opens_parses_collects_and_validates_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = count_calls(monkeypatch)
    outputs = marin_pipeline(target=TOY_TARGET, prefix=str(tmp_path / "p"), force=["toy/corpus"])
    assert outputs, outputs
    assert counts["open"] == 1 and counts["check"] == 1, counts
    assert counts["parse"] == 1, counts
    assert counts["collect"] == 1, counts
    assert counts["options"] == 1, counts
