"""Building steps on a Dask cluster: what a worker is sent, how it loads it, where it may run.

A compiled flow given ``prefect_dask.DaskTaskRunner`` (``to_prefect_flow(..., task_runner=...)``,
or ``$MARIN_PREFECT_DASK_ADDRESS`` on the Prefect worker for the deployable entry flow) runs each
step's build in a Dask worker process. The run loop stays in the flow run (one loop, one plan);
only the build moves, and it is still ``build_step``, with the same lease, record and status.

What a worker gets is what a remote machine can use: the **target** (made absolute for a file)
and the step's build arguments, pickled. The worker loads the target first, with the core's
``load_target``, which registers a file's module under the same name as on the driver
(``marin_target_<stem>``), so the pickled functions resolve to the worker's own copy of the
pipeline code. A worker that cannot load the pipeline fails the step at once with one error
naming the worker and the target (``WorkerImportError``), never a task left ``Pending``. A
worker whose copy differs from the code the driver lowered (a source edited since, a worker
started from another checkout) fails the step before ``fn`` runs, as a remote job does
(``remote/code_check.py``): the record names the driver's code digest, so the worker must run
that code.

Placement: a step's accelerators (``resources`` other than ``cpu`` and ``memory``) become Dask
worker resources in upper case, so a ``gpu=1`` step runs only on a worker started with
``--resources GPU=N`` (``dask.annotate`` around the submission). ``queue`` stays a routing name
for the engines that have queues (a Prefect tag here); Dask has none.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.execution.errors import MarinError

if TYPE_CHECKING:
    from marin.execution.builder.commit import BuildOutcome
    from marin.execution.builder.request import BuildRequest
    from marin.execution.pipeline.step_spec import StepSpec
    from marin.execution.plan.decide import Decision, Policy, Upstream
    from marin.execution.vocabulary import BuildOutcomeKind
    from marin_prefect.compile import FlowOptions

DASK_ADDRESS_ENV = "MARIN_PREFECT_DASK_ADDRESS"
"""The Dask scheduler the deployable entry flow sends builds to: the Prefect worker's own
setting, never a run parameter (docs/prefect.md, threat model)."""

UNPLACED_KINDS = ("cpu", "memory")
"""Resource kinds every Dask worker has without declaring them: they do not restrict placement."""


class WorkerImportError(MarinError):
    """A Dask worker cannot load the pipeline (or the step it was sent) to build a step."""


def is_dask_runner(task_runner: Any) -> bool:
    """Whether ``task_runner`` is prefect-dask's (checked by module: prefect-dask is optional)."""
    return type(task_runner).__module__.split(".")[0] == "prefect_dask"


def task_runner_from_env() -> Any | None:
    """A ``DaskTaskRunner`` for ``$MARIN_PREFECT_DASK_ADDRESS``, or None when it is unset."""
    address = os.environ.get(DASK_ADDRESS_ENV, "").strip()
    if not address:
        return None
    if "://" not in address:
        raise MarinError(
            f"{DASK_ADDRESS_ENV}={address!r} is not a Dask scheduler address",
            f"set {DASK_ADDRESS_ENV} on the Prefect worker to the scheduler's address, e.g. "
            "tcp://10.0.0.5:8786, or unset it to build on the worker's threads",
        )
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise MarinError(
            f"{DASK_ADDRESS_ENV} is set ({address}), but prefect-dask is not installed",
            "pip install 'marin-execution[dask]' where the Prefect worker runs, or unset "
            f"{DASK_ADDRESS_ENV}",
        ) from None
    return DaskTaskRunner(address=address)


def dask_resources(spec: StepSpec) -> dict[str, float]:
    """The Dask worker resources a step needs: ``gpu=1`` -> ``{"GPU": 1}``; none for cpu and
    memory (Dask places those by itself: a worker declares only what it has to share)."""
    amounts = spec.resources.amounts() if spec.resources is not None else {}
    return {k.upper(): float(v) for k, v in sorted(amounts.items()) if k not in UNPLACED_KINDS}


@contextlib.contextmanager
def placement(spec: StepSpec) -> Iterator[None]:
    """Around a submission: the step's Dask resources as an annotation of its Dask task."""
    needs = dask_resources(spec)
    if not needs:
        yield
        return
    import dask

    with dask.annotate(resources=needs):
        yield


# -- what a worker is sent --------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteBuild:
    """One step's build arguments as a worker gets them (pickled after its target is loaded)."""

    prefix: str
    spec: StepSpec
    policy: Policy
    region: str | None
    decision: Decision | None
    upstream: list[Upstream] | None
    options: FlowOptions


@dataclass(frozen=True)
class RemoteOutcome:
    """A worker's ``BuildOutcome`` without the spec (the driver has its own): plain data."""

    action: BuildOutcomeKind
    record: Any
    output_url: str
    duration_s: float
    drift: tuple[str, ...]
    reason: str

    def outcome(self, spec: StepSpec) -> BuildOutcome:
        from marin.execution.builder.commit import BuildOutcome

        return BuildOutcome(
            spec, self.action, self.record, self.output_url, self.duration_s, self.drift,
            self.reason,
        )  # fmt: skip


def pack(call: BuildRequest, options: FlowOptions) -> bytes:
    """The build's arguments, pickled on the driver (functions by reference to their module)."""
    import cloudpickle

    build = RemoteBuild(
        call.location.url, call.spec, call.policy, call.region, call.decision,
        None if call.upstream is None else list(call.upstream), options,
    )  # fmt: skip
    return bytes(cloudpickle.dumps(build))


def worker_identity() -> dict[str, Any]:
    """This Dask worker's name and address (for errors and the record's provenance)."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not in a Dask worker (another task runner)
        return {"dask_worker": None, "dask_address": None}
    return {"dask_worker": str(worker.name), "dask_address": str(worker.address)}


def _where(identity: dict[str, Any]) -> str:
    name, address = identity["dask_worker"], identity["dask_address"]
    if address is None:
        return f"{socket.gethostname()} (pid {os.getpid()})"
    return f"{name} at {address} on {socket.gethostname()}"


def unpack(target: str | None, payload: bytes, identity: dict[str, Any]) -> RemoteBuild:
    """Load the pipeline on this worker, then the build arguments; one clear error if either
    fails (naming this worker and the target)."""
    import pickle

    from marin.execution.pipeline.targets import load_target

    fix = (
        "install the pipeline's code on every Dask worker at the same path (or as a module "
        "path installed there), with the same marin-execution, and start the workers from it"
    )
    where = _where(identity)
    if target is not None:
        try:
            load_target(target)
        except Exception as exc:  # any error here means this worker cannot build the step
            detail = exc.what if isinstance(exc, MarinError) else f"{type(exc).__name__}: {exc}"
            raise WorkerImportError(
                f"Dask worker {where} cannot load the pipeline {target}: {detail}", fix
            ) from None
    try:
        build = pickle.loads(payload)
    except Exception as exc:
        raise WorkerImportError(
            f"Dask worker {where} cannot load a step of {target or 'the pipeline'}: "
            f"{type(exc).__name__}: {exc}",
            fix,
        ) from None
    if not isinstance(build, RemoteBuild):
        raise WorkerImportError(f"Dask worker {where} was sent {type(build).__name__}", fix)
    return build


def check_worker_code(build: RemoteBuild) -> None:
    """Before the build: the code this worker imported is the code the driver lowered, which
    the record names (the recipe's code digest), or the step fails naming the step and the fix.

    Raises:
        CodeChangedError: a function or class of the step changed since the driver lowered it.
    """
    from marin.execution.pipeline.lower import code_inputs
    from marin.execution.remote.code_check import check_code, expected_code

    spec, recipe = build.spec, build.decision.recipe if build.decision else None
    code = recipe.code if recipe is not None else spec.code
    if code is not None:  # None: the worker's build digests its own code, which it records
        expected = expected_code(spec.step_id, code)
        check_code(spec.run, code_inputs(spec.run), expected=expected, where="Dask worker")


def build_remote(target: str | None, payload: bytes) -> RemoteOutcome:
    """A step's build on this worker: ``build_step`` with the driver's arguments, holding the
    flow's Prefect concurrency slots as a local build does. The record names this worker."""
    import threading

    from marin.execution.builder.commit import build_step
    from marin.execution.builder.request import BuildRequest
    from marin.execution.store.location import open_prefix
    from marin_prefect.compile import hold_slots_and_build

    identity = worker_identity()
    build = unpack(target, payload, identity)
    spec = build.spec
    check_worker_code(build)
    # The worker's own prefix policy (MARIN_ALLOWED_PREFIXES) applies to what the driver sent.
    location = open_prefix(build.prefix)
    # The loop's own build request, rebuilt from what the driver sent: no devices assigned
    # here, and no abandon flag (that is the driver process's Ctrl-C); the worker reads its own
    # lease TTL.
    request = BuildRequest(
        spec, location, build.policy, build.region, build.decision, build.upstream,
        threading.Event(), devices=(),
    )  # fmt: skip
    run = functools.partial(build_step, request)
    outcome = hold_slots_and_build(spec, build.options, run, identity)
    return RemoteOutcome(
        outcome.action, outcome.record, outcome.output_url, outcome.duration_s, outcome.drift,
        outcome.reason,
    )  # fmt: skip
