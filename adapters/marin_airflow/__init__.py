"""Marin's Airflow 3 adapter: ``marin export airflow`` writes DAG files that Airflow runs.

- ``marin_airflow.export``: pure code generation (no Airflow import);
- ``marin_airflow.runtime``: what each task runs (imports the pipeline only when a task runs);
- ``marin_airflow.contract``: what the DAG file and its tasks agree on (no Airflow import);
- ``marin_airflow.cli``: the ``marin export airflow`` sub-command (entry point ``register``).

The test harnesses live in ``marin_testing``, which no runtime module imports.
"""
