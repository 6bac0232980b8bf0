"""A user's data at a step's output path, beside a metadata folder no attempt left (r17-2).

``ops.PutUserData`` picks a step the last context's plan finds with nothing at its output
path (no record, no data, no metadata folder), writes a user's file there by hand (its bytes
unique to the history's operation) and makes the step's ``<version>.marin/`` folder in one of
``SHAPES``: empty, holding only the lease's guard, or only an empty ``checkpoints/`` folder.
None of these is a file a Marin attempt leaves, so none proves Marin wrote what lies beside it
(docs/reliability.md, "Marin deletes only what it provably wrote"). The checks:

- the user's data is byte for byte what the user wrote after every operation: no run or gc
  may change or delete it (``user-data-touched``; on f438e3d a build cleared it as an
  earlier attempt's debris);
- a build of the step there is refused ("already exists and was not written by Marin", which
  ``marin plan`` shows beforehand): a failed step the checker expects, as are its readers,
  blocked; no other failure is;
- ``ops.MoveUserData`` moves the data away by hand (outside the prefix, where it is still
  checked), as the refusal's fix says: the step then builds normally.

No job file is planted beside such data (``Executor.plant``): a planted ``job.json`` is one an
attempt leaves, which makes the data look Marin's (the planted operations' own concern).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING, Any

from tests.oracle.checks import Policy, Violation, read_record, snapshot, step_index

if TYPE_CHECKING:
    from tests.oracle.executor import Executor

SHAPES = ("empty", "guard", "checkpoints")
"""The metadata folder beside the user's data: empty, only ``lease.json.guard``, or only an
empty ``checkpoints/`` folder."""
FILE = "user.txt"
REFUSAL = "already exists and was not written by Marin"
"""How a build is refused over data Marin never wrote (docs/reliability.md, the catalogue)."""


def put(ex: Executor, shape: str, pick: int) -> None:
    """The user's file at the output path of a step with nothing there (the ``pick``-th of
    them; none: nothing happens), beside a metadata folder of ``shape``."""
    world = ex.world
    plan = ex.plan(ex.last, Policy()).json() or {}
    adopted = world.model.adoption.step if world.model.adoption is not None else None
    free = [
        s
        for s in plan.get("steps", [])
        if step_index(s) != adopted and _nothing_at(s["output_path"])
    ]
    if not free:
        return
    step = free[pick % len(free)]
    out = step["output_path"]
    data = f"{step['step']}: the user's own data, put here by hand (op {ex.op})\n".encode()
    os.makedirs(out)
    with open(os.path.join(out, FILE), "wb") as f:
        f.write(data)
    meta = out + ".marin"
    os.makedirs(os.path.join(meta, "checkpoints") if shape == "checkpoints" else meta)
    if shape == "guard":
        open(os.path.join(meta, "lease.json.guard"), "w").close()
    world.users_own[out] = snapshot(out)
    world.refused_outputs.add(out)
    ex.event("user-data-put")
    rel = os.path.relpath(out, world.prefix)
    made = {
        "empty": f"os.makedirs(os.path.join(PREFIX, {rel + '.marin'!r}))",
        "guard": f"os.makedirs(os.path.join(PREFIX, {rel + '.marin'!r})); "
        f"open(os.path.join(PREFIX, {rel + '.marin'!r}, 'lease.json.guard'), 'w').close()",
        "checkpoints": f"os.makedirs(os.path.join(PREFIX, {rel + '.marin'!r}, 'checkpoints'))",
    }
    ex.script.emit(
        f"os.makedirs(os.path.join(PREFIX, {rel!r})); "
        f"open(os.path.join(PREFIX, {rel!r}, {FILE!r}), 'wb').write({data!r})  # the user's",
        f"{made[shape]}  # a metadata folder no attempt left ({shape})",
    )


def record_torn(ex: Executor, out: str) -> None:
    """A built step's record at ``out`` was torn by hand (``ops.TearRecord``): naming no build,
    it proves nothing about the data beside it (red team r20-1), which is then refused and
    kept like a user's (unless a status, lease or ``job.json`` there names ``out``), until
    ``MoveUserData`` moves it away."""
    meta = out + ".marin"
    if not os.path.lexists(out) or any(_names(os.path.join(meta, f), out) for f in _PROOFS):
        return
    ex.world.users_own[out] = snapshot(out)
    ex.world.refused_outputs.add(out)
    ex.event("torn-record-refused")


_PROOFS = ("status.json", "lease.json", "job.json")


def _names(path: str, out: str) -> bool:
    """Whether the step-folder file at ``path`` names the output ``out`` (relative to the
    prefix, as Marin writes it, or whole)."""
    try:
        with open(path, "rb") as f:
            named = json.loads(f.read()).get("output_path")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(named, str) and bool(named) and out.endswith("/" + named.lstrip("/"))


def move(ex: Executor, pick: int) -> None:
    """The user moves the data of the ``pick``-th output path a build is refused at out of
    the prefix, by hand (none, or its data no longer as written: nothing happens)."""
    world = ex.world
    refused = sorted(o for o in world.refused_outputs if snapshot(o) == world.users_own.get(o))
    if not refused:
        return
    out = refused[pick % len(refused)]
    dest = world.path("outside", f"moved-{ex.op}")
    shutil.move(out, dest)
    world.users_own[dest] = world.users_own.pop(out)
    world.refused_outputs.discard(out)
    ex.event("user-data-moved")
    rel = os.path.relpath(out, world.prefix)
    ex.script.emit(
        f"os.makedirs(OUTSIDE, exist_ok=True); shutil.move(os.path.join(PREFIX, {rel!r}), "
        f"os.path.join(OUTSIDE, 'moved-{ex.op}'))  # by hand, as the refusal says"
    )


def refused_steps(report: dict[str, Any], ex: Executor) -> set[str]:
    """The steps the run failed because the user's data lies at their output path, refused
    as data Marin never wrote (``REFUSAL``): failures the checker expects."""
    found = {
        s["step"]
        for s in report.get("steps", [])
        if s.get("action") == "failed"
        and s.get("output_path") in ex.world.refused_outputs
        and REFUSAL in str(s.get("reason"))
    }
    if found:
        ex.event("user-data-refused")
    return found


def check(ex: Executor) -> None:
    """The user's data is byte for byte what the user wrote, wherever it lies."""
    world = ex.world
    for where, files in sorted(world.users_own.items()):
        now = snapshot(where)
        if now == files:
            continue
        changed = sorted(k for k in set(now) | set(files) if now.get(k) != files.get(k))
        built = " (a build's record is beside it)" if read_record(where) is not None else ""
        want = {k: v[:12] for k, v in files.items()}
        ex.add(
            [
                Violation(
                    "user-data-touched",
                    ex.op,
                    f"the user's data at {where}, beside a metadata folder no Marin attempt "
                    f"left, changed: {changed} (deleted, rewritten or added){built}",
                )
            ],
            f"expect(tree({_expr(world.prefix, world.path('outside'), where)}) == {want!r}, "
            '"the user\'s data is as they wrote it")',
        )


def _nothing_at(output_path: str) -> bool:
    return not os.path.lexists(output_path) and not os.path.lexists(output_path + ".marin")


def _expr(prefix: str, outside: str, where: str) -> str:
    """Where the user's data lies, as the repro script says it."""
    if where.startswith(outside + os.sep):
        return f"os.path.join(OUTSIDE, {os.path.relpath(where, outside)!r})"
    return f"os.path.join(PREFIX, {os.path.relpath(where, prefix)!r})"
