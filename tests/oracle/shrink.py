"""Shrinking a fixed-seed history that found a kind of violation, for a short repro.

Hypothesis shrinks the histories it draws itself (``histories()``); a fixed-seed history
comes from ``random.Random`` and is shrunk here, greedily, keeping only changes after which
the same kind is still found: cut the operations after the first one that finds it, drop
operations one at a time, simplify each run's options, drop the pipeline's last steps and
its steps' placement options. Each candidate is run for real; a kind that depends on timing
may need a few tries (``tries``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from tests.oracle.executor import run_history
from tests.oracle.history import History
from tests.oracle.ops import Run, RunOpts
from tests.oracle.world import Context


def finds(kind: str, tries: int = 1) -> Callable[[History], bool]:
    def check(history: History) -> bool:
        for _ in range(tries):
            outcome, _ = run_history(history)
            if kind in outcome.kinds:
                return True
        return False

    return check


def shrink(history: History, kind: str, tries: int = 1, log: Any = None) -> History:
    """A shorter history that still finds ``kind`` (``history`` itself if none is)."""
    still = finds(kind, tries)
    outcome, _ = run_history(history)
    first = min((v.op for v in outcome.violations if v.kind == kind), default=None)
    if first is None:
        return history
    best = History(history.model, history.ops[: first + 1])
    improved = True
    while improved:
        improved = False
        for candidate in _candidates(best):
            if size(candidate) < size(best) and still(candidate):
                best, improved = candidate, True
                if log:
                    log(f"shrunk to {len(best.ops)} ops, {len(best.model.steps)} steps")
                break
    return best


def size(h: History) -> tuple[int, int, int, int]:
    """What shrinking makes smaller (a candidate must be smaller, so shrinking ends)."""
    flags = sum(s.remote + s.resumable + s.user_scope + s.deferred for s in h.model.steps)
    options = 0
    for op in h.ops:
        options += (type(op) is not Run) + (getattr(op, "ctx", Context()) != Context())
        options += len(getattr(op, "variants", ()))
        opts = getattr(op, "opts", None)
        if isinstance(opts, RunOpts):
            options += len(opts.force) + (not opts.cascade) + (opts.ctx != Context())
            options += (opts.on_drift != "warn") + (opts.on_code_drift != "warn")
    return (len(h.ops), len(h.model.steps), flags, options)


def _candidates(h: History) -> Iterator[History]:
    for i in range(len(h.ops) - 1, -1, -1):  # drop one operation
        if len(h.ops) > 1:
            yield History(h.model, h.ops[:i] + h.ops[i + 1 :])
    for i, op in enumerate(h.ops):  # simpler options for one operation
        for simpler in _simpler(op):
            yield History(h.model, (*h.ops[:i], simpler, *h.ops[i + 1 :]))
    smaller = _without_last_step(h)
    if smaller is not None:
        yield smaller
    for s in h.model.steps:  # fewer placement options
        for flag in ("remote", "resumable", "user_scope", "deferred"):
            if getattr(s, flag):
                yield History(h.model.replace(s.idx, **{flag: False}), h.ops)


def _simpler(op: Any) -> Iterator[Any]:
    ctx = getattr(op, "ctx", None)
    if isinstance(ctx, Context):
        yield dataclasses.replace(op, ctx=Context(ctx.user))
        yield dataclasses.replace(op, ctx=Context())
    variants = getattr(op, "variants", ())
    for i in range(len(variants)):
        if len(variants) > 1:
            yield dataclasses.replace(op, variants=variants[:i] + variants[i + 1 :])
    opts = getattr(op, "opts", None)
    if not isinstance(opts, RunOpts):
        return
    if type(op) is not Run:  # a failure, a kill, a crash, two drivers, a stream: a plain run
        yield Run(opts)
    plain = RunOpts(Context(opts.ctx.user), "warn", "warn", opts.force, True)
    candidates = [
        dataclasses.replace(opts, force=()),
        dataclasses.replace(opts, cascade=True),
        dataclasses.replace(opts, ctx=Context(opts.ctx.user)),
        dataclasses.replace(opts, ctx=Context()),
        dataclasses.replace(opts, on_drift="warn"),
        dataclasses.replace(opts, on_code_drift="warn"),
        plain,
    ]
    for candidate in candidates:
        if candidate != opts:
            yield dataclasses.replace(op, opts=candidate)


def _without_last_step(h: History) -> History | None:
    last = len(h.model.steps) - 1
    if last < 1:
        return None
    for op in h.ops:
        fields = [getattr(op, f, None) for f in ("step",)]
        opts = getattr(op, "opts", None)
        forced = opts.force if isinstance(opts, RunOpts) else ()
        override = getattr(getattr(opts, "ctx", None) or getattr(op, "ctx", None), "override", None)
        if last in fields or last in forced or (override and override[0] == last):
            return None
    return History(dataclasses.replace(h.model, steps=h.model.steps[:last]), h.ops)
