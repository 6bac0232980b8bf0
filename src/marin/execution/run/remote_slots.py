"""Two bounds on what a run starts: ``max_concurrent`` for work on this machine, and
``max_remote`` for remote steps' jobs, which wait without a slot (docs/remote.md).

The run loop asks ``free`` once per dispatch (from the steps running now), then ``admit`` per
ready step: a remote step needs a free job slot, any other a free local one. A remote step's
declared resources are its job's (the backend places it), never this machine's pool.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from marin.execution.plan.decide import Decision

REMOTE_PHASE_THREADS = 4
"""Threads for remote steps' two short phases (submit or reattach, then collect and commit):
their waits hold none (``remote/wait.py``)."""


def executor_threads(max_concurrent: int, max_remote: int) -> int:
    """The thread executor's size: one per local slot, and a few for remote steps' phases,
    however many jobs wait."""
    return max_concurrent + min(max_remote, REMOTE_PHASE_THREADS)


class Slots:
    """Counts, per dispatch, the local and remote slots still free."""

    def __init__(
        self,
        max_concurrent: int,
        max_remote: int,
        is_remote: Callable[[str], bool],
        *,
        any_remote: bool = True,
    ) -> None:
        self.max_concurrent = max_concurrent
        # Without remote steps, no job slot is ever offered: otherwise every dispatch with the
        # local slots full would pop (and push back) every ready step looking for a remote one.
        self.max_remote = max_remote if any_remote else 0
        self.is_remote = is_remote
        self._local_free = max_concurrent
        self._remote_free = max_remote

    @classmethod
    def for_decisions(
        cls, max_concurrent: int, max_remote: int, decisions: Mapping[str, Decision]
    ) -> Slots:
        """The slots of a run of ``decisions`` (output path -> decision)."""
        return cls(
            max_concurrent,
            max_remote,
            lambda path: decisions[path].spec.remote is not None,
            any_remote=any(d.spec.remote is not None for d in decisions.values()),
        )

    def free(self, running: Collection[str]) -> int:
        """How many steps may start now, of both kinds (also resets ``admit``'s counts)."""
        remote = sum(1 for path in running if self.is_remote(path)) if self.max_remote else 0
        local = len(running) - remote
        self._local_free = max(0, self.max_concurrent - local)
        self._remote_free = max(0, self.max_remote - remote)
        return self._local_free + self._remote_free

    def admit(self, path: str) -> bool:
        """Take a slot of ``path``'s kind, if one is free."""
        if self.max_remote and self.is_remote(path):
            if self._remote_free <= 0:
                return False
            self._remote_free -= 1
            return True
        if self._local_free <= 0:
            return False
        self._local_free -= 1
        return True

    def give_back(self, path: str) -> None:
        """Undo ``admit`` (the step's resources were not free after all)."""
        if self.max_remote and self.is_remote(path):
            self._remote_free += 1
        else:
            self._local_free += 1
