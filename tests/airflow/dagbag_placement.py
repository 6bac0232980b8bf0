"""Parse a DAG folder with Airflow's ``DagBag`` and print each task's placement fields as JSON.

Run in a subprocess (``python dagbag_placement.py FOLDER``) so the test process never imports
Airflow or the Kubernetes client.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _pod(config: Any) -> Any:
    pod = (config or {}).get("pod_override")
    if pod is None:
        return None
    (container,) = pod.spec.containers
    return {
        "container": container.name,
        "requests": container.resources.requests,
        "limits": container.resources.limits,
    }


def main(folder: str) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=folder)
    out: dict[str, Any] = {"import_errors": {k: str(v) for k, v in bag.import_errors.items()}}
    for dag_id, dag in bag.dags.items():
        out[dag_id] = {
            t.task_display_name: {
                "queue": t.queue,
                "pool": t.pool,
                "pool_slots": t.pool_slots,
                "execution_timeout_s": (
                    t.execution_timeout.total_seconds() if t.execution_timeout else None
                ),
                "pod": _pod(t.executor_config),
            }
            for t in dag.tasks
        }
    print("PLACEMENT-JSON " + json.dumps(out, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
