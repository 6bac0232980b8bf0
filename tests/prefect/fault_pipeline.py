"""A pipeline whose step ``f/b`` fails its Prefect task after its build committed (a fault
injected into ``marin_prefect.compile._step_result``, the real function wrapped), for the
deployment test: a flow run with a failed task must end Failed on a worker too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import marin_prefect.compile as compiled
from marin.execution.lazy import OUT, ArtifactStep, apply

_real_step_result = compiled._step_result


def _fails_for_b(step_id: str, *args: Any) -> Any:
    if step_id.startswith("f/b@"):
        raise RuntimeError("injected after the build")
    return _real_step_result(step_id, *args)


compiled._step_result = _fails_for_b


def write(out: str, after: list[str]) -> str:
    Path(out).write_text("x")
    return "ok"


def pipeline() -> list[ArtifactStep]:
    a = apply("f/a", write, version="v1", out=OUT, after=[])
    # f/b is a target nothing reads: no downstream task notices its failure for the flow.
    b = apply("f/b", write, version="v1", out=OUT, after=[a])
    return [b, apply("f/c", write, version="v1", out=OUT, after=[a])]
