"""The ``runner`` fixture: every scenario runs on every runner that is installed.

An engine's runner lives in ``runner_<engine>.py`` beside this file and is used only when its
engine imports; the local runner always runs.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conformance.scenarios import CALLS_ENV

RUNNERS = {
    "local": ("tests.conformance.runner_local", "LocalRunner", None),
    "prefect": ("tests.conformance.runner_prefect", "PrefectRunner", "prefect"),
    "airflow": ("tests.conformance.runner_airflow", "AirflowRunner", "airflow.sdk"),
}


# Airflow runs every scenario under a real scheduler (minutes, not seconds): `slow`.
SLOW_RUNNERS = {"airflow"}


@pytest.fixture(
    params=[
        pytest.param(name, marks=pytest.mark.slow) if name in SLOW_RUNNERS else name
        for name in sorted(RUNNERS)
    ],
    scope="module",
)
def runner(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The runner, closed after its module (an xdist worker never runs ``atexit``: an
    Airflow runner's services would idle on, a tenth of a core, to the suite's end)."""
    module_name, class_name, engine = RUNNERS[request.param]
    if engine is not None:
        pytest.importorskip(engine)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            pytest.skip(f"no {request.param} runner yet")
        raise
    made = getattr(module, class_name)()
    yield made
    getattr(made, "close", lambda: None)()


@pytest.fixture
def calls_file(tmp_path: Any) -> str:
    return str(tmp_path / "calls.jsonl")


@pytest.fixture
def local_prefix(tmp_path: Any) -> str:
    """A prefix every runner can reach: engines may run steps in other processes."""
    path = tmp_path / f"prefix-{uuid.uuid4().hex[:8]}"
    os.makedirs(path)
    return str(path)


@pytest.fixture
def env(calls_file: str) -> dict[str, str]:
    return {CALLS_ENV: calls_file}
