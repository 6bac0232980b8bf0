"""Parse DAG folders with Airflow's own ``DagBag`` and print their structure as JSON.

Run as a script in a subprocess (``python dagbag_dump.py FOLDER...``) so the test process does
not import Airflow. Also reports which pipeline modules got imported while parsing: none may be.
"""

from __future__ import annotations

import json
import sys
import time


def main(folders: list[str]) -> None:
    from airflow.dag_processing.dagbag import DagBag

    out: dict[str, object] = {"dags": {}, "import_errors": {}, "parse_s": {}}
    for folder in folders:
        t0 = time.perf_counter()
        bag = DagBag(dag_folder=folder)  # examples are off: AIRFLOW__CORE__LOAD_EXAMPLES=False
        out["parse_s"][folder] = time.perf_counter() - t0  # type: ignore[index]
        out["import_errors"].update({k: str(v) for k, v in bag.import_errors.items()})  # type: ignore[attr-defined]
        for dag_id, dag in bag.dags.items():
            out["dags"][dag_id] = {  # type: ignore[index]
                "fileloc": dag.fileloc,
                "max_active_tasks": dag.max_active_tasks,
                "max_active_runs": dag.max_active_runs,
                "schedule": str(dag.schedule) if dag.schedule is not None else None,
                "params": {k: dag.params[k] for k in dag.params},
                "tasks": {
                    t.task_id: {
                        "upstream": sorted(t.upstream_task_ids),
                        "retries": t.retries,
                        "pool": t.pool,
                        "display": t.task_display_name,
                        "trigger_rule": str(getattr(t.trigger_rule, "value", t.trigger_rule)),
                        "operator": type(t).__name__,
                        "own_params": len(t.params),
                        "queue": t.queue,
                        "kwargs": dict(getattr(t, "marin_kwargs", {})),
                    }
                    for t in dag.tasks
                },
            }
    out["pipeline_modules"] = sorted(
        m
        for m in sys.modules
        if m.startswith("marin_target_")
        or m in ("marin.execution.lazy", "marin.execution.builder.commit", "airflow_pipelines")
        or m.startswith("tests.")
    )
    print("DAGBAG-JSON " + json.dumps(out, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
