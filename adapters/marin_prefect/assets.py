"""Prefect assets for Marin artifacts: a building step's task materializes its output.

A step to build runs as a Prefect ``MaterializingTask`` whose asset is the step's output (key:
``artifact_names.prefect_asset_key``, the artifact's URL with what Prefect refuses in a key
escaped; name: the step id) and whose ``asset_deps`` are its dependencies' outputs, so the
Prefect UI draws the artifact graph. On success Prefect records a
``prefect.asset.materialization.succeeded`` event for it, with the upstream assets as related
resources. A step served from cache runs as a plain task and records nothing; a step another
runner built while this one waited ends in the ``Cached`` state, for which Prefect records no
materialization either.

Assets are advisory: nothing here may fail a build. An asset Prefect still refuses (a key over
its length limit) makes the step a plain task, and any error while describing a build is one
warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prefect.assets import Asset, AssetProperties, add_asset_metadata

from marin.execution.builder.lineage.names import artifact_names, prefect_asset_key
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.store.location import Location

log = logging.getLogger("marin")


def step_asset(spec: StepSpec, location: Location) -> Asset:
    """The Prefect asset of a step's output under ``location``."""
    names = artifact_names(location, spec.output_path)
    return Asset(
        key=prefect_asset_key(names),
        properties=AssetProperties(name=spec.step_id, description=f"Marin step {spec.step_id}"),
    )


def materializing_task(
    spec: StepSpec, location: Location, fn: Callable[[], Any], **options: Any
) -> Any | None:
    """A task that runs ``fn`` and, on success, records a materialization of ``spec``'s output.

    None when Prefect refuses the asset keys (at most 512 characters) or anything else about
    them fails: the step then builds as a plain task, with one warning, because an asset
    Prefect cannot name must not stop a build.
    """
    from prefect.tasks import MaterializingTask

    deps = {dep.output_path: dep for dep in spec.deps}.values()
    try:
        assets = [step_asset(spec, location)]
        asset_deps: list[Asset | str] = [step_asset(dep, location) for dep in deps]
    except Exception as exc:  # pydantic's ValidationError (a too long key), or anything else
        log.warning(
            "lineage: no Prefect asset for %s: its output URL makes no valid Prefect asset key "
            "(%s); the step builds without recording a materialization",
            spec.step_id,
            str(exc).splitlines()[-1].strip() if str(exc) else type(exc).__name__,
        )
        return None
    return MaterializingTask(
        fn, assets=assets, asset_deps=asset_deps, materialized_by="marin", **options
    )


def describe_build(spec: StepSpec, location: Location, outcome: Any) -> None:
    """Attach the build's facts to the materialization (call inside the task, after a build).

    Never raises: the step is built and committed by now, and a materialization's metadata is
    advisory. A task that records no materialization (its asset was refused) is left alone.
    """
    from prefect.context import AssetContext

    context = AssetContext.get()
    if context is None or not context.downstream_assets:
        return
    try:
        record = outcome.record
        add_asset_metadata(
            step_asset(spec, location),
            {
                "url": outcome.output_url,
                "step": spec.step_id,
                "fingerprint": spec.fingerprint,
                "build_id": record.build_id,
                "inputs": dict(record.inputs or {}),
            },
        )
    except Exception as exc:
        log.warning(
            "lineage: the Prefect materialization of %s carries no metadata (%s: %s); the "
            "build is committed",
            spec.step_id,
            type(exc).__name__,
            exc,
        )


def flow_run_lineage() -> Any:
    """The OpenLineage parent of this flow's builds: the Prefect flow run."""
    from prefect.runtime import flow_run

    from marin.execution.builder.lineage import pipeline_run

    return pipeline_run(
        str(flow_run.flow_name or "prefect"), str(flow_run.id or "") or None, runner="prefect"
    )
