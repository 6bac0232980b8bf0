"""``marin export airflow``: registered through the ``marin.exporters`` entry-point group.

Importing this module must stay cheap: it never imports Airflow (parsing the exported file does
not need it either; Airflow is only needed where the DAG runs).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from marin.execution.plan.options import DEFAULT_MAX_CONCURRENT
from marin.run_flags import add_run_flags, run_options

_DESCRIPTION = """\
Write one Airflow 3 DAG file for a Marin pipeline. The file embeds the step
graph as data (task ids, edges, name@version, fingerprint, retries, pool) and
never imports the pipeline at parse time. Its first task, marin-plan, decides
every step as `marin plan` does, under the run's params on_drift, force and
cascade; each step's task imports the pipeline when it runs, refuses to run if
the DAG file is stale, and builds its step with Marin's build_step. marin-plan
skips the tasks of the steps it serves (cached) or prunes: they launch no task
process. --select/--exclude export part of the pipeline: the steps `marin plan`
shows with them, which is also all marin-plan plans (fixed at export; a run
cannot widen or narrow it). The output is byte-stable: commit it, and use
--check in CI.
"""

_EPILOG = """\
examples:
  marin export airflow examples/ngram.py:pipeline -o dags/
  marin export airflow examples/ngram.py:pipeline -o dags/ --check  # in CI
  marin export airflow examples/ngram.py:pipeline -o /tmp/marin/dags \\
      --select 'ngram/eval/*'
  marin export airflow mypkg.pipelines:train --max-concurrent 4 \\
      --schedule '0 3 * * *'
  marin export airflow mypkg.pipelines:train --executor celery \\
      --prefix s3://bucket/runs --plan-queue default   # many workers, retries 1

then put dags/ in Airflow's dags_folder (or copy the file there) with
marin-execution installed on the workers, and trigger the DAG. Re-export after
changing the pipeline.
"""


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: use 0 or more")
    return value


_HELP = {
    "max_concurrent": "the DAG's max_active_tasks: steps at once in one run "
    f"(default {DEFAULT_MAX_CONCURRENT})",
    "prefix": "default artifact prefix baked into the DAG (a run's 'prefix' param or "
    "$MARIN_PREFIX on the worker override it; default: none baked)",
    "on_drift": "the DAG's default drift policy, its on_drift param (a run may override it): "
    "serve a drifted step with a warning (default), rebuild it, or fail the run first",
}
"""Where each shared run flag goes in the DAG (``marin.run_flags``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="the pipeline: path/to/file.py:attr or package.module:attr")
    # The same --select/--exclude as `marin plan`; --version/--override/--scope: the codex and
    # scope the DAG carries.
    add_run_flags(parser, "select", "exclude", "version", "override", "scope")
    _add_dag_options(parser)
    _add_run_options(parser)
    _add_executor_options(parser)


def _add_dag_options(parser: argparse.ArgumentParser) -> None:
    """The file and the DAG: where it goes, its id, its concurrency and default prefix."""
    parser.add_argument(
        "-o",
        "--output",
        default="dags",
        metavar="DIR_OR_FILE",
        help="a folder (the file is <dag-id>.py inside it) or a .py file (default: dags)",
    )
    parser.add_argument("--dag-id", help="the DAG id (default: <file or module>_<attr>)")
    # --prefix defaults to SUPPRESS: `marin --prefix P export airflow ...` is kept.
    add_run_flags(parser, "max_concurrent", "prefix", "verbose", help=_HELP)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """When and how its runs build: schedule, retries, drift policy."""
    parser.add_argument(
        "--schedule",
        default=None,
        metavar="CRON|@once|none",
        help="the DAG's schedule (default: none, trigger manually)",
    )
    parser.add_argument(
        "--retries",
        type=_non_negative,
        default=None,
        metavar="N",
        help="Airflow retries for steps that declare none themselves (default 0; 1 with "
        "--executor celery or kubernetes, so a task whose worker is lost runs again elsewhere)",
    )
    add_run_flags(parser, "on_drift", help=_HELP)


def _add_executor_options(parser: argparse.ArgumentParser) -> None:
    """Where its tasks run (executor, plan queue), and ``--check``."""
    parser.add_argument(
        "--executor",
        choices=("default", "celery", "kubernetes"),
        default="default",
        help="celery or kubernetes: tasks run on many machines, so the export needs a --prefix "
        "on shared storage (s3://, gs://) and a pipeline every worker can import, and each "
        "task refuses a prefix on its own disk. kubernetes: each task also gets an "
        "executor_config pod override with its resources as requests and limits (cpu, "
        "memory, nvidia.com/gpu); needs the kubernetes package where the DAG is parsed "
        "(default: default)",
    )
    parser.add_argument(
        "--plan-queue",
        default=None,
        metavar="QUEUE",
        help="the Airflow queue of the marin-plan task (default: the executor's default "
        "queue; a step's own queue comes from its with_options(queue=...))",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff summary if the file on disk is not what "
        "would be generated now (for CI and pre-commit)",
    )


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``airflow`` to ``marin export``'s sub-commands."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "airflow",
        help="write an Airflow 3 DAG file for a pipeline",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Export (or ``--check``); return the exit code. Bad input raises ``ValueError`` (exit 2)."""
    from marin_airflow.export import (
        build_export,
        check_export,
        pools_hint,
        write_export,
    )

    options = run_options(args)  # checked once: what the DAG bakes in
    result = build_export(
        args.target,
        args.output,
        dag_id=args.dag_id,
        max_concurrent=options.max_concurrent,
        prefix=getattr(args, "prefix", None),
        schedule=args.schedule,
        retries=args.retries,
        on_drift=options.on_drift,
        executor=args.executor,
        plan_queue=args.plan_queue,
        select=args.select,
        exclude=args.exclude,
        versions=options.versions,
        scope=options.scope,
    )
    if args.check:
        fresh, message = check_export(result)
        if fresh:
            print(message)
            return 0
        print(message, file=sys.stderr)
        where = os.path.relpath(result.root)
        cd = "" if where == "." else f"cd {shlex.quote(where)} && "
        print(f"fix: run `{cd}{result.command}` and commit the result", file=sys.stderr)
        return 1
    changed = write_export(result)
    verb = "wrote" if changed else "unchanged"
    print(f"{verb} {result.path}: DAG {result.dag_id} with {len(result.tasks)} task(s)")
    hint = pools_hint(result)
    if hint:
        print(hint)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m marin_airflow.cli TARGET ...``: the same command without the ``marin`` CLI."""
    parser = argparse.ArgumentParser(
        prog="marin export airflow",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:  # ExportError, TargetError, InvalidStepError, ...
        message = str(exc)
        print(message if message.startswith("error:") else f"error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
