"""No runtime adapter module loads the test harnesses (``marin_testing``).

A worker imports ``marin_airflow.runtime`` or ``marin_prefect.compile``; the loopback services
that start Airflow, Celery, PostgreSQL, Prefect and Dask are for tests and benchmarks only. Each
adapter's modules are imported in a fresh interpreter, which then lists what it loaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The adapter packages a worker imports, and the engine each one needs to import at all.
ADAPTERS = {"marin_airflow": "airflow", "marin_prefect": "prefect"}

PROBE = """
import importlib, json, sys
loaded = {}
for name in sys.argv[1:]:
    importlib.import_module(name)
    loaded[name] = sorted(m for m in sys.modules if m.split(".")[0] == "marin_testing")
print(json.dumps(loaded))
"""


def runtime_modules(package: str) -> list[str]:
    """Every module of ``package``, found on disk (a new module is covered without a list)."""
    folder = ROOT / "adapters" / package
    return [package] + [f"{package}.{info.name}" for info in pkgutil.iter_modules([str(folder)])]


@pytest.mark.parametrize("package", sorted(ADAPTERS))
def test_runtime_adapter_modules_do_not_load_the_test_harnesses(
    package: str, tmp_path: Path
) -> None:
    if importlib.util.find_spec(ADAPTERS[package]) is None:
        pytest.skip(f"{ADAPTERS[package]} is not installed")
    modules = runtime_modules(package)
    assert f"{package}.runtime" in modules or f"{package}.compile" in modules
    # Airflow and Prefect write their homes at import: keep them in the test's directory.
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {name: [] for name in modules}


def test_the_airflow_task_runtime_does_not_load_the_exporter() -> None:
    """A task reads the DAG file's contract (``marin_airflow.contract``), not the code generator."""
    probe = "import sys, marin_airflow.runtime; print('marin_airflow.export' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
