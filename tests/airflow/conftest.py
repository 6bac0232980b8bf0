"""Airflow adapter tests: one migrated SQLite ``AIRFLOW_HOME`` per session, real Airflow.

Airflow commands run in subprocesses (``python -m airflow``) so this process never imports
Airflow's runtime; the sandbox's database is migrated once and copied for later sandboxes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    pytest.importorskip("airflow.sdk")
    from marin_airflow.testing import AirflowSandbox

    box = AirflowSandbox(str(tmp_path_factory.mktemp("airflow")), pythonpath=[str(ROOT)])
    box.migrate()
    yield box


@pytest.fixture
def calls(tmp_path: Path) -> Path:
    """The side-effect file the toy steps append their events to."""
    return tmp_path / "calls.jsonl"
