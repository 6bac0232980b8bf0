"""Marin's import path, a real module (not deprecated): the code is in
``marin.execution.run.runner``.
"""

from marin.execution.run.runner import (
    READY_ORDERS,
    RUN_ACTIONS,
    RUN_REPORT_SCHEMA,
    RunListener,
    RunReport,
    StepResult,
    StepRunner,
)

__all__ = [
    "READY_ORDERS",
    "RUN_ACTIONS",
    "RUN_REPORT_SCHEMA",
    "RunListener",
    "RunReport",
    "StepResult",
    "StepRunner",
]
