"""The public home of fingerprinting, where Marin users look for it.

Nothing is defined here: canonical JSON lives in ``canonical.py`` and hashing in
``step_spec.py``; this module only re-exports them under one name.
"""

from __future__ import annotations

from marin.execution.errors import FingerprintMismatchError
from marin.execution.pipeline.canonical import register_fingerprint, to_canonical
from marin.execution.pipeline.step_spec import fingerprint_of

__all__ = ["FingerprintMismatchError", "fingerprint_of", "register_fingerprint", "to_canonical"]
