"""How a step's build runs once the run loop has decided it may start: the ``Executor`` seam.

The loop (``marin.execution.run.loop``) decides *what* starts and *when*; an executor only
runs what it is handed, somewhere, and reports how it ended. It is small on purpose, like
Prefect's ``TaskRunner``: ``submit`` one attempt, get told of its ``Completion`` through a
callback (from any thread), ``shutdown``. ``ThreadExecutor`` runs attempts on daemon threads in
this process (``StepRunner``); ``marin_prefect.compile.PrefectExecutor`` runs each as a Prefect
task run (threads or Dask, whatever the flow's task runner is).

A later executor plugs in here, not in a new loop (one that spreads steps over machines, say).
Drivers that share one prefix cooperate through this seam too: a build the loop asked to defer
raises ``Deferred`` when another runner's live lease holds its step, the executor reports
``CompletionKind.DEFERRED``, and the loop frees the slot, goes on with other ready steps and
comes back to that one later (``marin.execution.run.loop``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, cast

from marin.execution.build.commit import build_step
from marin.execution.build.request import BuildRequest
from marin.execution.errors import Deferred
from marin.execution.pipeline.remote.wait import JobParked, park_waits

if TYPE_CHECKING:
    from marin.execution.build.commit import BuildOutcome
    from marin.execution.pipeline.step_spec import StepSpec


class CompletionKind(StrEnum):
    """How one attempt ended."""

    DONE = "done"
    """Built, or served (its ``outcome`` says which)."""
    FAILED = "failed"
    """Raised ``error``; the loop retries it if the executor does not retry by itself."""
    DEFERRED = "deferred"
    """Not attempted now (another runner holds the step; ``error`` may be the ``Deferred``):
    the loop frees its slot and submits it again later, without counting an attempt."""
    JOB_ENDED = "job-ended"
    """A parked remote build's job ended (``pipeline/remote/wait.py``): its ``job`` carries
    the build's second phase, which the loop submits at once (the same attempt)."""


@dataclass(frozen=True)
class StepJob:
    """One attempt at one step, as the loop hands it to an executor.

    ``request`` is ``build_step``'s one argument, made by the loop (the decision, the upstream
    records for lineage, the abandon event); an executor calls ``build`` exactly once, wherever
    it runs it, and may wrap it (Prefect holds concurrency slots around it), or sends the
    request's fields that can travel to another process.
    """

    path: str
    spec: StepSpec
    attempt: int
    """1 for the first attempt; the loop's own retries count up from there."""
    request: BuildRequest
    parked: JobParked | None = None
    """A remote build parked while its job ran: ``build`` runs its second phase."""

    def build(self) -> BuildOutcome:
        """Build the request here, in the calling thread (raises what ``build_step`` raises)."""
        if self.parked is not None and self.parked.resume is not None:
            return cast("BuildOutcome", self.parked.resume())
        return build_step(self.request)


@dataclass(frozen=True)
class Completion:
    """How a submitted ``StepJob`` ended: exactly one per submit."""

    job: StepJob
    kind: CompletionKind
    outcome: BuildOutcome | None = None
    error: BaseException | None = None


OnDone = Callable[[Completion], None]
"""Called once per submitted job, from any thread, when it ends; it must not block."""


class Executor(Protocol):
    """Runs the attempts the run loop submits; see the module docstring."""

    retries_steps: bool
    """True if the engine retries a failed attempt itself (``StepSpec.retries``), so the loop
    must not retry it again; False: the loop retries, with a short backoff."""

    def submit(self, job: StepJob, on_done: OnDone) -> None:
        """Start ``job`` (do not wait for it); call ``on_done`` exactly once when it ends (or,
        for a parked remote build, when its job ends: ``JOB_ENDED``)."""
        ...

    def shutdown(self, *, wait: bool) -> None:
        """Start nothing more; with ``wait``, return once every submitted job has ended."""
        ...


class ThreadExecutor:
    """At most ``size`` daemon threads running the submitted jobs, in this process.

    Unlike ``ThreadPoolExecutor``, whose worker threads the interpreter joins at exit, daemon
    threads never keep an interrupted run alive while a step's ``fn`` is still blocked; and a
    submit is only a queue put (the loop already caps how many steps run at once). There is no
    ``Future`` per job: the loop only needs the completion.

    A remote step's build holds a thread only to start and to commit: while its job runs it is
    parked (``JobParked``) on the process's one poller, which reports ``JOB_ENDED``; the loop
    then submits the build's second phase (``StepJob.parked``).
    """

    retries_steps = False

    def __init__(self, size: int, name: str = "marin-step") -> None:
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[StepJob, OnDone, contextvars.Context] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._parked = _ParkedBuilds()

    def submit(self, job: StepJob, on_done: OnDone) -> None:
        # The submitter's context variables (the caller's: the loop runs on its thread) go with
        # the job, as a task runner's do; a thread of its own would start with none of them.
        self._parked.claim(job)
        self._jobs.put((job, on_done, contextvars.copy_context()))
        if len(self._threads) < self._size:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            item = jobs.get()
            if item is None:
                return
            job, on_done, context = item
            del item
            try:
                outcome = context.run(_parking, job)
            except JobParked as parked:
                self._parked.park(job, on_done, parked, context)
            except Deferred as held:
                on_done(Completion(job, CompletionKind.DEFERRED, error=held))
            except BaseException as exc:
                on_done(Completion(job, CompletionKind.FAILED, error=exc))
            else:
                on_done(Completion(job, CompletionKind.DONE, outcome=outcome))
                del outcome
            del job, on_done, context

    def shutdown(self, *, wait: bool) -> None:
        self._parked.close()
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class _ParkedBuilds:
    """A thread executor's parked remote builds, until the loop submits their second phase.

    When a job ends, the loop gets ``JOB_ENDED``; once the executor is shut down (the loop
    left: a second Ctrl-C), a parked build's second phase runs on a thread of its own instead,
    never committing an abandoned build and releasing its lease, as a build whose thread
    waited would have."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[StepJob, contextvars.Context]] = {}
        self._closed = False

    def park(
        self, job: StepJob, on_done: OnDone, parked: JobParked, context: contextvars.Context
    ) -> None:
        """Hand ``parked`` to the poller; its job's end is reported through ``on_done``."""
        resumed = dataclasses.replace(job, parked=parked)
        with self._lock:
            self._waiting[id(parked)] = (resumed, context)

        def ended() -> None:
            with self._lock:  # a shut-down executor's loop reads no more completions
                if not self._closed:
                    on_done(Completion(resumed, CompletionKind.JOB_ENDED))
                    return
            self._finish_alone(id(parked))

        parked.when_ended(ended)

    def claim(self, job: StepJob) -> None:
        """The loop submitted ``job``'s second phase: it is no longer waiting here."""
        if job.parked is not None:
            with self._lock:
                self._waiting.pop(id(job.parked), None)

    def close(self) -> None:
        """No loop reads completions now: builds whose job ended unclaimed finish alone."""
        with self._lock:
            self._closed = True
            ended = [k for k, (job, _) in self._waiting.items() if _ended(job)]
        for key in ended:
            self._finish_alone(key)

    def _finish_alone(self, key: int) -> None:
        with self._lock:
            found = self._waiting.pop(key, None)
        if found is not None:
            job, context = found
            run = functools.partial(context.run, _parking, job)
            threading.Thread(target=_quietly, args=(run,), daemon=True).start()


def _ended(job: StepJob) -> bool:
    return job.parked is not None and job.parked.watch.done.is_set()


def _parking(job: StepJob) -> BuildOutcome:
    """``job.build()``, a remote wait parked instead of holding this thread."""
    with park_waits():
        return job.build()


def _quietly(run: Callable[[], object]) -> None:
    """An abandoned build's second phase: how it ends is its own status file's business."""
    try:
        run()
    except BaseException as exc:  # no loop is left to report it to
        logging.getLogger("marin").info("an abandoned remote build ended: %s", exc)
