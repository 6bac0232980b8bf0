"""``marin export prefect``: write or update a deployment of the entry flow in ``prefect.yaml``.

Registered with the core CLI through the ``marin.exporters`` entry-point group. This module must
stay cheap to import: it does not import Prefect (or the pipeline's engine) at import time.

The entry it writes is an ordinary Prefect deployment, deployed with ``prefect deploy``::

    deployments:
    - name: ngram-pipeline
      entrypoint: marin_prefect.flows:marin_pipeline
      parameters: {target: examples/ngram.py:pipeline, max_concurrent: 8, on_drift: warn}
      work_pool: {name: my-pool}

The ``target`` parameter it stores pins the deployment's target: a run that asks for another one
fails before importing anything, unless the worker allows it (see ``marin_prefect.flows``).

Re-running the command with the same arguments leaves the file byte-identical; other
deployments, and keys of this one that Marin does not manage (schedules, tags, job variables),
are kept. PyYAML does not keep comments, so comments in an existing file are dropped.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from marin.execution.errors import MarinError
from marin.execution.pipeline.scope import check_scope
from marin.execution.pipeline.versions import VersionCodex, codex_json
from marin.execution.plan.options import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_ON_DRIFT,
    RunOptions,
    check_patterns,
)
from marin.execution.vocabulary import OutputScope
from marin.run_flags import add_run_flags, run_options
from marin_prefect.names import BANNED_NAME_CHARS

ENTRYPOINT = "marin_prefect.flows:marin_pipeline"
_HELP = {
    "prefix": "artifact prefix parameter (default: unset, so $MARIN_PREFIX on the worker decides)",
    "max_concurrent": "steps one flow run builds at once (the flow's max_concurrent "
    f"parameter; default {DEFAULT_MAX_CONCURRENT})",
}
"""Where each shared run flag goes in the deployment (``marin.run_flags``)."""
_OWNED_PARAMETERS = ("target", "prefix", "select", "exclude", "versions", "scope")
"""Parameters a re-export replaces, or removes when it no longer gives them."""
EXIT_OK, EXIT_USAGE = 0, 2


class ExportError(MarinError):
    """A one-line, user-fixable problem with an export; the CLI prints it and exits 2."""


_EPILOG = """\
examples:
  marin export prefect examples/ngram.py:pipeline --work-pool my-pool
  marin export prefect examples/ngram.py:pipeline --select 'ngram/eval/*' \\
      -o /tmp/marin/prefect.yaml
  marin export prefect examples/ngram.py:pipeline --name nightly \\
      --max-concurrent 4 --on-drift rebuild --prefix s3://bucket/experiments \\
      -o deploy/prefect.yaml

then: prefect deploy --prefect-file prefect.yaml -n ngram-pipeline
      prefect deployment run marin-pipeline/ngram-pipeline
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``prefect`` exporter to ``marin export``'s sub-parsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "prefect",
        help="write a Prefect deployment of the pipeline to prefect.yaml",
        description=(
            "Write, or update in place, a deployment of the Marin entry flow\n"
            f"({ENTRYPOINT}) for TARGET in a prefect.yaml.\n"
            "Deploy it with `prefect deploy -n NAME` and run it with a worker of the work\n"
            "pool."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", metavar="TARGET", help="path/to/file.py:attr or pkg.mod:attr")
    # The same --select/--exclude as `marin plan`, stored as the select/exclude parameters;
    # --version/--override/--scope: the versions and scope parameters.
    add_run_flags(parser, "select", "exclude", "version", "override", "scope")
    _add_deployment_arguments(parser)
    _add_run_arguments(parser)
    parser.set_defaults(func=main)
    return parser


def _add_deployment_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the deployment goes: its name, work pool, file and prefix."""
    parser.add_argument(
        "--name", help="deployment name (default: derived from TARGET, e.g. ngram-pipeline)"
    )
    parser.add_argument("--work-pool", dest="work_pool", help="work pool the deployment runs on")
    parser.add_argument(
        "-o",
        "--output",
        default="prefect.yaml",
        help="the prefect.yaml to write or update (default: ./prefect.yaml)",
    )
    # --prefix defaults to SUPPRESS: `marin --prefix P export prefect ...` is kept.
    add_run_flags(parser, "prefix", "verbose", help=_HELP)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """How its runs build: the run parameters, the target check and the resource limits."""
    add_run_flags(parser, "max_concurrent", "on_drift", help=_HELP)
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="do not import TARGET to check that it names a pipeline",
    )
    parser.add_argument(
        "--create-limits",
        dest="create_limits",
        metavar="CAPACITY",
        help="also create (or resize) the global concurrency limits the pipeline's resources "
        "use, sized for this capacity, e.g. cpu=16,memory=64GiB,gpu=2 (marin-cpu, "
        "marin-memory-gib, marin-gpu, ...) on the current Prefect API",
    )


def main(args: argparse.Namespace) -> int:
    try:
        options = run_options(args)  # checked once: the deployment's parameters
        action, name = export(
            args.target,
            output=args.output,
            name=args.name,
            work_pool=args.work_pool,
            prefix=getattr(args, "prefix", None),
            max_concurrent=options.max_concurrent,
            on_drift=options.on_drift,
            check=args.check,
            resource_limits=args.create_limits is not None,
            select=args.select,
            exclude=args.exclude,
            versions=options.versions,
            scope=options.scope,
        )
    except MarinError as exc:  # ExportError, TargetError, a bad step...
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    print(f"{action} deployment {name!r} in {args.output}")
    if action != "unchanged":
        print(f"deploy it with: prefect deploy --prefect-file {args.output} -n {name}")
    if args.check or args.create_limits:
        try:
            for line in resource_limits(
                args.target, args.create_limits, select=args.select, exclude=args.exclude
            ):
                print(line)
        except MarinError as exc:
            print(str(exc), file=sys.stderr)
            return EXIT_USAGE
    return EXIT_OK


def resource_limits(
    target: str,
    capacity: str | None,
    *,
    select: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> list[str]:
    """Create the limits the pipeline's resources need (``capacity`` given), or say how to:
    those of the steps ``select``/``exclude`` leave, which are all a run of it builds."""
    from marin.execution.pipeline.resources import parse_capacity
    from marin_prefect.resources import (
        create_limits,
        limits_commands,
        limits_for_capacity,
        resource_slots,
    )

    specs = _selected_steps(target, select, exclude)
    needed = sorted({name for spec in specs for name, _ in resource_slots(spec)})
    if not needed:
        return []
    if capacity is None:
        return [
            "the pipeline's resources need these Prefect global concurrency limits "
            "(or pass --create-limits CAPACITY):",
            *(f"  prefect gcl create {name} --limit <capacity>" for name in needed),
        ]
    sizes = dict(limits_for_capacity(parse_capacity(capacity)))  # a MarinError is bad input
    missing = [name for name in needed if name not in sizes]
    if missing:
        kinds = [n.removeprefix("marin-").replace("memory-gib", "memory") for n in missing]
        raise ExportError(
            f"--create-limits {capacity!r} gives no capacity for {', '.join(kinds)}, "
            "which the pipeline's steps ask for",
            f"add them, e.g. --create-limits {capacity}," + ",".join(f"{k}=N" for k in kinds),
        )
    limits = [(name, sizes[name]) for name in needed]
    try:
        return create_limits(limits)
    except Exception as exc:
        raise ExportError(
            f"could not create the limits on the Prefect API ({type(exc).__name__}: {exc})",
            "check PREFECT_API_URL, or run: " + "; ".join(limits_commands(limits)),
        ) from None


def default_deployment_name(target: str) -> str:
    from marin.execution.pipeline.targets import Target

    parsed = Target.parse(target)
    base = f"{parsed.stem}-{parsed.attr}" if parsed.stem else parsed.attr
    return BANNED_NAME_CHARS.sub("-", base.replace(".", "-")).strip("-") or "marin-pipeline"


def _check_target(
    target: str, select: Sequence[str], exclude: Sequence[str], versions: VersionCodex | None
) -> None:
    from marin.execution.pipeline.lower import lower
    from marin.execution.pipeline.targets import load_target

    if versions is not None:  # an unused override or a missing version: refused now
        lower(load_target(target), versions=versions)
    if select or exclude:  # a pattern matching no step: an error with the closest names
        _selected_steps(target, select, exclude, versions)
    else:
        load_target(target)  # a broken pipeline is a MarinError naming the file, line and fix


def _selected_steps(
    target: str,
    select: Sequence[str],
    exclude: Sequence[str],
    versions: VersionCodex | None = None,
) -> list[Any]:
    """Every step a run of the deployment would plan: the selection and what it needs."""
    from marin.execution.pipeline.lower import lower_graph
    from marin.execution.pipeline.targets import load_target
    from marin.selection import select_graph

    return list(
        select_graph(lower_graph(load_target(target), versions=versions), select, exclude).steps
    )


def export(
    target: str,
    *,
    output: str = "prefect.yaml",
    name: str | None = None,
    work_pool: str | None = None,
    prefix: str | None = None,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    on_drift: str = DEFAULT_ON_DRIFT,
    check: bool = True,
    resource_limits: bool = False,
    select: Sequence[str] = (),
    exclude: Sequence[str] = (),
    versions: VersionCodex | None = None,
    scope: str = OutputScope.SHARED,
) -> tuple[str, str]:
    """Write or update the deployment; return ``(created|updated|unchanged, name)``.

    ``versions``: the codex of steps with ``version=None``, stored as the ``versions``
    parameter (JSON text, data): a run of the deployment may not choose another. ``scope``:
    ``user`` is stored as the ``scope`` parameter, the only one its runs take (each writes
    under ``<prefix>/users/<user>/``); ``shared`` (the default) stores none: runs are shared.

    ``select``/``exclude`` (globs, as for ``marin plan``) become the deployment's ``select`` and
    ``exclude`` parameters: its runs build only those steps and what they need."""
    from marin.execution.pipeline.targets import Target

    Target.parse(target)  # a TargetError (bad input) before anything is written
    if prefix is not None:
        from marin.execution.store.location import refuse_credentials

        refuse_credentials(prefix)  # it would be written into prefect.yaml
    # Refuses what a run would; the deployment's parameters are the checked options.
    options = RunOptions(on_drift=on_drift, max_concurrent=max_concurrent)
    select = check_patterns(select, "--select")
    exclude = check_patterns(exclude, "--exclude")
    scope = check_scope(scope)
    name = name or default_deployment_name(target)
    if BANNED_NAME_CHARS.search(name) or not name.strip():
        raise ExportError(
            f"deployment name {name!r} is not allowed by Prefect", "use a --name without / % & > <"
        )
    if check:
        _check_target(target, select, exclude, versions)
    target = _portable_target(target, output)
    parameters: dict[str, Any] = {"target": target}
    if prefix is not None:
        parameters["prefix"] = prefix
    parameters["max_concurrent"] = options.max_concurrent
    parameters["on_drift"] = options.on_drift
    if resource_limits:
        parameters["resource_limits"] = True
    # Written only when given, so deployments exported without them keep their bytes.
    parameters.update(_optional_parameters(select, exclude, versions, scope))
    return _write_deployment(output, name, target, work_pool, parameters)


def _optional_parameters(
    select: Sequence[str], exclude: Sequence[str], versions: VersionCodex | None, scope: str
) -> dict[str, Any]:
    """The parameters written only when given (an export without them keeps its bytes)."""
    parameters: dict[str, Any] = {}
    if select:
        parameters["select"] = list(select)
    if exclude:
        parameters["exclude"] = list(exclude)
    if versions is not None:
        parameters["versions"] = codex_json(versions)
    if scope != OutputScope.SHARED:
        parameters["scope"] = str(scope)
    return parameters


def _read_document(output: str) -> tuple[str, dict[str, Any], list[Any]]:
    """The prefect.yaml's text (empty if none), its mapping and its deployments list."""
    import yaml

    old_text = ""
    if os.path.exists(output):
        with open(output, encoding="utf-8") as f:
            old_text = f.read()
    try:
        document = yaml.safe_load(old_text) if old_text.strip() else None
    except yaml.YAMLError as exc:
        raise ExportError(f"{output} is not valid YAML ({exc})", "fix or remove it") from None
    if document is None:
        document = {"name": os.path.basename(os.path.dirname(os.path.abspath(output)))}
    if not isinstance(document, dict):
        raise ExportError(f"{output} is not a prefect.yaml mapping", "fix or remove it")
    deployments = document.get("deployments")
    if deployments is None:
        deployments = document["deployments"] = []
    if not isinstance(deployments, list):
        raise ExportError(f"{output}: 'deployments' is not a list", "fix it")
    return old_text, document, deployments


def _write_deployment(
    output: str, name: str, target: str, work_pool: str | None, parameters: dict[str, Any]
) -> tuple[str, str]:
    """Add or update deployment ``name`` in ``output``; write the file if its bytes changed."""
    import yaml

    old_text, document, deployments = _read_document(output)
    existing = next((d for d in deployments if isinstance(d, dict) and d.get("name") == name), None)
    if existing is None:
        entry: dict[str, Any] = {
            "name": name,
            "description": f"Marin pipeline {target}",
            "entrypoint": ENTRYPOINT,
            "parameters": parameters,
        }
        if work_pool:
            entry["work_pool"] = {"name": work_pool}
        deployments.append(entry)
        action = "created"
    else:
        _update_entry(existing, work_pool, parameters)
        action = "updated"
    new_text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    if new_text == old_text:
        return "unchanged", name
    from marin.execution.atomic_file import write_file_atomically

    write_file_atomically(output, new_text.encode("utf-8"))
    return action, name


def _update_entry(
    existing: dict[str, Any], work_pool: str | None, parameters: dict[str, Any]
) -> None:
    """Marin's keys of an existing deployment, updated; the keys it does not manage kept."""
    existing["entrypoint"] = ENTRYPOINT
    old_parameters = existing.get("parameters")
    kept = old_parameters if isinstance(old_parameters, dict) else {}
    # Marin owns these parameters; any others the user added (e.g. keep_going) are kept.
    kept = {k: v for k, v in kept.items() if k not in _OWNED_PARAMETERS}
    kept.update(parameters)
    existing["parameters"] = {
        **{k: kept[k] for k in parameters},
        **{k: v for k, v in kept.items() if k not in parameters},
    }
    if work_pool:
        pool = existing.get("work_pool")
        if isinstance(pool, dict):
            pool["name"] = work_pool
        else:
            existing["work_pool"] = {"name": work_pool}


def _portable_target(target: str, output: str) -> str:
    """A file target inside the project, as a path relative to the prefect.yaml's folder.

    Workers run flows from the project folder (Prefect's ``set_working_directory`` pull step), so
    a relative path works on any machine, where an absolute one would bake in this checkout.
    """
    from marin.execution.pipeline.targets import Target

    parsed = Target.parse(target)
    if not parsed.is_file or not os.path.isabs(parsed.location):
        return target
    project = os.path.dirname(os.path.abspath(output))
    relative = os.path.relpath(parsed.location, project)
    if relative.startswith(".."):
        return target
    return str(parsed.with_location(relative.replace(os.sep, "/")))
