"""The embedded ``StepRunner`` behind the conformance interface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marin.execution.errors import MarinError
from marin.execution.lazy import lower
from marin.execution.pipeline.targets import load_target
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner
from tests.ux.helpers import environ


class LocalRunner:
    name = "local"
    engine: str | None = None
    """No engine: a record names its host and process, and no engine's unit of work."""
    last_report: Any = None
    """The last run's ``RunReport`` (None when it failed before planning)."""
    last_error: MarinError | None = None

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
        on_drift: str = "warn",
        force: Sequence[str] = (),
        cascade: bool = True,
    ) -> bool:
        with environ(env or {}):
            try:
                specs = lower(load_target(target))
                self.last_report = None
                options = RunOptions(
                    max_concurrent=max_concurrent,
                    on_drift=on_drift,
                    cascade=cascade,
                    keep_going=keep_going,
                    force=force,
                )
                self.last_report = StepRunner(options, prefix=prefix).run(specs)
                return True
            except MarinError as exc:
                self.last_error = exc
                self.last_report = getattr(exc, "report", None)
                return False
