"""The Prefect adapter behind the conformance interface: each run is a real Prefect flow run.

The Prefect test harness (a temporary API server on SQLite, about 12 s to start) is started once
per process by ``marin_testing.prefect`` and shared with ``tests/prefect``; it stops at the end
of the session (``tests/prefect``'s session fixture, or at exit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from marin_testing.prefect import isolate_prefect_home, start_harness

# Before anything below imports Prefect: its settings, and cache records, live in PREFECT_HOME.
isolate_prefect_home()

from marin.execution.errors import MarinError  # noqa: E402
from marin.execution.plan.options import RunOptions  # noqa: E402
from tests.ux.helpers import environ  # noqa: E402


class PrefectRunner:
    name = "prefect"
    engine = "prefect"

    def engine_unit(self, engine: Mapping[str, Any]) -> dict[str, Any]:
        """What Prefect's API holds about the task run a record names (its ``engine``)."""
        from uuid import UUID

        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            task_run = client.read_task_run(UUID(str(engine["task_run_id"])))
        return {"step_id": task_run.name, "flow_run_id": str(task_run.flow_run_id)}

    def supports(self, feature: str) -> bool:
        # ThreadPoolTaskRunner runs steps concurrently, in this process; the flow body dispatches
        # a step when its last dependency finishes and stops dispatching after a failure.
        return feature in {"concurrency", "fail-fast", "keep-going", "skip", "retries"}

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
        """Compile ``target`` and run it as a flow; True iff the flow run completed."""
        start_harness()
        from marin_prefect import to_prefect_flow

        with environ(env or {}):
            try:
                options = RunOptions(
                    max_concurrent=max_concurrent, keep_going=keep_going, on_drift=on_drift,
                    force=list(force), cascade=cascade,
                )  # fmt: skip
                pipeline = to_prefect_flow(target, prefix=prefix, options=options)
            except MarinError:
                return False
            state = pipeline(return_state=True)
            return bool(state.is_completed())
