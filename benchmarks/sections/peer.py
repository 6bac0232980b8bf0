"""Section ``peer`` (optional): Marin's own ``StepRunner`` (PyPI ``marin-core``) beside ours.

The same graphs in a separate venv (``peer_marin.py``; never this project's), timed side by side
with our runner and with our builds' file-system calls alone."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from typing import Any

import graphs
from commit_cost import SYSCALLS_ALONE
from common import HERE
from harness import Harness, run_process

from marin.execution.lazy import lower
from marin.execution.pipeline.graph import collect_steps

PEER_TARGETS = (("chain", 20, 500.0), ("fan", 200, 25.0), ("random", 200, 25.0))
"""Issue 23: at least 25x Marin's StepRunner on the 200-step graphs, 500x on the 20-chain."""


PEER_INSTALL = (
    "install it into its own venv with `PEER_DIR=DIR ../shared/peers/setup-marin-peer.sh` "
    "(never into this project's venv) and set MARIN_PEER_PYTHON=DIR/venv/bin/python"
)


def peer_python() -> str | None:
    """The peer venv's interpreter: $MARIN_PEER_PYTHON, else the setup script's default."""
    default = os.path.join(os.environ.get("TMPDIR", "/tmp"), "marinpeer", "venv", "bin", "python")
    path = os.environ.get("MARIN_PEER_PYTHON") or default
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def bench(h: Harness) -> None:
    """Marin's own StepRunner (PyPI marin-core) vs ours, same graphs, side by side: optional."""
    python = peer_python()
    if h.quick or python is None:
        why = "skipped in --quick" if h.quick else f"peer not installed: {PEER_INSTALL}"
        h.add("peer", "Marin StepRunner / ours", None, "x", note=why)
        return
    for kind, n, target in PEER_TARGETS:
        reps = 1 if kind == "chain" else 2
        peer = peer_run(h, python, kind, n, reps)
        if peer is None:
            continue
        h.raw.setdefault("peer", []).append(
            {"section": h.section, "kind": kind, "n": n, "result": peer}
        )
        ours = h.worker("overhead", 120, backend="local", n=n, reps=3, kind=kind)
        if ours:
            _compare(h, kind, n, target, reps, peer["run_median_s"], ours["run_median_s"])


def peer_run(h: Harness, python: str, kind: str, n: int, reps: int) -> dict[str, Any] | None:
    """The peer's result on the ``kind`` graph of ``n`` steps, run by ``peer_marin.py`` in the
    peer's venv; None, and a row saying why, if it timed out or failed."""
    _, targets = graphs.make(kind, n)
    steps = collect_steps(lower(targets, memo={}))
    index = {s.output_path: i for i, s in enumerate(steps)}
    edges = [[s.step_id.replace("@", "-"), [index[d.output_path] for d in s.deps]] for s in steps]
    args = json.dumps({"steps": edges, "reps": reps, "max_concurrent": 8})
    try:
        proc = run_process(
            [python, "-I", os.path.join(HERE, "peer_marin.py"), args],
            max(1.0, min(180.0, h.remaining())),
            env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/")},
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired:
        h.add("peer", f"Marin StepRunner {kind} n={n}", None, "s", note="timed out")
        return None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        h.add("peer", f"Marin StepRunner {kind} n={n}", None, "s", note=" ".join(tail))
        return None
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _compare(
    h: Harness, kind: str, n: int, target: float, reps: int, peer_s: float, ours_s: float
) -> None:
    """The two times, their ratio judged, and our builds' file-system calls alone beside them."""
    h.add("peer", f"Marin StepRunner {kind} n={n}", peer_s, "s",
          note=f"median of {reps}; marin-core, max_concurrent=8, local disk")  # fmt: skip
    h.add("peer", f"ours {kind} n={n}", ours_s, "s",
          note="median of 3; max_concurrent=8, local disk")  # fmt: skip
    h.judge("peer", f"speed-up vs Marin StepRunner {kind} n={n}", peer_s / ours_s, "x",
            f"peer.{kind}", target, ">=")  # fmt: skip
    alone = h.worker("calls_alone", 120, backend="local", n=n, threads=8, kind=kind, reps=3)
    if alone:
        h.add(
            "peer",
            f"ours {kind} n={n}: {SYSCALLS_ALONE}",
            alone["seconds"],
            "s",
            note=f"median of 3; our builds' calls to os on 8 threads, no runner; "
            f"{target:g} times the peer needs {peer_s / target:.3g} s in all",
        )


WORKERS: dict[str, str] = {}
