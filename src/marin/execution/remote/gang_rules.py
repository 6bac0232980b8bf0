"""What every backend's gang shares: each rank's environment, and how a rank's end is judged.

A gang (``with_options(ranks=N)``) is one job of N processes that meet at start-up (rank 0 is
the coordinator). A rank that returned is done; the first rank to end otherwise ends the gang:
killed by a signal (or its node gone), the job is **lost** (``{"lost": true, "rank", "signal"}``,
resubmitted under ``max_preemptions``); its ``fn`` raised, or it exited without an outcome, the
job **failed** with that rank's outcome (``retries`` count it).
"""

from __future__ import annotations

import signal
import socket

from marin.execution.pipeline.isolated_child import RANK_ENV, WORLD_ENV

EXIT_GRACE_S = 30.0
"""How long a rank that returned may take to exit once every rank returned (JAX's exit waits
for its peers)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that no one listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def rank_env(
    rank: int, size: int, host: str, ports: tuple[int, int], local_rank: int
) -> dict[str, str]:
    """What rank ``rank`` of ``size`` reads: JAX's coordinator on ``ports[0]``, torch's
    master on ``ports[1]``, both on rank 0's ``host``; ``local_rank``: its index among the
    ranks on its own host."""
    return {
        "JAX_COORDINATOR_ADDRESS": f"{host}:{ports[0]}",
        "JAX_NUM_PROCESSES": str(size),
        "JAX_PROCESS_ID": str(rank),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(ports[1]),
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(local_rank),
        RANK_ENV: str(rank),
        WORLD_ENV: str(size),
    }


def judge_rank(
    rank: int, code: int | None, outcome: dict[str, object] | None
) -> dict[str, object] | None:
    """A rank's end so far (``code``: its exit status, negative for a signal, None while it
    runs; ``outcome``: what ``isolated_child`` wrote, if it did): None while it runs or once it
    returned; else what ends the gang. A rank whose ``fn`` raised ends the gang as soon as it
    says so, even before it exits (JAX's exit waits for every rank)."""
    if outcome is not None and outcome.get("ok") is True:
        return None  # it returned: how its exit goes no longer matters
    if code is not None and code < 0:
        return {"lost": True, "rank": rank, "signal": _signal_name(-code)}
    if outcome is None and code is None:
        return None
    if outcome is None:
        outcome = {"ok": False, "type": "RuntimeError", "traceback": "", "errno": None,
                   "message": f"exited with code {code} without an outcome"}  # fmt: skip
    return {**outcome, "message": f"rank {rank}: {outcome.get('message', '')}"}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
