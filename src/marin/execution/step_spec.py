"""Marin's import path, a real module (not deprecated): the code is in
``marin.execution.pipeline.step_spec``.
"""

from marin.execution.pipeline.step_spec import StepSpec, fingerprint_of, is_absolute_location

__all__ = ["StepSpec", "fingerprint_of", "is_absolute_location"]
