"""How a step's build runs once the run loop has decided it may start: the ``Executor`` seam.

The loop (``marin.execution.run.loop``) decides *what* starts and *when*; an executor only
runs what it is handed, somewhere, and reports how it ended. It is small on purpose, like
Prefect's ``TaskRunner``: ``submit`` one attempt, get told of its ``Completion`` through a
callback (from any thread), ``shutdown``. ``ThreadExecutor`` runs attempts on daemon threads in
this process (``StepRunner``); ``marin_prefect.compile.PrefectExecutor`` runs each as a Prefect
task run (threads or Dask, whatever the flow's task runner is).

A later executor plugs in here, not in a new loop (one that spreads steps over machines, say).
An executor says how its builds wait (``wait``): the thread executor's return ``Pending`` (a
step another runner's lease holds, a remote job running), which the loop holds until what it
waits for is over (``marin.execution.run.waiting``); a Prefect task waits in its thread.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from marin.execution.builder.commit import build_step
from marin.execution.builder.outcome import BuildOutcome, Pending
from marin.execution.builder.request import BuildRequest
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.vocabulary import Wait


class CompletionKind(StrEnum):
    """How one attempt ended."""

    DONE = "done"
    """Built, or served (its ``outcome`` says which)."""
    FAILED = "failed"
    """Raised ``error``; the loop retries it if the executor does not retry by itself."""
    PENDING = "pending"
    """Not done yet (``pending`` says why): the loop holds it until it can go on, without
    counting an attempt."""


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
    resume: Callable[[], BuildOutcome | Pending] | None = None
    """A pending build going on (``Pending.resume``): ``build`` runs it instead."""

    def build(self) -> BuildOutcome | Pending:
        """Build the request here, in the calling thread (raises what ``build_step`` raises)."""
        if self.resume is not None:
            return self.resume()
        return build_step(self.request)


@dataclass(frozen=True)
class Completion:
    """How a submitted ``StepJob`` ended: exactly one per submit."""

    job: StepJob
    kind: CompletionKind
    outcome: BuildOutcome | None = None
    error: BaseException | None = None
    pending: Pending | None = None


OnDone = Callable[[Completion], None]
"""Called once per submitted job, from any thread, when it ends; it must not block."""


class Executor(Protocol):
    """Runs the attempts the run loop submits; see the module docstring."""

    retries_steps: bool
    """True if the engine retries a failed attempt itself (``StepSpec.retries``), so the loop
    must not retry it again; False: the loop retries, with a short backoff."""

    wait: Wait
    """How the builds it runs wait for another runner's lease and a remote job:
    ``Wait.RETURN`` hands the loop a ``Pending``; ``Wait.BLOCK`` waits in the build's thread."""

    def submit(self, job: StepJob, on_done: OnDone) -> None:
        """Start ``job`` (do not wait for it); call ``on_done`` exactly once when it ends."""
        ...

    def shutdown(self, *, wait: bool) -> None:
        """Start nothing more; with ``wait``, return once every submitted job has ended."""
        ...


class ThreadExecutor:
    """At most ``size`` daemon threads running the submitted jobs, in this process.

    Unlike ``ThreadPoolExecutor``, whose worker threads the interpreter joins at exit, daemon
    threads never keep an interrupted run alive while a step's ``fn`` is still blocked; and a
    submit is only a queue put (the loop already caps how many steps run at once). There is no
    ``Future`` per job: the loop only needs the completion. Its builds return ``Pending``
    rather than wait, so a waiting step (a held lease, a running job) holds no thread.
    """

    retries_steps = False
    wait = Wait.RETURN

    def __init__(self, size: int, name: str = "marin-step") -> None:
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[StepJob, OnDone, contextvars.Context] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []

    def submit(self, job: StepJob, on_done: OnDone) -> None:
        # The submitter's context variables (the caller's: the loop runs on its thread) go with
        # the job, as a task runner's do; a thread of its own would start with none of them.
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
                result = context.run(job.build)
            except BaseException as exc:
                on_done(Completion(job, CompletionKind.FAILED, error=exc))
            else:
                if isinstance(result, Pending):
                    on_done(Completion(job, CompletionKind.PENDING, pending=result))
                else:
                    on_done(Completion(job, CompletionKind.DONE, outcome=result))
                del result
            del job, on_done, context

    def shutdown(self, *, wait: bool) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
