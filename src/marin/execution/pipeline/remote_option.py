"""The ``remote=`` option as the model says it: which backend names a step may give, the one
check at lowering, and what a remote step's ``run`` is.

A remote step's ``run`` is a ``RemoteRun``: called by the build (``builder/commit.py``), it
runs nothing here and returns a ``JobToRun``, the call to place as a job, which the build hands
to the remote runtime (``execution/remote/``, a floor above this one). Errors name the step, the
field and the fix.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marin.execution.errors import InvalidStepError
from marin.execution.pipeline.context import StepContext
from marin.execution.pipeline.isolation import _function_of, check_importable
from marin.execution.vocabulary import RankPlacement

BUILTIN_BACKENDS = ("local", "ray")
"""The backends ``execution/remote/registry.py`` makes on first use."""
DEFAULT_MAX_PREEMPTIONS = 10
"""How many times a remote step's job lost to a signal (a preempted host) is submitted again
when the step does not say (``max_preemptions``); ``retries`` counts only ``fn``'s errors."""
DEFAULT_RANK_PLACEMENT = RankPlacement.PACK
"""A gang's ranks on as few nodes as fit, when the step does not say (Ray's own default)."""
DEFAULT_PLACEMENT_TIMEOUT_S = 300.0
"""How long a gang waits for its ranks' placement (every bundle reserved) when the step does
not say (``placement_timeout``): a cluster too small for it fails the step, never waits forever."""

_registered: set[str] = set()
_lock = threading.Lock()


def allow_backend(name: str) -> None:
    """A backend was registered under ``name`` (``register_backend``): steps may name it."""
    with _lock:
        _registered.add(name)


def backend_names() -> list[str]:
    """Every name ``remote=`` may give: the built-in backends and the registered ones."""
    with _lock:
        return sorted({*BUILTIN_BACKENDS, *_registered})


def check_backend(name: str, step: str | None = None) -> None:
    """Raise unless ``name`` names a backend.

    Raises:
        InvalidStepError: no backend has that name (the message lists the known ones).
    """
    if name not in backend_names():
        raise InvalidStepError(
            f"remote={name!r} names no registered backend (known: {', '.join(backend_names())})",
            "use remote='local' or 'ray', or register_backend(name, backend) before lowering",
            step,
        )


def check_remote(remote: object, run: Callable[..., Any], timeout: float | None, step: str) -> None:
    """The one check of ``with_options(remote=...)``, at lowering.

    Raises:
        InvalidStepError: not a backend name, an unknown backend, a ``timeout`` (a job's time
            limit is its backend's), or a ``fn`` another process cannot import.
    """
    if not isinstance(remote, str) or not remote:
        raise InvalidStepError(
            f"remote={remote!r} is not a backend name",
            "use remote='local' or remote='ray' (or a name given to register_backend)",
            step,
        )
    check_backend(remote, step)
    if timeout is not None:
        raise InvalidStepError(
            f"timeout={timeout:g} with remote={remote!r}: a remote job's time limit is its "
            "backend's",
            "drop timeout= and set the limit in the backend (Ray's entrypoint, a Slurm --time)",
            step,
        )
    check_importable(run, step)


def _whole(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_gang(remote: object, ranks: object, max_preemptions: object, step: str) -> None:
    """The one check of ``ranks`` (a gang) and ``max_preemptions``, at lowering: whole numbers,
    on a remote step.

    Raises:
        InvalidStepError: ``ranks`` is not a whole number >= 1, ``max_preemptions`` not one
            >= 0, or either is given without ``remote``.
    """
    if ranks is not None and not _whole(ranks, 1):
        raise InvalidStepError(
            f"ranks={ranks!r} is not a number of processes",
            "use a whole number >= 1 (ranks=4 runs fn as 4 processes of one gang)",
            step,
        )
    if max_preemptions is not None and not _whole(max_preemptions, 0):
        raise InvalidStepError(
            f"max_preemptions={max_preemptions!r} is not a number of resubmissions",
            f"use a whole number >= 0 (default {DEFAULT_MAX_PREEMPTIONS})",
            step,
        )
    for name, value in (("ranks", ranks), ("max_preemptions", max_preemptions)):
        if value is not None and remote is None:
            raise InvalidStepError(
                f"{name}={value!r} without remote: only a remote step's job has {name}",
                f"add remote='local' (or 'ray') to with_options, or drop {name}",
                step,
            )


def placement_timeout_s(ranks: object, timeout: object, step: str) -> float:
    """The one check of ``placement_timeout``, at lowering: a duration, on a gang; the
    step's bound on its wait for placement (the default when it does not say).

    Raises:
        InvalidStepError: not a duration (seconds, ``"5m"``), or given without ``ranks``.
    """
    from marin.execution.pipeline.resources import parse_duration

    if timeout is None:
        return DEFAULT_PLACEMENT_TIMEOUT_S
    if ranks is None:
        raise InvalidStepError(
            f"placement_timeout={timeout!r} without ranks: only a gang waits for placement",
            "add ranks=N (and remote='ray') to with_options, or drop placement_timeout",
            step,
        )
    return parse_duration(timeout, step, "placement_timeout")


def check_rank_placement(remote: object, ranks: object, placement: object, step: str) -> None:
    """The one check of ``rank_placement``, at lowering: a ``RankPlacement``, on a gang that
    its backend can place so (``local`` ranks share one machine: never one per node).

    Raises:
        InvalidStepError: not a ``RankPlacement`` value, given without ``ranks``, or
            ``strict_spread`` on ``remote='local'``.
    """
    known = ", ".join(repr(str(p)) for p in RankPlacement)
    if not isinstance(placement, str) or placement not in set(RankPlacement):
        raise InvalidStepError(
            f"rank_placement={placement!r} is not a placement of ranks",
            f"use one of {known} (Ray's placement group strategies; default 'pack')",
            step,
        )
    if ranks is None:
        raise InvalidStepError(
            f"rank_placement={placement!r} without ranks: only a gang's ranks are placed",
            "add ranks=N (and remote='ray') to with_options, or drop rank_placement",
            step,
        )
    if remote == "local" and placement == RankPlacement.STRICT_SPREAD and ranks != 1:
        raise InvalidStepError(
            f"rank_placement='strict_spread' with remote='local': a local gang's {ranks} "
            "ranks all run on this machine, never one per node",
            "use remote='ray' to spread the ranks over nodes, or rank_placement='spread' "
            "(a preference) to run the same pipeline locally",
            step,
        )


def preemptions_allowed(max_preemptions: int | None) -> int:
    """The step's preemption budget: its own, else the default (written once, here)."""
    return DEFAULT_MAX_PREEMPTIONS if max_preemptions is None else max_preemptions


@dataclass(frozen=True)
class JobToRun:
    """What a remote step's ``run`` returns: its call, with the run context, to place as a
    job. The build submits it (``execution/remote/call.py``); nothing ran yet."""

    remote: RemoteRun
    ctx: StepContext


@dataclass(frozen=True)
class RemoteRun:
    """``spec.run`` for a step with ``remote=backend``: ``run`` is the user's call
    (``run(build_config(ctx))``), sent to the job as it is."""

    run: Callable[[StepContext], Any]
    step_id: str
    backend: str
    gpus: int = 0
    ranks: int = 1
    """The gang's size: ``fn`` runs as this many processes of one job (1: no gang)."""
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS
    """How many times a job lost to a signal is submitted again within one attempt."""
    rank_placement: RankPlacement = DEFAULT_RANK_PLACEMENT
    """How the gang's ranks are placed on a cluster's nodes."""
    placement_timeout: float = DEFAULT_PLACEMENT_TIMEOUT_S
    """How long the gang waits for its placement before the step fails (seconds)."""

    @property
    def fn(self) -> Callable[..., Any]:
        return _function_of(self.run)

    @property
    def wrapped_fn(self) -> Callable[..., Any]:
        return _function_of(self.run)

    def __call__(self, ctx: StepContext) -> JobToRun:
        return JobToRun(self, ctx)


def ranks_of(run: object) -> int:
    """The world size a step's ``run`` runs with: a remote step's ``ranks``, else 1."""
    return run.ranks if isinstance(run, RemoteRun) else 1
