"""Loopback services for Marin's tests and benchmarks; no runtime module imports this package.

- ``marin_testing.airflow``: a temporary Airflow home and the api-server, scheduler and
  dag-processor on loopback;
- ``marin_testing.celery``: Airflow on Celery (Redis, two worker machines);
- ``marin_testing.postgres``: a PostgreSQL server in a temporary directory;
- ``marin_testing.prefect``: one Prefect harness per process, and ``prefect server start``;
- ``marin_testing.dask``: a ``dask scheduler`` with named ``dask worker`` processes.
"""
