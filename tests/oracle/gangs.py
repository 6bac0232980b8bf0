"""The gang operations' runs and checks (issue 56; docs/remote.md, "Gang steps", "Who keeps the
lease alive"): a rank that raises, and a gang whose driver loses its lease.

A rank that raises fails its gang as one: every rank ends, ``retries`` counts it (never
``max_preemptions``: the record says 0 preemptions), nothing is committed by the failed gang,
and with ``retries`` one new gang builds the step; without, the run fails. A driver that loses
its lease cancels its gang (every rank ends) and commits nothing; the new holder builds the
step once. ``gone`` and ``wait_holder`` are also the repro script's (``script.PRELUDE``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from typing import TYPE_CHECKING, Any

from tests.oracle.checks import Violation, read_record, step_index
from tests.oracle.ops import RunOpts, wait_for
from tests.oracle.world import Call

if TYPE_CHECKING:
    from tests.oracle.executor import Executor


def gone(pid: int, timeout: float = 10) -> bool:
    """Whether process ``pid`` ended (a zombie has) within ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
                    return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


def wait_holder(lease: str, proc: subprocess.Popen[str], timeout: float = 30) -> bool:
    """Wait until ``proc`` holds the lease file ``lease`` (its pid in the holder's id)."""
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        with (
            contextlib.suppress(OSError, ValueError, IndexError, KeyError, TypeError),
            open(lease) as f,
        ):
            if json.load(f)["holder"].split(":")[1] == str(proc.pid):
                return True
        time.sleep(0.05)
    return False


def _step(pre: Call, step: int) -> dict[str, Any] | None:
    return next((s for s in (pre.json() or {}).get("steps", []) if step_index(s) == step), None)


def _build_id(path: str) -> str | None:
    record = read_record(path)
    return None if record is None else str(record.get("build_id"))


def _job(path: str) -> dict[str, Any]:
    record = read_record(path) or {}
    job = (record.get("provenance") or {}).get("job")
    return job if isinstance(job, dict) else {}


def _job_id(path: str) -> str | None:
    """The job ``job.json`` names."""
    try:
        with open(path + ".marin/job.json") as f:
            return str(json.load(f)["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def rank_fail(ex: Executor, step: int, opts: RunOpts) -> None:
    """Rank 1 of gang ``step`` raises once rank 0 runs (held); then the checks above."""
    if ex.runner is not None:
        return
    world, s = ex.world, ex.world.model.step(step)
    go = world.new_run_id().replace("r", "g")
    fail = world.control(f"fail-s{step}-r1")
    with open(fail, "w") as f:
        f.write(go)
    ex.script.emit(f"open(os.path.join(CONTROL, 'fail-s{step}-r1'), 'w').write({go!r})")
    pre, token, run_id, argv, proc, var = ex._held_run(step, opts)
    started = wait_for(world.control(f"started-{token}"), proc)
    os.remove(world.control(f"hold-s{step}"))
    ex.script.emit(
        f"wait_for(os.path.join(CONTROL, 'started-{token}'), {var})",
        f"os.remove(os.path.join(CONTROL, 'hold-s{step}'))",
    )
    pid = world.started_pid(token) if started else None
    if pid is not None:
        ex.gang_events["rank-fail"] = ex.gang_events.get("rank-fail", 0) + 1
        open(world.control(f"go-{go}"), "w").close()  # rank 1 raises now
        ex.script.emit(f"open(os.path.join(CONTROL, 'go-{go}'), 'w').close()  # rank 1 raises")
    target = _step(pre, step)
    before = _build_id(target["output_path"]) if target else None
    ex.script.emit(f"{var} = finish({var})")
    call = world.finish(proc, argv, {}, run_id)
    ex.check_run(call, pre, opts, var, injected=True, twice=frozenset({f"s{step}"}))
    if pid is not None and not gone(pid):
        ex.add(
            [Violation("gang-rank-survived", ex.op, f"s{step}'s rank 1 raised; rank 0 lives")],
            f"expect(gone(started_pid({token!r})), 'rank 0 ended with its failed gang')",
        )
    world.release(token)
    ex.script.emit(f"release({token!r})")
    with contextlib.suppress(FileNotFoundError):
        os.remove(fail)  # not taken: the step was not built
    if pid is not None and target is not None and not call.timed_out:
        _check_failed_gang(ex, s.retries, call, target["output_path"], before, var)


def _check_failed_gang(
    ex: Executor, retries: int, call: Call, path: str, before: str | None, var: str
) -> None:
    rel = os.path.relpath(path, ex.world.prefix)
    rec = f"json.load(open(os.path.join(PREFIX, {rel!r} + '.marin', 'record.json')))"
    after = _build_id(path)
    found = []
    if not retries and after != before:
        found.append(("failed-gang-committed", "the failed gang's build was committed"))
    if not retries and call.rc == 0:
        found.append(("failed-gang-succeeded", "a run whose gang failed reported success"))
    preemptions = _job(path).get("preemptions")
    if retries and call.rc != 0:
        found.append(("retried-gang-failed", "a gang with retries=1 failed once, and the run"))
    if retries and after != before and preemptions != 0:
        found.append(
            ("rank-failure-preempted", f"a rank that raised counted {preemptions} preemptions")
        )
    for kind, message in found:
        line = {
            "failed-gang-committed": f"expect(not os.path.exists(os.path.join(PREFIX, {rel!r}"
            " + '.marin', 'record.json')), 'nothing committed')",
            "failed-gang-succeeded": f"expect({var}.returncode != 0, 'the run failed')",
            "retried-gang-failed": f"expect({var}.returncode == 0, 'a new gang built it')",
            "rank-failure-preempted": f"expect({rec}['provenance']['job']['preemptions'] == 0,"
            " 'a raise is no preemption')",
        }[kind]
        ex.add([Violation(kind, ex.op, f"{rel}: {message}")], line)


def lease_lost(ex: Executor, step: int, opts: RunOpts) -> None:
    """Driver A's heartbeat stalls while gang ``step``'s two ranks run (held); driver B takes
    the lease over; A wakes: every rank of A's gang ends, B builds the step once."""
    if ex.runner is not None:
        return
    world = ex.world
    world.use(opts.ctx)
    pre = ex.plan(opts.ctx, opts.policy, opts.force)
    ex._release_held()
    target = _step(pre, step)
    tokens = [world.hold(f"s{step}"), world.hold(f"s{step}-r1")]
    wake = f"wake-{tokens[0]}"
    ids = [world.new_run_id(), world.new_run_id()]
    argv = ["run", world.target, "--json", *opts.argv(world.model.deferred)]
    full = [*argv, "--prefix", world.prefix]
    stall = {"MARIN_LEASE_TTL": "1", "MARIN_FAULT_PAUSE_HEARTBEAT": f"until:{world.control(wake)}"}
    a = world.start(full, {**world.env(opts.ctx.user, ids[0]), **stall})
    va, vb = ex.script.var("p"), ex.script.var("p")
    ex.script.emit(
        f"hold('s{step}', {tokens[0]!r}); hold('s{step}-r1', {tokens[1]!r})",
        ex._marin_line(va, argv, opts.ctx.user, ids[0], start=True)[:-1]
        + f", MARIN_LEASE_TTL='1', MARIN_FAULT_PAUSE_HEARTBEAT='until:'"
        f" + os.path.join(CONTROL, {wake!r}))",
        *(f"wait_for(os.path.join(CONTROL, 'started-{t}'), {va})" for t in tokens),
        f"os.remove(os.path.join(CONTROL, 'hold-s{step}'))",
        f"os.remove(os.path.join(CONTROL, 'hold-s{step}-r1'))",
    )
    started = all(wait_for(world.control(f"started-{t}"), a) for t in tokens)
    for t in tokens:
        os.remove(world.control(f"hold-{world.held[t]}"))
    pids = [world.started_pid(t) for t in tokens] if started else []
    old = _job_id(target["output_path"]) if started and target else None
    calls = _take_over(ex, a, full, ids, target, wake, (va, vb), opts.ctx.user, started)
    for t in tokens:
        world.release(t)
    ex.script.emit(*(f"release({t!r})" for t in tokens))
    _check_lease_lost(ex, pre, opts, step, calls, ids, pids, tokens, (va, vb))
    if old is not None and target is not None and _job(target["output_path"]).get("job_id") == old:
        rel = os.path.relpath(target["output_path"], world.prefix)
        message = f"{rel}: the gang of the driver that lost its lease ({old}) was committed"
        ex.add([Violation("lost-lease-gang-committed", ex.op, message)])


def _take_over(
    ex: Executor,
    a: Any,
    full: list[str],
    ids: list[str],
    target: dict[str, Any] | None,
    wake: str,
    names: tuple[str, str],
    user: str,
    started: bool,
) -> list[Call]:
    """Driver B, once A's gang runs: it waits for A's lease to expire and takes it over; then
    A wakes. Both drivers' calls (A's alone when the gang never started)."""
    world, (va, vb) = ex.world, names
    if not started or target is None:
        ex.script.emit(f"{va} = finish({va})")
        return [world.finish(a, full, {}, ids[0])]
    b = world.start(full, {**world.env(user, ids[1]), "MARIN_LEASE_TTL": "1"})
    lease = target["output_path"] + ".marin/lease.json"
    if wait_holder(lease, b):
        ex.gang_events["lease-lost"] = ex.gang_events.get("lease-lost", 0) + 1
    open(world.control(wake), "w").close()
    rel = os.path.relpath(lease, world.prefix)
    ex.script.emit(
        ex._marin_line(vb, full[:-2], user, ids[1], start=True)[:-1] + ", MARIN_LEASE_TTL='1')",
        f"wait_holder(os.path.join(PREFIX, {rel!r}), {vb})",
        f"open(os.path.join(CONTROL, {wake!r}), 'w').close()  # A wakes: its lease is lost",
        f"{vb} = finish({vb}); {va} = finish({va})",
    )
    call_b = world.finish(b, full, {}, ids[1])
    return [world.finish(a, full, {}, ids[0]), call_b]


def _check_lease_lost(
    ex: Executor,
    pre: Call,
    opts: RunOpts,
    step: int,
    calls: list[Call],
    ids: list[str],
    pids: list[int | None],
    tokens: list[str],
    names: tuple[str, str],
) -> None:
    twice = frozenset({f"s{step}"})
    if len(calls) == 1:  # the gang never started: an ordinary run
        ex.check_run(calls[0], pre, opts, names[0])
        return
    for call in calls:
        call.run_id = "-"  # counted below, over both drivers
    ex.check_run(calls[1], pre, opts, names[1], twice=twice)
    if "Traceback (most recent call last)" in calls[0].err:
        ex.check_run(calls[0], pre, opts, names[0], injected=True, twice=twice)
    from tests.oracle.checks import check_once

    ex.add(
        check_once(ex.world.path("counter.jsonl"), set(ids), ex.op, twice),
        f"expect(ran({ids[0]!r}) + ran({ids[1]!r}) <= 2, 'two gangs at most: fn twice')",
    )
    for rank, (pid, token) in enumerate(zip(pids, tokens, strict=True)):
        if pid is not None and not gone(pid):
            ex.add(
                [Violation("gang-rank-survived", ex.op, f"s{step}'s lost gang: rank {rank} lives")],
                f"expect(gone(started_pid({token!r})), 'rank {rank} of the lost gang ended')",
            )
