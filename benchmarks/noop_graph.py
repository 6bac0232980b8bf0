"""A file target for the distributed benchmarks: ``benchmarks/noop_graph.py:pipeline``.

The same no-op random graph (``graphs.random_dag``, ``$MARIN_BENCH_NOOP_N`` steps, seed 3) for
every runner; loaded by path, so a Dask worker resolves its functions by loading this file
(which puts ``benchmarks/`` on ``sys.path`` for ``graphs``).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graphs  # benchmarks/ is not a package: found through the path set above

pipeline = graphs.make("random", int(os.environ.get("MARIN_BENCH_NOOP_N", "40")), seed=3)[1]
