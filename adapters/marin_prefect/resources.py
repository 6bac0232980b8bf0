"""A step's declared resources as Prefect global concurrency limits, tags and a timeout.

Each resource kind is one global concurrency limit named ``marin-<kind>`` (``marin-cpu``,
``marin-gpu``, ``marin-memory-gib``, ``marin-tpu``...), whose size is the capacity of the cluster
the flows share. A step occupies as many slots as it asks for (memory in whole GiB), and only
while it builds: a step that is already built takes none. Limits are taken one kind at a time,
always in name order, so two steps can never each hold what the other waits for in a cycle.

The limits must exist (``strict=True``: a missing limit fails the step rather than silently
running unlimited). Create them with ``marin export prefect ... --create-limits
cpu=16,memory=64GiB,gpu=2``, or ``prefect gcl create marin-gpu --limit 2``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

LIMIT_PREFIX = "marin-"
_GIB = 1024**3


def limit_name(kind: str) -> str:
    return f"{LIMIT_PREFIX}memory-gib" if kind == "memory" else f"{LIMIT_PREFIX}{kind}"


def _slots(kind: str, amount: float) -> int:
    value = amount / _GIB if kind == "memory" else amount
    return max(1, math.ceil(value - 1e-9))


def resource_slots(spec: Any) -> list[tuple[str, int]]:
    """``[(limit name, slots)]`` a step occupies while it builds, sorted by limit name."""
    resources = getattr(spec, "resources", None)
    amounts = resources.amounts() if resources is not None else {}
    return sorted((limit_name(kind), _slots(kind, amount)) for kind, amount in amounts.items())


def limits_for_capacity(capacity: Any) -> list[tuple[str, int]]:
    """``[(limit name, size)]`` for a cluster's capacity (a ``Resources``)."""
    return sorted(
        (limit_name(kind), math.floor(amount / _GIB) if kind == "memory" else int(amount))
        for kind, amount in capacity.amounts().items()
    )


def task_tags(spec: Any) -> list[str]:
    """``marin``, each accelerator kind the step asks for (``gpu``, ``tpu``...), its queue."""
    tags = ["marin"]
    resources = getattr(spec, "resources", None)
    if resources is not None:
        tags += [k for k in resources.amounts() if k not in ("cpu", "memory")]
    queue = getattr(spec, "queue", None)
    if queue:
        tags.append(queue)
    return list(dict.fromkeys(tags))


@contextlib.contextmanager
def resource_concurrency(spec: Any, logger: Any = None) -> Iterator[list[tuple[str, int]]]:
    """Hold the step's slots of every ``marin-<kind>`` limit for the duration of the block."""
    slots = resource_slots(spec)
    if not slots:
        yield slots
        return
    from prefect.concurrency.sync import concurrency

    from marin.execution.errors import MarinError

    asked = time.perf_counter()
    with contextlib.ExitStack() as stack:
        for name, occupy in slots:
            # strict: a missing limit is an error, not an unlimited run. The lease is renewed
            # while the step builds; a transient renewal error must not kill a long build.
            try:
                stack.enter_context(
                    concurrency(
                        name, occupy=occupy, strict=True, raise_on_lease_renewal_failure=False
                    )
                )
            except Exception as exc:
                # Prefect's ConcurrencySlotAcquisitionError lives in a private module.
                if type(exc).__name__ != "ConcurrencySlotAcquisitionError":
                    raise
                raise MarinError(
                    f"cannot take {occupy} slot(s) of the Prefect global concurrency limit "
                    f"{name} ({exc})",
                    f"create the limit sized for your cluster: prefect gcl create {name} "
                    "--limit N, or marin export prefect TARGET --create-limits "
                    "cpu=16,memory=64GiB,gpu=2",
                    spec.step_id,
                ) from None
        if logger is not None:
            logger.info(
                "%s holds %s (waited %.2fs)",
                spec.step_id,
                ", ".join(f"{n}={k}" for n, k in slots),
                time.perf_counter() - asked,
            )
        yield slots


def create_limits(limits: list[tuple[str, int]]) -> list[str]:
    """Create or resize the global concurrency limits on the current Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
    )
    from prefect.exceptions import ObjectNotFound

    done = []
    with get_client(sync_client=True) as client:
        for name, size in limits:
            try:
                client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=size)
                )
                done.append(f"created {name} (limit {size})")
            else:
                client.update_global_concurrency_limit(
                    name, GlobalConcurrencyLimitUpdate(limit=size)
                )
                done.append(f"set {name} to limit {size}")
    return done


def limits_commands(limits: list[tuple[str, int]]) -> list[str]:
    """The equivalent ``prefect gcl create`` lines, for docs and hints."""
    return [f"prefect gcl create {name} --limit {size}" for name, size in limits]
