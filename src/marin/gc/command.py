"""The ``marin gc`` sub-command: its parser and what it prints (``marin.cli`` adds it)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from marin.run_flags import usage_checked

PROGRESS_MIN_STEPS = 20
"""A real run deleting at least this many steps shows a progress bar (on a terminal)."""

_DESCRIPTION = """\
Delete every step under the prefix that no TARGET needs. Kept: every step the
targets' plans serve (placed as `marin plan` places them, with the same
--version, --override and --scope), every build their records were made from,
every build an adopted step reads (its source), and what --keep-versions and
--older-than keep. Another user's folder (users/<user>/) is left alone unless
--all-users; every user folder is left alone when the plan places no step
there (no --scope user). Only folders whose record, status or crashed build's
lease names that very step are deleted; a step being built (a live lease) is
skipped, and so is one whose remote job still runs."""
_EPILOG = """examples:
  marin gc examples/ngram.py:pipeline --dry-run   # what would go, with sizes
  marin gc examples/ngram.py:pipeline --keep-versions 2 --older-than 30d
  marin gc examples/ngram.py:pipeline --all-users --scope user --cancel-orphans
exit status: 0 done, 1 something could not be deleted (named), 2 usage error."""


def _keep_versions(text: str) -> int:
    from marin.gc.collect import check_keep_versions

    try:
        value = check_keep_versions(int(text))
    except ValueError:  # int() of a non-number, or an OptionError
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more") from None
    assert value is not None
    return value


def _age(text: str) -> str:
    from marin.gc.collect import parse_age

    usage_checked(parse_age, text)
    return text


def add_gc_parser(commands: Any, add_global: Any, add_versions: Any) -> None:
    """Add ``gc`` to the ``marin`` sub-commands; ``add_global`` adds ``--prefix`` and ``-v``,
    ``add_versions`` ``--version``, ``--override`` and ``--scope`` (as ``marin run`` has them)."""
    gc = commands.add_parser(
        "gc",
        help="delete what Marin built that the given pipelines no longer need",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gc.add_argument("targets", metavar="TARGET", nargs="+", help="a pipeline to keep: file.py:attr")
    add_global(gc)
    add_versions(gc)
    gc.add_argument(
        "--all-users",
        action="store_true",
        help="also collect in every user's folder, keeping what each user's placement serves "
        "(and another user's builds of a deferred step at another --version)",
    )
    gc.add_argument(
        "--cancel-orphans",
        action="store_true",
        help="cancel a remote job still running for a step it deletes (default: list it)",
    )
    gc.add_argument(
        "--keep-versions",
        type=_keep_versions,
        metavar="N",
        help="also keep each name's N newest versions",
    )
    gc.add_argument(
        "--older-than",
        type=_age,
        metavar="AGE",
        help="delete only what was built longer ago than AGE (30d, 12h, 2w)",
    )
    gc.add_argument("--dry-run", action="store_true", help="delete nothing; list what would go")
    gc.add_argument("--json", action="store_true", help="one machine-readable report on stdout")
    gc.set_defaults(func=cmd_gc)


class _Printer:
    """Prints each deleted step as it goes; a progress bar on a terminal for long runs."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, item: Any, done: int, total: int) -> None:
        from marin.gc.report import collected_line

        if self.bar is None and total >= PROGRESS_MIN_STEPS and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(console=Console(file=sys.stderr), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("deleting", total=total)
        # The live display redirects stdout: each line appears above the bar.
        print(collected_line(item, False), flush=True)
        if self.bar is not None:
            self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def cmd_gc(args: argparse.Namespace) -> int:
    from marin.execution.pipeline.versions import codex_from_args
    from marin.gc.api import collect_garbage
    from marin.gc.report import render
    from marin.terminal_text import safe_json

    versions = codex_from_args(args.run_version, args.override)
    printer = None if args.json or args.dry_run else _Printer()
    try:
        report = collect_garbage(
            args.targets,
            args.prefix,
            keep_versions=args.keep_versions,
            older_than=args.older_than,
            dry_run=args.dry_run,
            on_deleted=printer,
            versions=versions,
            scope=args.scope,
            all_users=args.all_users,
            cancel_orphans=args.cancel_orphans,
        )
    finally:
        if printer is not None:
            printer.close()
    if args.json:
        print(safe_json(json.dumps(report.to_json(), indent=2, ensure_ascii=False)))
    else:
        sys.stdout.write(render(report, listed=args.dry_run))
    return 0 if report.ok else 1
