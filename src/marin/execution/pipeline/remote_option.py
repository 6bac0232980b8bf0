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

BUILTIN_BACKENDS = ("local", "ray")
DEFAULT_MAX_PREEMPTIONS = 10
"""How many times a remote step's job lost to a signal (a preempted host) is submitted again
when the step does not say (``max_preemptions``); ``retries`` counts only ``fn``'s errors."""
"""The backends ``execution/remote/registry.py`` makes on first use."""

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

    @property
    def fn(self) -> Callable[..., Any]:
        return _function_of(self.run)

    @property
    def wrapped_fn(self) -> Callable[..., Any]:
        return _function_of(self.run)

    def __call__(self, ctx: StepContext) -> JobToRun:
        return JobToRun(self, ctx)
