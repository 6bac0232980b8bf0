"""Light remote steps for ``test_gang_cancel.py`` (no JAX): a 2-rank gang and a plain
``local`` job, each appending ``<step> rank <K> pid <pid>`` to ``$MARIN_TEST_CALLS`` when it
starts and waiting for ``$MARIN_TEST_GATE`` before it returns. ``MARIN_TEST_RANKS`` sets
``resumable``'s world size (default 2). ``retried`` and ``final`` (``retries=2``) are for the
engines' own task retries (tests/prefect/test_prefect_final.py,
tests/airflow/test_airflow_final.py)."""

from __future__ import annotations

import os

from marin.execution.errors import RemoteJobError
from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.context import current_context
from tests.reliability.pipelines import append_line, wait_for_file


def gated(out_path: str) -> dict[str, int]:
    """Say it started, wait for the gate, write this rank's file; the rank and world size."""
    ctx = current_context()
    append_line(os.environ["MARIN_TEST_CALLS"], f"rank {ctx.rank} pid {os.getpid()}")
    wait_for_file(os.environ["MARIN_TEST_GATE"], timeout=120)
    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, f"rank-{ctx.rank}.txt"), "w") as f:
        f.write(str(ctx.world_size))
    return {"rank": ctx.rank, "world_size": ctx.world_size}


def stopped(out_path: str) -> None:
    """Say it ran, then fail as a step whose job was cancelled does: a ``final`` error."""
    append_line(os.environ["MARIN_TEST_CALLS"], f"stopped pid {os.getpid()}")
    error = RemoteJobError("local job marin-0 was stopped (cancelled)", "run again", "cancel/final")
    error.final = True  # what the core's remote call raises (``_final``)
    raise error


gang = [apply("cancel/gang", gated, version="v1", out_path=OUT).with_options(
    remote="local", ranks=2, retries=1)]  # fmt: skip
single = [apply("cancel/single", gated, version="v1", out_path=OUT).with_options(
    remote="local", retries=1)]  # fmt: skip
resumable = [apply("cancel/resume", gated, version="v1", out_path=OUT).with_options(
    remote="local", ranks=int(os.environ.get("MARIN_TEST_RANKS", "2")), resumable=True)]  # fmt: skip
retried = [apply("cancel/retried", gated, version="v1", out_path=OUT).with_options(
    remote="local", retries=2)]  # fmt: skip
final = [apply("cancel/final", stopped, version="v1", out_path=OUT).with_options(retries=2)]
