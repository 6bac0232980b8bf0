"""File targets for the Airflow scheduler benchmark: ``benchmarks/airflow_graphs.py:hundred``
and ``:one``.

A 100-step no-op random graph and a 1-step one, under their own step names so a run of one never
serves the other's steps. Loaded by path on the Airflow workers (which puts ``benchmarks/`` on
``sys.path`` for ``graphs``).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graphs  # benchmarks/ is not a package: found through the path set above

hundred = graphs.make("random", 100, seed=3, tag="af100")[1]
one = graphs.make("chain", 1, tag="af1")[1]
