"""The backend protocol of remote steps (``with_options(remote="local")``).

A backend places a step's call somewhere else (a detached process, a Ray cluster, Slurm...) and
answers five questions about it; the core does everything else (the job record, the lease, the
wait, the commit). Register your own with ``register_backend("slurm", SlurmBackend())``
(``registry.py``).

``job.json`` is untrusted (anyone who can write the prefix can plant one), so a job it names is
touched only once the backend vouches for it: ``owner`` answers what the job was submitted for
(``JobSpec.owner``, kept where only the submitter writes), and the core compares it with the
step's own (``job_owner``) before it reattaches to, collects, stops or removes the job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from marin.execution.pipeline.remote_option import DEFAULT_PLACEMENT_TIMEOUT_S
from marin.execution.store.step_folder import JobHandle as JobHandle  # as job.json stores it
from marin.execution.vocabulary import JobState


@dataclass(frozen=True)
class JobSpec:
    """What a backend runs: ``python -m marin.execution.pipeline.isolated_child CALL RESULT``,
    with ``call`` the pickled call (``fn`` by reference, its config, the run context)."""

    step_id: str
    call: bytes
    """The payload ``isolated_child`` reads (see ``pipeline/isolation.py``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment additions for the job (``CUDA_VISIBLE_DEVICES``...)."""
    gpus: int = 0
    """Per rank."""
    ranks: int = 1
    """A gang: ``fn`` runs as this many processes, started together, ended together (a rank
    that ends otherwise than by returning ends them all); rank 0's value is the job's."""
    rank_placement: str = "pack"
    """A gang's ranks on nodes: a ``RankPlacement`` (``pack``: as few nodes as fit)."""
    placement_timeout: float = DEFAULT_PLACEMENT_TIMEOUT_S
    """How long a gang waits for its ranks' placement before it fails (seconds)."""
    owner: str = ""
    """What the job is for (``job_owner``: the step's output and build): the backend keeps it
    with the job, where only the submitter writes, and ``owner`` answers it."""


def job_owner(output: str, build_id: str) -> str:
    """The owner of a build's job: the step's full output path and the build's id."""
    return json.dumps({"build_id": build_id, "output": output}, sort_keys=True)


def parse_owner(owner: str) -> tuple[str, str] | None:
    """``(output, build_id)`` of a ``job_owner`` string; None for anything else."""
    try:
        raw = json.loads(owner)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    output, build_id = raw.get("output"), raw.get("build_id")
    if not isinstance(output, str) or not isinstance(build_id, str):
        return None
    return output, build_id


@dataclass(frozen=True)
class JobStatus:
    """One look at a job: its state, and when it ended the step's returned value or why it
    failed."""

    state: JobState
    result: bytes | None = None
    """``isolated_child``'s outcome (JSON, read back from where only the job writes), once
    ``fn`` returned or raised (state SUCCEEDED)."""
    detail: str = ""
    ended_at: float | None = None
    """When the job ended (seconds since the epoch), where the backend knows it: a build that
    collects a job long ended reports the job's own time (``timing.py``), not its commit's."""


@runtime_checkable
class RemoteBackend(Protocol):
    """Where a remote step's job runs. Implementations must make ``submit`` idempotent per
    ``idempotency_key`` where the backend can (Ray refuses a second submission id), and never
    raise from ``status`` for a job they no longer know (answer ``JobState.LOST``)."""

    def submit(self, job: JobSpec, idempotency_key: str) -> JobHandle:
        """Start the job; return at once."""
        ...

    def status(self, handle: JobHandle) -> JobStatus:
        """The job's state now (cheap: the poller calls it with backoff)."""
        ...

    def logs(self, handle: JobHandle, tail: int = 40) -> str:
        """The last ``tail`` lines the job printed (``log_lines``: split on newlines only)."""
        ...

    def cancel(self, handle: JobHandle) -> None:
        """Stop the job and whatever it started; a job already ended is left alone."""
        ...

    def owner(self, handle: JobHandle) -> str | None:
        """The ``JobSpec.owner`` the job was submitted with, as the backend kept it (never read
        from ``job.json``); ``""`` for a job it knows without one, None for a job it does not
        know (nothing of it runs or remains)."""
        ...


# Optional, beside the five methods (the core asks ``getattr``):
#
# - ``scope() -> dict[str, str]``: where this backend can see the jobs it submits, when that is
#   not everywhere (the ``local`` backend: this host, this user, this jobs root). The core
#   records it in ``job.json`` before the submit; a later driver whose backend answers another
#   scope and does not know the job cannot tell "lost" from "not visible here", so it never
#   calls the job lost (``fence.is_this_steps``). Without it, a job unknown to the backend is
#   lost wherever it is asked.
# - ``running_jobs() -> dict[str, str]``: each running job this backend can list cheaply (job id
#   -> its ``owner``): before a job is submitted, one that writes the same output, whatever
#   ``job.json`` says (edited or deleted by hand), stops the build instead of a second job.
# - ``release(handle)``: remove an ended job's files (``cleanup.py``).


def peek(backend: RemoteBackend, handle: JobHandle) -> JobStatus:
    """``backend.status`` for a command that only looks (``plan``, ``show``, ``logs``,
    ``cancel`` before it stops anything): a backend whose ``status`` also reaps what a dead job
    left running (``local`` ends an orphaned process group) answers by its ``peek``, which
    never signals anything; such leftovers count as running."""
    look = getattr(backend, "peek", None)
    return look(handle) if callable(look) else backend.status(handle)


def log_lines(text: str) -> list[str]:
    """A log's lines: split on newlines only (``\\r``, U+2028 or ``\\x1e`` in a job's output
    is data, shown escaped within its line: never a line of its own)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines
