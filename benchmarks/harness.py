"""The harness every section runs in: workers in subprocesses, rows judged against targets.

``Harness.worker`` runs one worker (a ``module:function`` from a section's ``WORKERS``) in a
process of its own with a time limit; ``Harness.judge`` checks a row against its target, exactly
in a full run and with slack in ``--quick`` (scaled by this machine's speed, ``calibration.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import calibration

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclass
class Row:
    section: str
    metric: str
    value: float | None
    unit: str
    target: str = ""
    met: bool | None = None
    note: str = ""
    key: str = ""
    """A size-independent name of the target this row is judged against (``overhead.local``)."""


QUICK_SLACK = 2.0
"""``--quick`` (CI) allows this factor on every target: CI machines are noisy, and the quick
sizes are smaller; a 10x regression still fails. A time bound is multiplied again by how much
slower this machine is at Python (``Harness.slowdown``)."""


REFERENCE = "reference Python loop (stdlib only, no Marin code)"
"""The metric of each section's first row: this machine's speed at Python (``calibration.py``)."""


AGAIN_NOTE = "--quick only: a time that missed is judged by the slower of this and the first"
"""The note of the reference loop timed again right after a quick time that missed."""


RUNNER_SLACK = {"overhead.local": 4.0, "overhead.memory": 4.0, "dispatch.chain": 4.0}
"""Quick mode's slack for the rows that move more than twofold with no change to the code, for
reasons the reference loop does not see: on local disk this VM's disk alone moves the runner's
row up to threefold between runs (as the calls-alone rows show); on ``memory://`` the thread
hand-off between this VM's two virtual CPUs moves the runner's row and the dispatch chain (one
committed run's eight-thread rows at 5,000 and 10,000 steps differ twofold; a CI run measured the
chain's hand-off alone, its stubbed row, at over four times the committed run's while the
reference loop took twice as long). Twice would fail CI on those spells, not on the code. A
tenfold regression still fails."""


class Harness:
    """One run's state: its rows, raw worker results, errors and targets missed."""

    def __init__(
        self,
        quick: bool,
        deadline: float,
        known: dict[str, float] | None = None,
        committed_reference: dict[str, float] | None = None,
        workers: Mapping[str, str] | None = None,
    ) -> None:
        self.quick = quick
        self.workers = {"reference": "calibration:worker", **(workers or {})}
        """Worker name -> the ``module:function`` that runs it (the sections' ``WORKERS``)."""
        self.deadline = deadline
        self.known = known or {}
        """Targets the committed full run missed: key -> its measured value (quick mode only)."""
        self.committed_reference = committed_reference or {}
        """Section -> the reference loop's time (ms) in the committed run, measured right
        before that section (``calibration.py``; quick mode only)."""
        self.reference_ms: dict[str, float] = {}
        """Section -> the reference loop's time in this run, measured right before it."""
        self.missed: list[str] = []
        self.rows: list[Row] = []
        self.raw: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        """``"section: worker(args)"`` -> why that worker gave no result (a merge drops a re-run
        section's old errors by that prefix: a worker's name need not start with its section's)."""
        self.section = ""
        """The section being run: it prefixes the errors' keys."""
        self.failed = False
        self.distributed = False
        """Run the distributed section (``--distributed``): it starts servers, so opt-in."""
        self.airflow_scheduler = False
        """Also time runs under a real Airflow scheduler (``--airflow-scheduler``): opt-in."""

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def worker(
        self,
        name: str,
        timeout: float,
        env: dict[str, str] | None = None,
        **args: Any,
    ) -> dict[str, Any] | None:
        """Run the worker ``name`` with ``args`` in a subprocess (``worker.py``); None (and a
        note in ``errors``) on failure."""
        timeout = max(1.0, min(timeout, self.remaining()))
        call = f"{name}({', '.join(f'{k}={v}' for k, v in args.items())})"
        key = f"{self.section}: {call}"
        if name not in self.workers:
            self.errors[key] = f"no worker named {name!r} in any section's WORKERS"
            self.failed = True
            print(f"  {call}: {self.errors[key]}", flush=True)
            return None
        cmd = [
            sys.executable,
            os.path.join(HERE, "worker.py"),
            self.workers[name],
            json.dumps(args),
        ]
        try:
            proc = run_process(cmd, timeout, env=env, cwd=ROOT)
        except subprocess.TimeoutExpired:
            self.errors[key] = f"timed out after {timeout:.0f}s"
            print(f"  {call}: timed out after {timeout:.0f}s", flush=True)
            return None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
            self.errors[key] = "\n".join(tail)
            self.failed = True
            print(f"  {call}: failed\n    " + "\n    ".join(tail), flush=True)
            return None
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        self.raw.setdefault(name, []).append(
            {"section": self.section, "args": args, "result": result}
        )
        return result

    def judge(
        self,
        section: str,
        metric: str,
        value: float,
        unit: str,
        key: str,
        limit: float,
        op: str = "<=",
        note: str = "",
    ) -> None:
        """A row checked against a target: exactly in a full run, loosely in ``--quick``.

        ``--quick`` allows ``QUICK_SLACK`` x the target (``RUNNER_SLACK`` for the rows a thread
        hand-off or the disk moves), or x the committed full run's value when that run already
        missed the target (a known miss, documented in the README), so CI fails on a regression,
        not on a known miss. A time (any unit but a ratio's ``x``) is allowed that much more
        again where this machine ran the reference loop slower than the committed run's machine
        did: before the section, or, for a time that misses by that, right after it was
        measured. A quick-mode miss makes the run exit non-zero.
        """
        higher = op == ">="

        def meets(bound: float) -> bool:
            return value >= bound if higher else value <= bound

        bound, target = limit, f"{op} {limit:g}"
        if self.quick:
            base = limit
            known = self.known.get(key)
            if known is not None and (known < limit if higher else known > limit):
                base = known
            slack = RUNNER_SLACK.get(key, QUICK_SLACK)

            def quick_bound(slower: float) -> float:
                return base / (slack * slower) if higher else base * slack * slower

            timed = unit != "x"
            slower = self.slowdown(section) if timed else 1.0
            bound = quick_bound(slower)
            if timed and not meets(bound) and section in self.committed_reference:
                # This VM's speed can change within a section, after the reference at its
                # head: a time that misses is judged again by the loop timed right after it.
                slower = max(slower, self.slowdown_now(section, metric))
                bound = quick_bound(slower)
            machine = f", {slower:.2g}x for this machine" if slower > 1 else ""
            target += f" (quick: {op} {bound:.3g}{machine})"
        met = meets(bound)
        if self.quick and not met:
            self.missed.append(f"{section}: {metric} = {value:.4g} {unit}, bound {bound:.3g}")
        self.add(section, metric, value, unit, target, met, note, key)

    def slowdown(self, section: str) -> float:
        """How much slower this machine ran Python just before ``section`` than the committed
        run's machine did (at least one: see ``calibration.py``)."""
        return calibration.slowdown(
            self.reference_ms.get(section), self.committed_reference.get(section)
        )

    def slowdown_now(self, section: str, metric: str) -> float:
        """``slowdown`` by the reference loop timed now, right after ``metric`` was measured.
        The reading is a row of the section, just before the judged one (empty if the loop
        failed, which leaves the bound as it was)."""
        r = self.worker("reference", 30, reps=calibration.REPS)
        ms = None if r is None else r["ms"]
        self.add(section, f"{REFERENCE}, again after: {metric}", ms, "ms", note=AGAIN_NOTE)
        return calibration.slowdown(ms, self.committed_reference.get(section))

    def measure_reference(self, section: str) -> None:
        """Time the reference loop, as the first row of ``section``: this VM's speed at Python
        moves within a minute, so each section is judged by the speed measured next to it."""
        r = self.worker("reference", 30, reps=calibration.REPS)
        if r is None:
            self.add(section, REFERENCE, None, "ms", note="failed")
            return
        self.reference_ms[section] = r["ms"]
        note = (
            f"median of {len(r['runs'])}; calibration.py: --quick scales this section's times by it"
        )
        self.add(section, REFERENCE, r["ms"], "ms", note=note)

    def add(self, *args: Any, **kwargs: Any) -> None:
        row = Row(*args, **kwargs)
        self.rows.append(row)
        value = "-" if row.value is None else f"{row.value:.4g}"
        met = {True: "met", False: "NOT MET", None: ""}[row.met]
        print(
            f"  {row.metric}: {value} {row.unit} {row.target} {met} {row.note}".rstrip(), flush=True
        )


def run_process(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` with its output captured, in a session of its own, killed whole on
    timeout (``TimeoutExpired``): a worker that timed out must not leave the servers it started
    (a Prefect server, Dask or Celery workers) running under the sections after it."""
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException as exc:  # a timeout, or Ctrl-C, which its own session does not get
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
