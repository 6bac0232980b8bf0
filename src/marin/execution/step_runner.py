"""Marin's import path, a real module (not deprecated): the code is in ``marin.execution.run``
(``runner``, with its report, listener and ready orders)."""

from marin.execution.run.loop import RunListener
from marin.execution.run.report import RUN_ACTIONS, RUN_REPORT_SCHEMA, RunReport, StepResult
from marin.execution.run.runner import StepRunner
from marin.execution.run.scheduler import READY_ORDERS

__all__ = [
    "READY_ORDERS",
    "RUN_ACTIONS",
    "RUN_REPORT_SCHEMA",
    "RunListener",
    "RunReport",
    "StepResult",
    "StepRunner",
]
