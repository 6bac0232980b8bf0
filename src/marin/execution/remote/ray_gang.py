"""A ``ray`` gang job: run by ``ray_entry`` in the Ray job's driver for a step with ``ranks=N``.

All or nothing: one placement group of N bundles (one per rank: a CPU, and the step's GPUs per
rank), **reserved whole before any rank starts** (Ray reserves a group atomically, so a gang that
does not fit holds nothing while it waits). Then N actors, one in each bundle, each run
``isolated_child`` on the job's call in a subprocess with its rank's environment
(``gang_rules.rank_env``; the coordinator is rank 0's node). The first rank to end otherwise
than by returning ends every rank (the subprocesses, then the actors); a rank killed by a signal,
or whose actor or node died, makes the job lost. What ``run_gang`` returns is the job's outcome:
rank 0's once every rank returned, a failed rank's, or the lost marker (``gang_rules``). Ranks'
output reaches the job's log through Ray's log forwarding (prefixed with the actor's name).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from marin.execution.remote.gang_rules import EXIT_GRACE_S, free_port, judge_rank, rank_env

CHILD_MODULE = "marin.execution.pipeline.isolated_child"
STRATEGY = "PACK"
"""Ray's default: as few nodes as fit (choosing ``SPREAD`` is not an option yet)."""


class GangRank:
    """One rank's actor: where it runs, and its ``fn`` in a subprocess it can stop."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def where(self) -> tuple[str, str, tuple[int, int]]:
        """This actor's node id, its address, and two free ports there (rank 0's: the
        coordinators')."""
        import ray

        host = ray.util.get_node_ip_address()
        return ray.get_runtime_context().get_node_id(), host, (free_port(host), free_port(host))

    def run(self, call: bytes, env: dict[str, str], rank: int) -> tuple[int | None, bytes | None]:
        """Run the rank until it returned and exited (or had ``EXIT_GRACE_S``), or ended
        otherwise; its exit status (None: stopped after it returned) and its outcome."""
        with tempfile.TemporaryDirectory(prefix="marin-rank-") as tmp:
            call_path, result = os.path.join(tmp, "call.pkl"), os.path.join(tmp, "result.json")
            fd = os.open(call_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # as checked
            with os.fdopen(fd, "wb") as f:
                f.write(call)
            self.proc = subprocess.Popen(  # -P: never a module of the working folder first
                [sys.executable, "-P", "-m", CHILD_MODULE, call_path, result],
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                preexec_fn=_own_group_dying_with_actor,
            )
            returned: float | None = None
            while self.proc.poll() is None:
                outcome = _read(result)
                if outcome is not None and judge_rank(rank, None, json.loads(outcome)):
                    break  # fn raised: the gang ends now, whatever its exit waits for
                if outcome is not None and returned is None:
                    returned = time.monotonic()
                if returned is not None and time.monotonic() - returned > EXIT_GRACE_S:
                    break
                time.sleep(0.05)
            code = self.proc.poll()
            self.stop()
            return code, _read(result)

    def stop(self) -> None:
        """Kill the rank's subprocess (its whole group) if it still runs."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _own_group_dying_with_actor() -> None:
    """In the rank's subprocess before it runs: a group of its own (``stop`` kills it whole),
    killed when the actor's thread that started it dies (``PR_SET_PDEATHSIG``): a stopped Ray
    job's actors take their ranks with them."""
    import ctypes

    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def run_gang(call: bytes, size: int, gpus: int) -> bytes:
    """Reserve the gang's placement group, run its ranks, and return the job's outcome."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init()
    bundle = {"CPU": 1.0, **({"GPU": float(gpus)} if gpus else {})}
    began = time.monotonic()
    group = placement_group([bundle] * size, strategy=STRATEGY)
    ray.get(group.ready())  # every bundle, or none: no rank starts before
    print(f"gang of {size}: placement group reserved in {time.monotonic() - began:.2f}s")
    actor = ray.remote(GangRank)
    bundles = [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=k)
               for k in range(size)]  # fmt: skip
    ranks: list[Any] = [
        actor.options(  # max_concurrency: ``run`` and ``stop`` at once
            num_cpus=1, num_gpus=gpus, max_concurrency=2, scheduling_strategy=bundle
        ).remote()
        for bundle in bundles
    ]
    where = ray.get([r.where.remote() for r in ranks])
    host, ports = where[0][1], where[0][2]
    nodes = [node for node, _, _ in where]
    runs = [
        r.run.remote(call, rank_env(k, size, host, ports, nodes[:k].count(nodes[k])), k)
        for k, r in enumerate(ranks)
    ]
    try:
        return _watch(ray, runs, ranks)
    finally:
        for r in ranks:
            ray.kill(r)
        remove_placement_group(group)


def _watch(ray: Any, runs: list[Any], ranks: list[Any]) -> bytes:
    """The first rank that did not return ends the others; else rank 0's outcome."""
    outcomes: dict[int, bytes] = {}
    pending = list(runs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        k = runs.index(done[0])
        try:
            code, outcome = ray.get(done[0])
        except ray.exceptions.RayActorError:  # its worker or its node died
            died = "its worker or node died"
            ended: dict[str, object] | None = {"lost": True, "rank": k, "signal": died}
        else:
            parsed = json.loads(outcome) if outcome else None
            ended = judge_rank(k, code if code is not None else 0, parsed)
        if ended is not None:
            with contextlib.suppress(ray.exceptions.RayActorError):
                ray.get([r.stop.remote() for i, r in enumerate(ranks) if i != k])
            return json.dumps(ended).encode()
        outcomes[k] = outcome
    return outcomes[0]
