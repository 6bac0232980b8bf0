"""The deployable entry flow: ``marin_prefect.flows:marin_pipeline``.

Add it to an existing Prefect project with the usual tools: a ``prefect.yaml`` deployment whose
entrypoint is ``marin_prefect.flows:marin_pipeline`` (``marin export prefect`` writes one),
``marin_pipeline.deploy(...)`` to a process work pool, or ``marin_pipeline.serve(...)``. The
flow object lives at module level under its function's name, so Prefect's module-path entrypoint
(built from ``__module__`` and ``__name__``) resolves to it.

Each run loads the target, compiles it with ``to_prefect_flow`` and runs it as a child flow run,
so the parameters (including ``max_concurrent``) apply per run.

Who chooses the target: loading a target imports and runs code, so a run started from a deployment
may only use the ``target`` stored on the deployment (``marin export prefect`` stores it), which is
set by whoever may edit deployments. A trigger that passes another ``target`` is refused before
anything is imported, unless the worker lists that exact target in
``MARIN_PREFECT_ALLOWED_TARGETS`` (comma separated). The worker's own environment decides this;
a run that tries to set that variable (or ``MARIN_ALLOWED_PREFIXES``) through its job variables is
refused too. Calling ``marin_pipeline(...)`` directly from Python, outside any deployment, is the
caller running its own code and is not restricted.

Where the steps build is the worker's choice too: with ``MARIN_PREFECT_DASK_ADDRESS`` set in the
Prefect worker's environment, each run sends its builds to that Dask scheduler's workers
(``marin_prefect.dask``); unset, they build on the flow run's threads. It is not a parameter, and
a run that sets it through its job variables is refused like the variables above.
"""

from __future__ import annotations

import json
import os
from typing import Any

from prefect import flow

from marin.execution.pipeline.scope import check_scope, user_param
from marin.execution.pipeline.versions import VersionCodex, exported_codex
from marin.execution.plan.options import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_ON_CODE_DRIFT,
    DEFAULT_ON_DRIFT,
    RunOptions,
    check_patterns,
)
from marin.execution.plan.scope import RunScope
from marin.execution.vocabulary import OutputScope
from marin_prefect.compile import to_prefect_flow
from marin_prefect.dask import DASK_ADDRESS_ENV, task_runner_from_env

ALLOWED_TARGETS_ENV = "MARIN_PREFECT_ALLOWED_TARGETS"
ALLOWED_PREFIXES_ENV = "MARIN_ALLOWED_PREFIXES"
WORKER_ONLY_ENV = (ALLOWED_TARGETS_ENV, ALLOWED_PREFIXES_ENV, DASK_ADDRESS_ENV)
"""Variables only the worker's owner may set: a run's job variables must not override them."""
FIX_USER = (
    "trigger the run with a 'user' parameter (one path segment: letters, digits, '_', '-', "
    "'.'; e.g. alice), or set MARIN_USER in the worker's environment"
)


def allowed_targets() -> frozenset[str]:
    """The targets this worker lets a run choose, from ``$MARIN_PREFECT_ALLOWED_TARGETS``."""
    value = os.environ.get(ALLOWED_TARGETS_ENV, "")
    return frozenset(part.strip() for part in value.split(",") if part.strip())


def _refused(what: str, fix: str) -> Exception:
    from marin.execution.errors import TargetError

    return TargetError(what, fix)


def _run_from_deployment() -> tuple[Any, Any] | None:
    """``(flow run, deployment)`` as the Prefect server stores them, or None outside one."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    deployment_id = flow_run.deployment_id if flow_run is not None else None
    if flow_run is None or deployment_id is None:
        return None
    with get_client(sync_client=True) as client:
        # Read back from the server, not from the run's own context, what the run may choose.
        flow_run = client.read_flow_run(flow_run.id)
        deployment = client.read_deployment(deployment_id)
    return flow_run, deployment


def check_run_choices(target: str, found: tuple[Any, Any] | None) -> None:
    """Refuse a deployment run whose trigger chose the target or worker-only settings.

    ``found``: ``_run_from_deployment()``. Runs before the target is imported and before
    storage is touched.
    """
    if found is None:
        return  # called directly: the caller already runs its own code
    flow_run, deployment = found
    # Anywhere in the run's job variables (``env``, a dotted ``env.NAME`` key, a nested value):
    # a false alarm costs a re-trigger, a miss would let the run widen the worker's settings.
    overrides = json.dumps(flow_run.job_variables or {}, default=str)
    overridden = [name for name in WORKER_ONLY_ENV if name in overrides]
    if overridden:
        raise _refused(
            f"this run sets {', '.join(overridden)} in its job variables (deployment "
            f"{deployment.name})",
            "those are set on the worker, not by a run; trigger the run without them",
        )
    pinned = (deployment.parameters or {}).get("target")
    if target == pinned or target in allowed_targets():
        return
    if pinned is None:
        raise _refused(
            f"deployment {deployment.name} has no target of its own and {target!r} is not in "
            f"{ALLOWED_TARGETS_ENV} on this worker",
            "deploy with a target parameter (marin export prefect TARGET does), or list the "
            f"target in {ALLOWED_TARGETS_ENV} in the worker's environment",
        )
    raise _refused(
        f"this run asks for target {target!r} but deployment {deployment.name} is pinned to "
        f"{pinned!r}",
        "run the deployment without a target parameter; to let runs choose, list the target in "
        f"{ALLOWED_TARGETS_ENV} in the worker's environment",
    )


def check_run_versions(versions: object, found: tuple[Any, Any] | None) -> VersionCodex | None:
    """The run's codex: a deployment run's ``versions`` may only be its deployment's own (as
    its target is)."""
    if found is None:  # called directly: the caller's own choice, checked as data
        allowed = versions if isinstance(versions, str) and versions else None
        try:
            return exported_codex(allowed, versions, "versions")
        except ValueError as exc:  # not JSON
            raise _refused(
                f"versions={str(versions)[:100]!r} ({exc})", "pass the codex JSON"
            ) from None
    return exported_codex((found[1].parameters or {}).get("versions"), versions, "versions")


def check_run_scope(scope: object, user: object, found: tuple[Any, Any] | None) -> RunScope:
    """The run's scope and user: a deployment run's ``scope`` may only be its deployment's own
    (``marin export prefect --scope user`` stores ``user``; none: ``shared``). The user is the
    ``user`` parameter, else who triggered the run (Prefect Cloud names a user), else
    ``$MARIN_USER`` or the OS user on the worker; the parameter is checked here, first."""
    chosen = check_scope(scope)
    if found is not None:
        allowed = (found[1].parameters or {}).get("scope") or OutputScope.SHARED
        if chosen != allowed:
            raise _refused(
                f"scope={str(scope)[:100]!r}: deployment {found[1].name} runs in the "
                f"{allowed} scope only",
                "trigger the run without a scope parameter; for another scope, export the "
                "deployment again with --scope",
            )
    named = user_param(user, FIX_USER)
    created_by = getattr(found[0], "created_by", None) if found is not None else None
    by_user = getattr(created_by, "type", None) == "USER"
    triggered_by = getattr(created_by, "display_value", None) if by_user else None
    return RunScope(chosen, named, triggered_by, FIX_USER)


def check_run(
    target: str, versions: object, scope: object, user: object
) -> tuple[VersionCodex | None, RunScope]:
    """What a run may choose, checked before anything is imported or stored: its target and
    job variables, its codex, its scope and user (each function above)."""
    found = _run_from_deployment()
    check_run_choices(target, found)
    return check_run_versions(versions, found), check_run_scope(scope, user, found)


@flow(name="marin-pipeline", validate_parameters=True)
def marin_pipeline(
    target: str,
    prefix: str | None = None,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    on_drift: str = DEFAULT_ON_DRIFT,
    concurrency_limit: str | None = None,
    keep_going: bool = False,
    force: list[str] | None = None,
    cascade: bool = True,
    resource_limits: bool = False,
    on_code_drift: str = DEFAULT_ON_CODE_DRIFT,
    select: list[str] | None = None,
    exclude: list[str] | None = None,
    versions: str | None = None,
    scope: str = OutputScope.SHARED,
    user: str | None = None,
) -> dict[str, str]:
    """Run the Marin pipeline ``target`` ("path/to/file.py:attr" or "pkg.module:attr").

    Artifacts go under ``prefix``, else ``$MARIN_PREFIX`` on the worker, else the local default.
    Returns ``{name@version: artifact path}`` for every step. ``on_drift``, ``force`` (step
    names or ``name@version`` ids to rebuild), ``cascade`` and ``on_code_drift`` mean what they
    mean for ``marin run``. ``resource_limits``: steps hold slots of the ``marin-<kind>`` global
    concurrency limits while they build (a deployment made with ``--create-limits`` sets it).
    ``select`` and ``exclude`` (globs on step names, as ``marin run --select/--exclude`` takes;
    ``marin export prefect --select`` stores them) build only part of the pipeline. Like
    ``force``, a run may set them: they choose among the pinned target's steps, never code.
    ``versions`` (the codex of steps with ``version=None``, as JSON; ``marin export prefect
    --version`` stores it) and ``scope`` (``--scope``) may only be the deployment's own.
    ``user``: whose ``<prefix>/users/<user>/`` a user-scope run writes (``check_run_scope``).
    """
    from marin.execution.pipeline.targets import Target
    from marin.execution.store.location import open_prefix

    codex, placement = check_run(target, versions, scope, user)
    parsed = Target.parse(target)  # once: the flow's name, its lowering and remote workers
    # Opened and checked (MARIN_ALLOWED_PREFIXES) once, before the pipeline is even imported.
    location = open_prefix(prefix)
    # The run's parameters are whoever triggered it's data: checked like any option, first.
    options = RunOptions.from_params(
        {"on_drift": on_drift, "force": force, "cascade": cascade, "keep_going": keep_going,
         "max_concurrent": max_concurrent, "on_code_drift": on_code_drift},
        defaults=RunOptions(scope=placement.scope, versions=codex),
    )  # fmt: skip
    pipeline = to_prefect_flow(
        parsed,
        options=options,
        location=location,
        prefix=prefix,
        concurrency_limit=concurrency_limit,
        resource_limits=resource_limits,
        # Before the pipeline is imported; whether each matches a step is checked once it is.
        select=check_patterns(select or [], "select"),
        exclude=check_patterns(exclude or [], "exclude"),
        task_runner=task_runner_from_env(),  # the worker's setting, never the run's
        user=placement,
    )
    return pipeline()
