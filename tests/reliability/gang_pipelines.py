"""Gang steps (``with_options(remote=..., ranks=3)``) for ``test_gang.py``.

Controlled through environment variables, which the jobs and their ranks inherit:
- ``MARIN_TEST_CALLS``: each rank appends ``<step> rank <K> pid <pid>`` once the gang met;
- ``MARIN_TEST_GATE``: a rank waits for this file (after the gang met) before it finishes;
- ``MARIN_TEST_FAIL``: a file; while it exists, rank 1 removes it and raises (the retry
  succeeds);
- ``MARIN_TEST_BACKEND``: the gangs' backend (default ``local``);
- ``MARIN_TEST_UNITS``: ``trained``'s number of units (default 6);
- ``MARIN_TEST_MAX_PREEMPTIONS``: set, ``units_gang``'s ``max_preemptions``;
- ``MARIN_TEST_RANK_PLACEMENT``: ``jax_gang``'s ``rank_placement`` (default: none given);
- ``MARIN_TEST_PLACEMENT_TIMEOUT``: ``jax_gang``'s ``placement_timeout`` (default: none given).

``jax_gang`` imports JAX in every rank (seconds each): one test proves JAX meets through the
gang's environment. ``tcp_gang`` and ``fragile_gang`` are the same gang with only the standard
library (``tcp_sum``), for the tests of Marin's gang machinery.
"""

from __future__ import annotations

import json
import os
import socket
import time

from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.context import current_context
from tests.reliability.pipelines import append_line, wait_for_file

BACKEND = os.environ.get("MARIN_TEST_BACKEND", "local")


def _started(step: str) -> None:
    ctx, env = current_context(), os.environ
    if env.get("MARIN_TEST_CALLS"):
        append_line(env["MARIN_TEST_CALLS"], f"{step} rank {ctx.rank} pid {os.getpid()}")


def _met(step: str) -> None:
    """What a rank does once its gang met: say so, note its start, wait for the gate, and
    (rank 1, while ``MARIN_TEST_FAIL`` exists) raise."""
    ctx = current_context()
    print(f"rank {ctx.rank} of {ctx.world_size} met", flush=True)  # `marin logs --rank` reads it
    _started(step)
    if os.environ.get("MARIN_TEST_GATE"):
        wait_for_file(os.environ["MARIN_TEST_GATE"], timeout=120)
    fail = os.environ.get("MARIN_TEST_FAIL")
    if fail and ctx.rank == 1 and os.path.exists(fail):
        os.unlink(fail)
        raise RuntimeError("rank 1 diverged")


def all_reduce(out_path: str) -> dict[str, object]:
    """Meet the other ranks through ``jax.distributed.initialize()`` (from the gang's
    environment alone) and sum ``rank + 1`` over the gang on CPU."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(initialization_timeout=120)
    ctx = current_context()
    _met("gang/jax")
    gathered = multihost_utils.process_allgather(jnp.array([ctx.rank + 1.0]))
    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, f"rank-{ctx.rank}.json"), "w") as f:
        json.dump({"process_index": jax.process_index(), "devices": jax.device_count()}, f)
    jax.distributed.shutdown()
    return {"sum": float(gathered.sum()), "rank": ctx.rank, "world_size": ctx.world_size,
            "env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                               "JAX_PROCESS_ID", "JAX_NUM_PROCESSES")}}  # fmt: skip


_TIMEOUT_S = 120.0  # as jax.distributed's initialization_timeout above


def _recv_int(conn: socket.socket, deadline: float) -> int:
    """One integer line from a member of the gang; a member gone hangs the caller until
    ``deadline``, as a collective with a member missing does (only killing the gang ends it)."""
    data = b""
    while not data.endswith(b"\n"):
        conn.settimeout(max(deadline - time.monotonic(), 0.01))
        chunk = conn.recv(64)
        if not chunk:  # the peer is gone: wait out the collective's timeout
            time.sleep(max(deadline - time.monotonic(), 0))
            raise TimeoutError("a rank of the gang left before the collective")
        data += chunk
    return int(data)


def _rendezvous(rank: int, size: int) -> list[socket.socket]:
    """Meet at ``MASTER_ADDR:MASTER_PORT`` (the gang's environment alone): rank 0 listens and
    answers once every other rank connected; the others connect and wait for that answer.
    Rank 0 gets its ``size - 1`` connections (in rank order), the others their one."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    deadline = time.monotonic() + _TIMEOUT_S
    if rank == 0:
        with socket.create_server((addr, port), backlog=size) as server:
            server.settimeout(_TIMEOUT_S)
            peers = {}
            while len(peers) < size - 1:
                conn, _ = server.accept()
                peers[_recv_int(conn, deadline)] = conn
        for conn in peers.values():
            conn.sendall(b"0\n")  # every rank is here: the gang met
        return [peers[k] for k in sorted(peers)]
    while True:  # rank 0 may not listen yet
        try:
            conn = socket.create_connection((addr, port), timeout=_TIMEOUT_S)
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"no rank 0 at {addr}:{port}"
            time.sleep(0.02)
    conn.sendall(f"{rank}\n".encode())
    _recv_int(conn, deadline)
    return [conn]


def tcp_sum(out_path: str) -> dict[str, object]:
    """``all_reduce`` with the standard library: the ranks meet over TCP at the gang's torch
    master and rank 0 sums ``rank + 1`` over the gang and sends every rank the sum, so no rank
    gets past the sum while another is missing."""
    ctx = current_context()
    conns = _rendezvous(ctx.rank, ctx.world_size)
    _met("gang/tcp")
    deadline = time.monotonic() + _TIMEOUT_S
    if ctx.rank == 0:
        total = 1 + sum(_recv_int(conn, deadline) for conn in conns)
        for conn in conns:
            conn.sendall(f"{total}\n".encode())
    else:
        conns[0].sendall(f"{ctx.rank + 1}\n".encode())
        total = _recv_int(conns[0], deadline)
    for conn in conns:
        conn.close()
    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, f"rank-{ctx.rank}.json"), "w") as f:
        json.dump({"rank": ctx.rank, "sum": total}, f)
    return {"sum": float(total), "rank": ctx.rank, "world_size": ctx.world_size}


def train_units(units: int, out_path: str) -> dict[str, object]:
    """``units`` units of work; rank 0 keeps a checkpoint (the next unit) after each, and
    every rank starts from it: a resubmitted gang resumes."""
    ctx = current_context()
    _started("gang/units")
    assert ctx.checkpoint_path is not None
    state = os.path.join(ctx.checkpoint_path, "next_unit")
    start = int(open(state).read()) if os.path.exists(state) else 0
    for unit in range(start, units):
        time.sleep(0.2)  # one unit of training
        append_line(os.environ["MARIN_TEST_UNITS_LOG"], f"rank {ctx.rank} unit {unit}")
        if ctx.rank == 0 and ctx.still_holds_lease():
            os.makedirs(ctx.checkpoint_path, exist_ok=True)
            with open(state + ".tmp", "w") as f:
                f.write(str(unit + 1))
            os.replace(state + ".tmp", state)
    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, f"rank-{ctx.rank}.txt"), "w") as f:
        f.write(f"started at unit {start}")
    return {"started_at": start, "rank": ctx.rank}


jax_gang = [
    apply("gang/jax", all_reduce, version="v1", out_path=OUT).with_options(
        remote=BACKEND, ranks=3, retries=int(os.environ.get("MARIN_TEST_RETRIES", "0")),
        rank_placement=os.environ.get("MARIN_TEST_RANK_PLACEMENT"),
        placement_timeout=os.environ.get("MARIN_TEST_PLACEMENT_TIMEOUT"),
    )
]
tcp_gang = [
    apply("gang/tcp", tcp_sum, version="v1", out_path=OUT).with_options(
        remote=BACKEND, ranks=3, retries=int(os.environ.get("MARIN_TEST_RETRIES", "0"))
    )
]
fragile_gang = [  # no preemption allowed: a lost gang fails the step
    apply("gang/fragile", tcp_sum, version="v1", out_path=OUT).with_options(
        remote=BACKEND, ranks=3, max_preemptions=0
    )
]
_UNITS = int(os.environ.get("MARIN_TEST_UNITS", "6"))
units_gang = [
    apply("gang/units", train_units, version="v1", units=_UNITS, out_path=OUT).with_options(
        remote=BACKEND, ranks=3, resumable=True,
        **({"max_preemptions": int(m)} if (m := os.environ.get("MARIN_TEST_MAX_PREEMPTIONS"))
           else {}),
    )
]


def devices(out_path: str) -> int:
    """Each rank writes what it sees: its devices and the torch.distributed environment."""
    ctx = current_context()
    os.makedirs(out_path, exist_ok=True)
    seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT",
                                           "RANK", "LOCAL_RANK", "WORLD_SIZE")}  # fmt: skip
    with open(os.path.join(out_path, f"rank-{ctx.rank}.json"), "w") as f:
        json.dump(seen, f)
    return ctx.rank


devices_gang = [
    apply("gang/devices", devices, version="v1", out_path=OUT).with_options(
        remote="local", ranks=3, resources={"gpu": 2}
    )
]
