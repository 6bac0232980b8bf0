"""The values a step may ask about where it runs.

A context has two modes. While fingerprinting, every location is a placeholder, so that the same
pipeline under ``/tmp/a``, ``memory://b`` or ``gs://c`` gets the same fingerprints. At run time
the same questions return concrete paths.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

OUTPUT_PLACEHOLDER = "{OUT}"
PREFIX_PLACEHOLDER = "{PREFIX}"
REGION_PLACEHOLDER = "{REGION}"


def dep_placeholder(name: str) -> str:
    # The dependency's version is part of the fingerprint payload's `deps` section; keeping it out
    # of the placeholder means a version bump is explained once, as `deps.<name>: v1 -> v2`.
    return "{DEP:" + name + "}"


_assigned_devices: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar(
    "marin_assigned_devices", default=()
)


@contextlib.contextmanager
def assigned_devices(devices: tuple[int, ...]) -> Iterator[None]:
    """Run a build with these GPU devices assigned: contexts made inside see ``ctx.devices``.

    The runner wraps ``build_step`` in it with its ``ResourcePool`` grant's devices, so the
    context that ``build_step`` makes carries them without ``build_step`` knowing about pools.
    """
    token = _assigned_devices.set(tuple(int(d) for d in devices))
    try:
        yield
    finally:
        _assigned_devices.reset(token)


def current_devices() -> tuple[int, ...]:
    return _assigned_devices.get()


@dataclass(frozen=True)
class StepContext:
    output_path: str
    prefix: str
    region: str | None
    dep_paths: Mapping[str, str] = field(default_factory=dict)
    """Dependency ``name@version`` -> its path."""
    devices: tuple[int, ...] = field(default_factory=current_devices)
    """The GPU devices assigned to this build (indices as this process numbers them); () if none.

    An isolated step's subprocess gets ``CUDA_VISIBLE_DEVICES`` set to exactly these devices.
    """

    def dep_path(self, dep: Any) -> str:
        """The path of a dependency given as a handle, a ``StepSpec`` or a ``name@version``."""
        step_id = dep if isinstance(dep, str) else dep.step_id
        try:
            return self.dep_paths[step_id]
        except KeyError:
            known = ", ".join(sorted(self.dep_paths)) or "none"
            raise KeyError(
                f"{step_id} is not a dependency of this step (its dependencies: {known})"
            ) from None


def fingerprint_context(deps: tuple[Any, ...]) -> StepContext:
    return StepContext(
        output_path=OUTPUT_PLACEHOLDER,
        prefix=PREFIX_PLACEHOLDER,
        region=REGION_PLACEHOLDER,
        dep_paths={dep.step_id: dep_placeholder(dep.name) for dep in deps},
        devices=(),
    )
