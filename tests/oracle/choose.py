"""Where a history's random choices come from: a seeded ``random.Random``, or hypothesis.

The generator (``history.generate``) asks a :class:`Chooser`; the two kinds answer the same
questions, so one generator makes the fixed-seed histories of the fast subset and the soak
(``RandomChooser(seed)``: history N is the same on every machine and every hypothesis version)
and the histories hypothesis draws and shrinks (``DrawChooser``). Every choice shrinks toward
its first option, so options are listed simplest first.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Chooser(Protocol):
    """The questions a history's generator asks."""

    def integer(self, lo: int, hi: int) -> int: ...

    def weighted(self, options: Sequence[T], weights: Sequence[float]) -> T: ...

    def boolean(self, p: float) -> bool: ...


class RandomChooser:
    """Choices from ``random.Random(seed)``."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def weighted(self, options: Sequence[T], weights: Sequence[float]) -> T:
        return self.rng.choices(list(options), weights=list(weights))[0]

    def boolean(self, p: float) -> bool:
        return self.rng.random() < p


class DrawChooser:
    """Choices drawn by hypothesis (``draw`` of ``st.composite``): they shrink."""

    def __init__(self, draw: Callable[[Any], Any]) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        from hypothesis import strategies as st

        return int(self.draw(st.integers(lo, hi)))

    def weighted(self, options: Sequence[T], weights: Sequence[float]) -> T:
        from hypothesis import strategies as st

        kept = [(o, w) for o, w in zip(options, weights, strict=True) if w > 0]
        options, weights = [o for o, _ in kept], [w for _, w in kept]
        total = sum(weights)
        scale = 1000 / total if total else 0
        x = self.draw(st.integers(0, 999))
        acc = 0.0
        for option, weight in zip(options, weights, strict=True):
            acc += weight * scale
            if x < acc:
                return option
        return options[-1]

    def boolean(self, p: float) -> bool:
        from hypothesis import strategies as st

        return bool(self.draw(st.integers(0, 999)) >= 1000 - int(p * 1000))
