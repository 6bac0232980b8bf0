"""Check a generated DAG file's edges against Airflow's own wiring, and count DAG hashes.

Run as a script in a subprocess (``python edges_check.py FILE``) so the test process does not
import Airflow. It prints one ``EDGES-JSON`` line with:

- the edges of the DAG that ``DagBag`` parsed from FILE, and of that DAG after Airflow's own
  serialization round trip (``DagSerialization.to_dict`` / ``from_dict``, as the DAG processor
  stores it), both as ``{task_id: [sorted upstream ids]}`` and downstream the same way;
- the edges of a reference DAG built from the same ``STEPS`` data with ``upstream >> task``,
  the documented way to wire tasks, serialized the same way;
- how many times ``DAG.__hash__`` ran while ``DagBag`` parsed FILE: every ``>>`` hashes the
  whole DAG (O(tasks) each), so wiring edges with it costs O(tasks x edges).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def _edges(dag: Any) -> dict[str, dict[str, list[str]]]:
    return {
        "upstream": {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks},
        "downstream": {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks},
    }


def _round_trip(dag: Any) -> Any:
    from airflow.serialization.serialized_objects import DagSerialization

    data = json.loads(json.dumps(DagSerialization.to_dict(dag)))  # validated against the schema
    return DagSerialization.from_dict(data)


def _reference(steps: dict[str, dict[str, Any]]) -> Any:
    import datetime

    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    with DAG(dag_id="reference", schedule=None, start_date=datetime.datetime(2024, 1, 1)) as dag:
        tasks = {
            task_id: PythonOperator(task_id=task_id, python_callable=print)
            for task_id in ["marin-plan", *steps]
        }
        for task_id, step in steps.items():
            # The plan task runs first and is upstream of every step (it may skip any).
            for upstream in ["marin-plan", *step["upstream"]]:
                tasks[upstream] >> tasks[task_id]
    return dag


def main(path: str) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import DAG

    from marin_airflow.export import embedded_steps

    calls = 0
    real_hash = DAG.__hash__

    def counting_hash(self: Any) -> int:
        nonlocal calls
        calls += 1
        return int(real_hash(self))

    DAG.__hash__ = counting_hash  # type: ignore[method-assign]
    t0 = time.perf_counter()
    bag = DagBag(dag_folder=path)
    parse_s = time.perf_counter() - t0
    if bag.import_errors:
        raise SystemExit(f"import errors: {bag.import_errors}")
    (dag,) = bag.dags.values()
    with open(path, encoding="utf-8") as f:
        steps = embedded_steps(f.read())
    assert steps is not None
    parse_calls, calls = calls, 0
    reference = _reference(steps)
    reference_calls = calls
    DAG.__hash__ = real_hash  # type: ignore[method-assign]
    out = {
        "tasks": len(dag.tasks),
        "parse_s": parse_s,
        "dag_hash_calls": parse_calls,
        "reference_dag_hash_calls": reference_calls,
        "parsed": _edges(dag),
        "parsed_round_trip": _edges(_round_trip(dag)),
        "reference": _edges(reference),
        "reference_round_trip": _edges(_round_trip(reference)),
        # Airflow's cycle check walks tasks in this order; from a task with n children first,
        # it rescans them once per child (n^2/2 steps for the plan task of a 10,000-step DAG).
        "last_task": list(dag.task_dict)[-1],
        "roots": sorted(t.task_id for t in dag.roots),
        "leaves": sorted(t.task_id for t in dag.leaves),
        "reference_roots": sorted(t.task_id for t in reference.roots),
        "reference_leaves": sorted(t.task_id for t in reference.leaves),
    }
    print("EDGES-JSON " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
