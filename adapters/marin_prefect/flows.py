"""The deployable entry flow: ``marin_prefect.flows:marin_pipeline``.

Add it to an existing Prefect project with the usual tools: a ``prefect.yaml`` deployment whose
entrypoint is ``marin_prefect.flows:marin_pipeline`` (``marin export prefect`` writes one),
``marin_pipeline.deploy(...)`` to a process work pool, or ``marin_pipeline.serve(...)``. The
flow object lives at module level under its function's name, so Prefect's module-path entrypoint
(built from ``__module__`` and ``__name__``) resolves to it.

Each run loads the target, compiles it with ``to_prefect_flow`` and runs it as a child flow run,
so the parameters (including ``max_concurrent``) apply per run.
"""

from __future__ import annotations

from prefect import flow

from marin_prefect.compile import to_prefect_flow


@flow(name="marin-pipeline", validate_parameters=True)
def marin_pipeline(
    target: str,
    prefix: str | None = None,
    max_concurrent: int = 8,
    on_drift: str = "warn",
    concurrency_limit: str | None = None,
    keep_going: bool = False,
    force: list[str] | None = None,
    cascade: bool = True,
) -> dict[str, str]:
    """Run the Marin pipeline ``target`` ("path/to/file.py:attr" or "pkg.module:attr").

    Artifacts go under ``prefix``, else ``$MARIN_PREFIX`` on the worker, else the local default.
    Returns ``{name@version: artifact path}`` for every step. ``on_drift``, ``force`` (step
    names or ``name@version`` ids to rebuild) and ``cascade`` mean what they mean for
    ``marin run``.
    """
    pipeline = to_prefect_flow(
        target,
        max_concurrent=max_concurrent,
        prefix=prefix,
        on_drift=on_drift,
        concurrency_limit=concurrency_limit,
        keep_going=keep_going,
        force=force or (),
        cascade=cascade,
    )
    return pipeline()
