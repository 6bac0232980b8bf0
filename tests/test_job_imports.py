"""A remote step's job imports its pipeline file, hence ``marin.execution.lazy``: that import
stays free of the store, the code digest and fsspec, which a job never needs (they were most
of a ``local`` job's start-up). Names that need them (``lower``, ``run``, ``resolve``) are
imported on first use, and still work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("fsspec", "importlib.abc", "marin.execution.store", "marin.execution.digest.code")

PROBE = """
import json, sys
import marin.execution.pipeline.isolated_child
from marin.execution.lazy import OUT, ArtifactStep, JsonArtifact, apply
loaded = sorted(m for m in sys.modules if m.startswith(tuple(sys.argv[1:])))
from marin.execution.lazy import lower, run
print(json.dumps({"loaded": loaded, "lower": lower.__module__, "run": run.__module__}))
"""


def test_a_job_imports_its_pipeline_without_the_store_the_digest_or_fsspec() -> None:
    paths = [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    out = subprocess.run(
        [sys.executable, "-P", "-c", PROBE, *HEAVY],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(out.stdout)
    assert found["loaded"] == []
    assert found["lower"] == "marin.execution.pipeline.lower"
    assert found["run"] == "marin.execution.run.api"
