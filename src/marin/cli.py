"""The ``marin`` command.

Engine adapters add their own ``marin export <engine>`` sub-commands through the
``marin.exporters`` entry-point group, so this module never imports Prefect or Airflow.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from marin.execution.errors import (
    DriftError,
    MarinError,
    PipelineFailedError,
    StepFailedError,
    format_error,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

log = logging.getLogger("marin")


class UsageError(Exception):
    """Bad command-line input: exit code 2."""


def _lowered(target: str) -> list[Any]:
    from marin.execution.lazy import lower
    from marin.execution.targets import load_target

    return list(lower(load_target(target), memo={}))


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


# --- run ---------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from marin.execution.step_runner import StepRunner

    specs = _lowered(args.target)
    runner = StepRunner(
        max_concurrent=args.max_concurrent, prefix=args.prefix, on_drift=args.on_drift
    )
    report = runner.run(specs, dry_run=args.dry_run, keep_going=args.keep_going, force=args.force)
    built = sum(1 for o in report.outcomes.values() if o.action == "built")
    skipped = len(report.states) - len(report.to_build) + len(report.pruned)
    verb = "would build" if args.dry_run else "built"
    count = len(report.to_build) if args.dry_run else built
    print(f"{verb} {count} step(s), skipped {skipped}; artifacts under {report.location.url}")
    for spec in specs:
        print(f"  {spec.step_id}: {report.location.url_for(spec.output_path)}")
    return EXIT_OK


# --- plan --------------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    from marin.execution.graph import collect_steps
    from marin.execution.inspect import inspect_steps
    from marin.execution.storage import open_prefix
    from marin.plan_view import plan_json, plan_table

    steps = collect_steps(_lowered(args.target))
    location = open_prefix(args.prefix)
    states = inspect_steps(steps, location)
    if args.json:
        print(json.dumps(plan_json(states, location), indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(plan_table(states, location, color=sys.stdout.isatty()))
    if args.exit_code and any(s.action != "built" for s in states):
        return EXIT_FAILED
    return EXIT_OK


# --- parser ------------------------------------------------------------------------------------

_EPILOG_RUN = """example:
  marin run examples/ngram.py:pipeline --prefix /tmp/marin --max-concurrent 4
"""
_EPILOG_PLAN = """example:
  marin plan examples/ngram.py:pipeline --prefix /tmp/marin
  marin plan examples/ngram.py:pipeline --json | jq '.summary'
"""
TARGET_HELP = "the pipeline: path/to/file.py:attr or package.module:attr"


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help=TARGET_HELP)
    parser.add_argument(
        "--prefix",
        help="where artifacts live: a path, memory://, gs://, s3:// "
        "(default: $MARIN_PREFIX, else ./marin-artifacts)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="marin",
        description="Build lazy, fingerprinted ML pipeline steps locally, or export them to "
        "Airflow or Prefect.",
        epilog="example:\n  marin run examples/ngram.py:pipeline\n"
        "run 'marin <command> --help' for each command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = commands.add_parser(
        "run",
        help="build a pipeline's steps that are not built yet",
        description="Build every step the targets need, skipping steps already built.",
        epilog=_EPILOG_RUN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(run)
    run.add_argument("--max-concurrent", type=int, default=8, help="steps at once (default 8)")
    run.add_argument("--dry-run", action="store_true", help="check and report; build nothing")
    run.add_argument(
        "--force",
        nargs="+",
        default=[],
        metavar="NAME",
        help="rebuild these steps (name or name@version)",
    )
    run.add_argument(
        "--keep-going",
        action="store_true",
        help="after a failure, keep building independent branches",
    )
    run.add_argument(
        "--on-drift",
        choices=("warn", "rebuild", "error"),
        default="warn",
        help="a built step whose config changed without a version bump: serve it with a "
        "warning (default), rebuild it, or stop",
    )
    run.set_defaults(func=cmd_run)

    plan = commands.add_parser(
        "plan",
        help="show what a run would do and why; changes nothing",
        description="List every step with its status (built, run, drift, dev, failed-before), "
        "fingerprint, output path and reason. Drift is explained field by field.",
        epilog=_EPILOG_PLAN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(plan)
    plan.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    plan.add_argument(
        "--exit-code", action="store_true", help="exit 1 when anything would run (for CI gates)"
    )
    plan.set_defaults(func=cmd_plan)

    export = commands.add_parser(
        "export",
        help="compile a pipeline for another engine (airflow, prefect)",
        description="Compile a pipeline for an external engine.",
    )
    engines = export.add_subparsers(dest="engine", metavar="ENGINE", required=True)
    for entry in sorted(entry_points(group="marin.exporters"), key=lambda e: e.name):
        try:
            entry.load()(engines)
        except ImportError as exc:
            unavailable = engines.add_parser(entry.name, help=f"(unavailable: {exc})")
            unavailable.set_defaults(func=_unavailable(entry.name, exc))
    return parser


def _unavailable(engine: str, exc: ImportError) -> Any:
    def fail(args: argparse.Namespace) -> int:
        raise UsageError(
            f"error: the {engine} exporter cannot load ({exc}): "
            f"pip install 'marin-execution[{engine}]'"
        )

    return fail


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        code = int(args.func(args))
    except KeyboardInterrupt:
        print(
            format_error("interrupted", "run again to resume; built steps are kept"),
            file=sys.stderr,
        )
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)  # don't wait for running steps' threads
    except (StepFailedError, PipelineFailedError, DriftError) as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_FAILED
    except (MarinError, UsageError, TypeError, ValueError) as exc:
        message = str(exc)
        if not message.startswith("error:"):
            message = f"error: {message}"
        print(message, file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
