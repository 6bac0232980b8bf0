from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from marin_prefect.testing import isolate_prefect_home  # does not import prefect

# Where the extras are installed (or in CI) an unexpected skip fails the run.
pytest_plugins = ["tests.skip_policy"]

# Prefect keeps cache records and its database under PREFECT_HOME; every test session gets its
# own, set before anything imports Prefect.
isolate_prefect_home()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from marin_prefect.testing import stop_harness

    stop_harness()


@pytest.fixture(params=["local", "memory"])
def prefix(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """The same tests on local disk and on fsspec's in-memory file system."""
    if request.param == "local":
        yield str(tmp_path / "prefix")
    else:
        import fsspec

        name = f"memory://t-{uuid.uuid4().hex[:10]}"
        yield name
        fs = fsspec.filesystem("memory")
        if fs.exists(name):
            fs.rm(name, recursive=True)
