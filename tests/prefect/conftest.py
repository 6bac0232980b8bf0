"""Prefect tests: one isolated ``prefect_test_harness`` for the whole session.

``isolate_prefect_home()`` runs at import time, before anything imports Prefect, so the session's
settings and cache records live in a fresh ``PREFECT_HOME`` and never leak between runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from marin_testing.prefect import isolate_prefect_home, start_harness, stop_harness

isolate_prefect_home()


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    start_harness()
    yield
    stop_harness()


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A side-effect file each toy step appends its name to when its ``fn`` runs."""
    from tests.prefect.prefect_pipelines import CALLS_ENV

    path = tmp_path / "calls.txt"
    monkeypatch.setenv(CALLS_ENV, str(path))
    return path
