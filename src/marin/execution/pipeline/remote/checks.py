"""The one check of ``with_options(remote=...)``, at lowering: errors name the step, the field
and the fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from marin.execution.errors import InvalidStepError
from marin.execution.pipeline.isolation import check_importable
from marin.execution.pipeline.remote.registry import get_backend


def check_remote(remote: object, run: Callable[..., Any], timeout: float | None, step: str) -> None:
    if not isinstance(remote, str) or not remote:
        raise InvalidStepError(
            f"remote={remote!r} is not a backend name",
            "use remote='local' or remote='ray' (or a name given to register_backend)",
            step,
        )
    get_backend(remote, step)
    if timeout is not None:
        raise InvalidStepError(
            f"timeout={timeout:g} with remote={remote!r}: a remote job's time limit is its "
            "backend's",
            "drop timeout= and set the limit in the backend (Ray's entrypoint, a Slurm --time)",
            step,
        )
    check_importable(run, step)
