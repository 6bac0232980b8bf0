"""Run Marin pipelines on Prefect 3.

``to_prefect_flow`` compiles a pipeline into a Prefect flow; ``marin_prefect.flows:marin_pipeline``
is a deployable entry flow. Importing this package does not import Prefect (the ``marin`` CLI
loads ``marin_prefect.cli`` and must stay fast); the names below are loaded on first use.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# A flow run without PREFECT_API_URL starts Prefect's temporary server in this process, whose
# telemetry heartbeat prints ~130 lines of "sqlite3.OperationalError: database is locked" per
# run. Analytics off is the default here (a user's own setting wins); it only affects servers
# this process starts, and Prefect reads it at import, which comes after this package's import.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

if TYPE_CHECKING:
    from marin_prefect.compile import to_prefect_flow
    from marin_prefect.flows import marin_pipeline

__all__ = ["marin_pipeline", "to_prefect_flow"]


def __getattr__(name: str) -> Any:
    if name == "to_prefect_flow":
        from marin_prefect.compile import to_prefect_flow

        return to_prefect_flow
    if name == "marin_pipeline":
        from marin_prefect.flows import marin_pipeline

        return marin_pipeline
    raise AttributeError(f"module 'marin_prefect' has no attribute {name!r}")
