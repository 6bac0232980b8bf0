"""A remote step's build waiting for its job: the value the build returns while the job runs.

Under ``Wait.RETURN`` (the run loop) or ``Wait.RETURN_JOB`` (an Airflow task), a remote step's
build does not wait for its job: once ``job.json`` names a running job, ``build_step`` returns
``Pending(spec, JobRunning(...), resume)``, keeping its lease (renewed by the process's one
renewal thread), its heartbeat and the step's log open. Whoever holds the value waits for the
job's end: the run loop on the process's one poller (``when_ended``, whose callback posts to the
loop's inbox; a thousand waiting jobs cost one thread), an Airflow task in its trigger. Then
``resume`` collects the job and commits, as ``build_step`` would have on one thread.

This is the seam a job's life goes through: a gang of ranks waits here as one job, and a job's
log can be followed while it runs from the poller's looks at it (``poller.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marin.execution.remote.poller import POLLER, Watch
from marin.execution.store.step_folder import JobRecord


@dataclass(eq=False)
class JobRunning:
    """Why a build is pending: its job runs. ``collect()`` is what the build does once the job
    ended (or its lease was lost): the job's value, its error raised, or another
    ``JobRunning`` (a reattached job had stopped, and a new one was submitted)."""

    step_id: str
    job: JobRecord
    watch: Watch
    collect: Callable[[], Any]
    forget: Callable[[], None]
    """Stop waiting for the job (the build was given up): it runs on, watched by no one."""

    def when_ended(self, on_end: Callable[[], None]) -> None:
        """Have the poller call ``on_end`` (on its thread; it must not block) when the job ends
        or the build's lease is lost."""
        POLLER.watch(self.watch, on_end)

    def wait(self) -> None:
        """Block this thread until the job ends or the build's lease is lost."""
        POLLER.wait(self.watch)
