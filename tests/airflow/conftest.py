"""Airflow adapter tests: one migrated SQLite ``AIRFLOW_HOME`` per session, real Airflow.

Airflow commands run in subprocesses (``python -m airflow``) so this process never imports
Airflow's runtime; the sandbox's database is migrated once and copied for later sandboxes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    pytest.importorskip("airflow.sdk")
    from marin_testing.airflow import AirflowSandbox

    box = AirflowSandbox(str(tmp_path_factory.mktemp("airflow")), pythonpath=[str(ROOT)])
    box.migrate()
    yield box


@pytest.fixture
def calls(tmp_path: Path) -> Path:
    """The side-effect file the toy steps append their events to."""
    return tmp_path / "calls.jsonl"


@pytest.fixture
def marin_airflow_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog``, listening on the ``marin.airflow`` logger itself, at WARNING and above.

    Airflow's first import in a process (inside a runtime call, when a test runs alone or
    first) configures logging and removes pytest's capturing handler from the root logger, so a
    warning logged after it would reach ``caplog`` in the full suite only. A handler on the
    logger itself survives that; the logger stops propagating meanwhile, so nothing is
    captured twice."""
    logger = logging.getLogger("marin.airflow")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.fixture(autouse=True)
def _no_codex_left_behind() -> Iterator[None]:
    """A runtime function called in this process sets the ambient version codex, as each
    Airflow task does in its own: later tests must not lower under it."""
    yield
    from marin.execution.pipeline.versions import use_codex

    use_codex(None)
