"""Time Marin's own ``StepRunner`` (PyPI ``marin-core``) on a graph given as JSON: the peer row.

Runs ONLY under the peer venv's interpreter (``marin-core`` ships a top-level ``marin`` package
too, so it must never share a venv or ``sys.path`` with this project; ``run.py`` starts this
file with that interpreter, with ``-I`` and a clean environment). Nothing here imports the
project. Install the peer with ``PEER_DIR=DIR ../shared/peers/setup-marin-peer.sh`` and point
``MARIN_PEER_PYTHON`` at ``DIR/venv/bin/python`` (see benchmarks/README.md).

    python peer_marin.py '{"steps": [["a", []], ["b", [0]]], "reps": 1, "max_concurrent": 8}'

prints one JSON line: the wall time of ``StepRunner().run(specs, max_concurrent=...)`` per
repetition, each on a fresh temporary prefix, with no-op steps.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any


def noop(output_path: str) -> None:
    """The step body: nothing, so what is timed is the runner."""
    return None


def main(args: dict[str, Any]) -> dict[str, Any]:
    # Imported by name: this is marin-core's ``marin``, not this project's (which type checkers
    # would otherwise check these calls against).
    StepRunner: Any = importlib.import_module("marin.execution.step_runner").StepRunner
    StepSpec: Any = importlib.import_module("marin.execution.step_spec").StepSpec

    graph: list[list[Any]] = args["steps"]
    times = []
    for rep in range(int(args.get("reps", 1))):
        os.sync()  # the last run's files written back now, not during this one
        with tempfile.TemporaryDirectory(prefix="marin-peer-") as prefix:
            specs: list[Any] = []
            for name, deps in graph:
                specs.append(
                    StepSpec(
                        name=name,
                        output_path_prefix=prefix,
                        deps=[specs[i] for i in deps],
                        hash_attrs={"rep": rep},
                        fn=noop,
                    )
                )
            t0 = time.perf_counter()
            StepRunner().run(specs, max_concurrent=int(args.get("max_concurrent", 8)))
            times.append(time.perf_counter() - t0)
    return {"n": len(graph), "run_s": times, "run_median_s": statistics.median(times)}


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]))
    sys.stdout.write("\n" + json.dumps(result) + "\n")
