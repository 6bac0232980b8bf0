"""A history: a generated pipeline and the operations applied to it, as plain data.

:func:`generate` asks a :class:`~tests.oracle.choose.Chooser`, so ``generate(RandomChooser(n))``
is fixed-seed history ``n`` and :func:`histories` is the same generator as a hypothesis
strategy (which shrinks). A :class:`Profile` says how big and how costly histories are: the fast
subset keeps subprocesses and remote jobs a small share; the engine profile leaves out what
needs ``marin run`` itself (a killed driver, two drivers, a stream).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tests.oracle import adoption
from tests.oracle.choose import Chooser, DrawChooser, RandomChooser
from tests.oracle.ops import (
    BUILT_AFTER,
    ENGINE_OPERATIONS,
    GANG_OPERATIONS,
    OPENERS,
    OPERATIONS,
    Run,
    RunOpts,
)
from tests.oracle.pipeline import SHAPES, PipelineModel, StepModel, shaped_deps
from tests.oracle.world import Context


@dataclass(frozen=True)
class Profile:
    """How histories are drawn."""

    steps: tuple[int, int] = (5, 7)
    ops: tuple[int, int] = (3, 8)
    p_remote: float = 0.3
    """Chance a pipeline has remote steps (each costs a job process per build)."""
    p_remote_step: float = 0.35
    """Chance each step of such a pipeline is remote."""
    p_resumable: float = 0.3
    p_user: float = 0.15
    p_deferred: float = 0.2
    p_gang: float = 0.0
    """Chance a remote step is a gang of two ranks (0: never drawn, the stream unchanged)."""
    p_adopt: float = 0.0
    """Chance a history makes a root step an adoption (``adoption.adopt``; drawn after all the
    rest, so a history without one is drawn as before; 0: never drawn)."""
    operations: tuple[type[Any], ...] = OPERATIONS
    scale: dict[str, float] = field(default_factory=dict)
    """Operation name -> a factor on its weight."""


FAST = Profile(
    ops=(2, 7),
    p_remote=0.25,
    scale={"kill-driver": 0.6, "crash": 0.6, "two-drivers": 0.5},
    p_adopt=0.1,
)
"""Subprocesses (a killed driver, a crash, two drivers) cost a second each: fewer of them."""
SOAK = Profile(steps=(5, 8), ops=(3, 10), p_remote=0.35, p_adopt=0.1)
ADOPT = Profile(ops=(2, 6), p_remote=0.2, p_adopt=1.0, scale=FAST.scale)
"""Every history has an adoption (``adoption.adopt``): its data outside the prefix, in place,
or in another pipeline's build; edited by hand, turned into a built step and back, its record
torn, forced, gc'd, its driver killed at a crash point."""
ENGINE = Profile(
    steps=(4, 5),
    ops=(3, 5),
    p_remote=0.0,
    p_user=0.0,
    p_deferred=0.0,
    operations=ENGINE_OPERATIONS,
)
GANG = Profile(
    steps=(3, 5),
    ops=(2, 5),
    p_remote=1.0,
    p_user=0.0,
    p_deferred=0.0,
    p_remote_step=0.7,
    p_gang=0.6,
    operations=GANG_OPERATIONS,
    scale={
        "rank-fail": 2,
        "lease-lost": 1.5,
        "preempt-past-budget": 1.5,
        "fail": 0.5,
        "kill-driver": 0.6,
    },
)
"""Remote steps, gangs of two (some with ``retries=1``), their jobs preempted within and past
their budget, a rank that raises and a lost lease (issue 56), among runs and edits."""


@dataclass(frozen=True)
class History:
    """A pipeline and what happens to it, in order."""

    model: PipelineModel
    ops: tuple[Any, ...]

    def describe(self) -> str:
        steps = "\n".join(f"  {s}" for s in self.model.steps)
        ops = "\n".join(f"  {i}: {op!r}" for i, op in enumerate(self.ops))
        adopted = f"  {self.model.adoption}\n" if self.model.adoption else ""
        return f"pipeline:\n{steps}\n{adopted}operations:\n{ops}"


def generate_pipeline(ch: Chooser, profile: Profile) -> PipelineModel:
    n = ch.integer(*profile.steps)
    shape = SHAPES[ch.integer(0, len(SHAPES) - 1)]
    deps = shaped_deps(shape, n, [ch.integer(0, 7) for _ in range(2 * n)])
    remote = ch.boolean(profile.p_remote)
    deferred = ch.boolean(profile.p_deferred)
    steps = []
    for i in range(n):
        step = StepModel(
            idx=i,
            deps=deps[i],
            k=ch.integer(1, 3),
            remote=remote and ch.boolean(profile.p_remote_step),
            resumable=ch.boolean(profile.p_resumable),
            user_scope=ch.boolean(profile.p_user),
            deferred=deferred and ch.boolean(0.5),
        )
        if step.remote and profile.p_gang and ch.boolean(profile.p_gang):
            step = dataclasses.replace(step, ranks=2, retries=ch.integer(0, 1))
        steps.append(step)
    return PipelineModel(tuple(steps))


def generate(ch: Chooser, profile: Profile = FAST) -> History:
    """One history: a pipeline, a first build (see ``OPENERS``), then drawn operations."""
    model = generate_pipeline(ch, profile)
    last = Context()
    classes = profile.operations
    openers = [c for c in classes if OPENERS.get(c.name) and c.weight(model)]
    first = ch.weighted(openers, [OPENERS[c.name] for c in openers])
    ops: list[Any] = [first.draw(ch, model, last)]
    if first.name in BUILT_AFTER:
        ops.append(Run(RunOpts.draw(ch, model, last)))
    for op in ops:
        last = op.last_context(last)
    weights = carve(
        classes, [cls.weight(model) * profile.scale.get(cls.name, 1.0) for cls in classes]
    )
    for _ in range(ch.integer(*profile.ops)):
        cls = ch.weighted(classes, weights)
        op = cls.draw(ch, model, last)
        ops.append(op)
        last = op.last_context(last)
    history = History(model, tuple(ops))
    if profile.p_adopt and ch.boolean(profile.p_adopt):
        history = adoption.adopt(ch, history)
    return history


def carve(classes: tuple[type[Any], ...], weights: list[float]) -> list[float]:
    """``weights`` with each operation's taken from the one it is carved from
    (``Op.carved_from``, listed just before it): the others' ranges of the draw stay where
    they were, so a fixed-seed history that never draws a carved operation is drawn exactly
    as before it existed."""
    names = [cls.name for cls in classes]
    out = list(weights)
    for i, cls in enumerate(classes):
        if cls.carved_from in names:
            out[names.index(cls.carved_from)] -= out[i]
    return out


def seeded(seed: int, profile: Profile = FAST) -> History:
    """Fixed-seed history ``seed``."""
    return generate(RandomChooser(seed), profile)


def histories(profile: Profile = FAST) -> Any:
    """The generator as a hypothesis strategy."""
    from hypothesis import strategies as st

    @st.composite
    def draw(draw_fn: Any) -> History:
        return generate(DrawChooser(draw_fn), profile)

    return draw()
