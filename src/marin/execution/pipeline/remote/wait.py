"""Waiting for a remote job on no thread: the local runner's two-phase build.

Under ``park_waits()`` (the thread executor sets it), a remote step's build does not block its
thread while its job runs. Phase 1 (on an executor thread) takes the lease, writes
``job.json``, submits or reattaches, and ``RemoteCall`` raises ``JobParked``; ``build_step``
sets its ``resume`` (phase 2) and keeps the lease, its heartbeat (on the one renewal thread)
and the step's log open. The executor hands the job to the process's one poller
(``when_ended``), whose callback posts to the run loop's inbox; the loop runs ``resume`` on an
executor thread: the lease is checked, the job collected, the record committed as for any
build. A thousand waiting jobs cost the poller's one thread.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

from marin.execution.pipeline.remote.job_record import JobRecord
from marin.execution.pipeline.remote.poller import POLLER, Watch

_park: contextvars.ContextVar[bool] = contextvars.ContextVar("marin_remote_park", default=False)


@contextlib.contextmanager
def park_waits() -> Iterator[None]:
    """Within: a remote call whose job must be waited for raises ``JobParked`` instead."""
    reset = _park.set(True)
    try:
        yield
    finally:
        _park.reset(reset)


def parking() -> bool:
    """Whether this context parks remote waits (``park_waits``)."""
    return _park.get()


class JobParked(Exception):
    """A build whose job runs, parked with no thread: ``resume()`` is its second phase.

    ``RemoteCall`` raises it with ``collect`` (the job's value once it ended, or its error; it
    may park again when a reattached job had stopped and a new one is submitted); ``build_step``
    sets ``resume``, which collects and commits. Never an end of the build: no status, no
    lineage event, the lease kept."""

    def __init__(
        self, step_id: str, job: JobRecord, watch: Watch, collect: Callable[[Watch], Any]
    ) -> None:
        super().__init__(f"{step_id}: {job.backend} job {job.job_id} runs; parked")
        self.step_id = step_id
        self.job = job
        self.watch = watch
        self._collect = collect
        self.resume: Callable[[], Any] | None = None
        """Set by ``build_step``: the build's second phase (collect, commit, release)."""

    def collect(self) -> Any:
        """The job's value (or its error), once it ended or the lease was lost."""
        return self._collect(self.watch)

    def when_ended(self, on_end: Callable[[], None]) -> None:
        """Have the poller call ``on_end`` (on its thread; it must not block) when the job
        ends or the build's lease is lost."""
        POLLER.watch(self.watch, on_end)
