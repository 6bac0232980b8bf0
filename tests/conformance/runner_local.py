"""The embedded ``StepRunner`` behind the conformance interface."""

from __future__ import annotations

import os

from marin.execution.errors import MarinError
from marin.execution.lazy import lower
from marin.execution.step_runner import StepRunner
from marin.execution.targets import load_target


class LocalRunner:
    name = "local"

    def supports(self, feature: str) -> bool:
        return True

    def run(
        self,
        target: str,
        *,
        prefix: str,
        max_concurrent: int = 8,
        keep_going: bool = False,
        env: dict[str, str] | None = None,
    ) -> bool:
        saved = {key: os.environ.get(key) for key in env or {}}
        os.environ.update(env or {})
        try:
            specs = lower(load_target(target))
            StepRunner(max_concurrent=max_concurrent, prefix=prefix).run(
                specs, keep_going=keep_going
            )
            return True
        except MarinError:
            return False
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
