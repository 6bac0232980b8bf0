"""The ``marin`` command.

Engine adapters add their own ``marin export <engine>`` sub-commands through the
``marin.exporters`` entry-point group, so this module never imports Prefect or Airflow.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import entry_points
from typing import Any

from marin.execution.errors import (
    DriftError,
    MarinError,
    PipelineFailedError,
    StepFailedError,
    format_error,
)
from marin.execution.plan.options import RunOptions
from marin.execution.vocabulary import BuildOutcomeKind, RunResult
from marin.run_flags import PREFIX_HELP, add_run_flags, prefix_arg, run_options, usage_checked
from marin.terminal_text import safe_json, safe_text

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 141  # as a shell reports a process ended by SIGPIPE (128 + 13)

log = logging.getLogger("marin")


class UsageError(Exception):
    """Bad command-line input: exit code 2."""


def _lowered(
    target: str, args: argparse.Namespace, options: RunOptions, *, stream: bool = False
) -> Any:
    """The target's ``Graph``, lowered and checked once (under the run's codex), narrowed by
    ``--select``/``--exclude`` when ``args`` has them; with ``stream`` (``marin run``), a
    stream target's ``LoweredStream``."""
    from marin.execution.pipeline.lower import lower_graph
    from marin.execution.pipeline.targets import load_steps, load_target
    from marin.selection import select_graph

    codex = options.versions
    select, exclude = getattr(args, "select", []), getattr(args, "exclude", [])
    loaded = load_steps(target) if stream else load_target(target)
    if not isinstance(loaded, list):
        return _stream_of(loaded, codex, select + exclude + list(getattr(args, "force", [])))
    graph = lower_graph(loaded, versions=codex)
    return select_graph(graph, select, exclude)


def _stream_of(source: Any, codex: Any, named: list[str]) -> Any:
    """``marin run`` of a generator: its steps lowered as the run pulls them (run/stream.py).
    Options that name steps cannot apply to steps that have not arrived yet."""
    from marin.execution.run.stream import LoweredStream

    if named:
        raise UsageError(
            "error: --select, --exclude and --force name steps, and a stream's steps are known "
            "only as they arrive: give them to a target that is a list of handles"
        )
    return LoweredStream(source, codex)


def _scoped(graph: Any, location: Any, args: argparse.Namespace) -> Any:
    """``graph`` with each step placed where it reads and writes for this user (plan/scope.py),
    for a command that runs no ``StepRunner`` (which places its graph itself, once)."""
    from marin.execution.pipeline.graph import Graph
    from marin.execution.plan.scope import resolve_scopes

    scope, force = getattr(args, "scope", "shared"), getattr(args, "force", ())
    policy = run_options(args).policy(list(graph.steps))  # a rebuilt shared step is the user's own
    targets = resolve_scopes(graph.targets, location, scope, force, policy=policy)
    return graph if targets == list(graph.targets) else Graph.of(targets)


def _reachable(prefix: str | None) -> Any:
    """Open the prefix (checked against ``MARIN_ALLOWED_PREFIXES``) once, and probe its
    storage once, briefly, before planning (local disk: no probe); the ``Location``."""
    from marin.execution.store.probe import open_reachable

    return open_reachable(prefix)


def _configure_logging(verbose: bool) -> None:
    from marin import terminal_log

    terminal_log.configure(verbose)


# --- run ---------------------------------------------------------------------------------------


def _use_live_progress(args: argparse.Namespace) -> bool:
    from marin.execution.builder.step_logs import real_stream

    if args.no_progress or getattr(args, "json", False) or os.environ.get("TERM") == "dumb":
        return False
    stream = real_stream(sys.stderr)
    return bool(getattr(stream, "isatty", lambda: False)())


def _capacity_arg(text: str) -> str:
    """``--resources``: checked here (a bad value is a usage error), kept as text."""
    from marin.execution.pipeline.resources import parse_capacity

    usage_checked(parse_capacity, text)
    return text


@contextlib.contextmanager
def _first_interrupt_only() -> Iterator[None]:
    """The first Ctrl-C ends the run (``KeyboardInterrupt``); later ones are ignored until the
    process exits, so a second one in quick succession (``timeout -s INT``, an impatient key)
    cannot cut short the release of leases or the summary being drawn. ``main`` exits at once
    after the summary; the previous handler is back if the run ends otherwise."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def first(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, first)
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True  # also when SIGTERM raised it
        raise
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN if interrupted else previous)


def cmd_run(args: argparse.Namespace) -> int:
    from marin.execution.builder.lineage import pipeline_run
    from marin.execution.step_runner import RunReport, StepRunner
    from marin.progress import RunObserver, render_summary

    as_json = getattr(args, "json", False)
    options = run_options(args)
    graph = _lowered(args.target, args, options, stream=True)
    location = _reachable(args.prefix)
    live = not args.dry_run and not as_json and _use_live_progress(args)
    observer = RunObserver(location, live=live)
    runner = StepRunner(
        options, prefix=args.prefix, listener=observer, resources=getattr(args, "resources", None)
    )
    runner.exit_on_interrupt = True  # the process exits at once, which ends every running fn
    color = sys.stdout.isatty()

    def summary(report: RunReport | None, interrupted: bool = False) -> None:
        if as_json:
            if report is not None:
                shown = report.to_json()
            elif interrupted:  # before any plan: still a report a `jq` pipe can read
                shown = {"schema": 1, "ok": False, "interrupted": True, "steps": []}
            else:
                return
            print(safe_json(json.dumps(shown, indent=2, ensure_ascii=False)))
            sys.stdout.flush()  # an interrupted run leaves with os._exit
            return
        # The steps as the run placed them for its scope (before a plan: as lowered).
        plan = report.plan if report is not None else None
        steps = [d.spec for d in plan.decisions.values()] if plan else list(graph.steps)
        from marin import terminal_log

        text = render_summary(observer, steps, report, color=color, interrupted=interrupted)
        with terminal_log.held():  # a step's late log line comes after it, never inside
            sys.stdout.write(text)
            sys.stdout.flush()

    try:
        with _first_interrupt_only(), observer, pipeline_run(args.target, runner="local"):
            report = runner.run(graph, dry_run=args.dry_run, location=location)
    except (StepFailedError, PipelineFailedError) as exc:
        summary(getattr(exc, "report", None))
        raise
    except DriftError as exc:
        if as_json:
            print(safe_json(json.dumps({"schema": 1, "ok": False, "error": str(exc), "steps": []})))
        raise
    except KeyboardInterrupt as exc:
        so_far = getattr(exc, "report", None)  # RunInterrupted: what ran until the Ctrl-C
        if as_json or observer.runs or so_far is not None:
            summary(so_far, interrupted=True)  # _first_interrupt_only: a second one cannot cut it
        raise
    if as_json:
        summary(report)
        return EXIT_OK
    if not args.dry_run:
        summary(report)
    _print_result(report, report.targets, args.dry_run)
    return EXIT_OK


def _print_result(report: Any, targets: Sequence[Any], dry_run: bool) -> None:
    """``marin run``'s last lines: what was built, and where each target's output is."""
    from marin.progress import readable_result

    outcomes = report.outcomes.values()
    built = sum(1 for o in outcomes if o.action == BuildOutcomeKind.BUILT)
    by_other = sum(1 for o in outcomes if o.action == BuildOutcomeKind.BUILT_BY_OTHER)
    # Early cutoff: planned because an upstream was rebuilt, served as its output was the same.
    cut_off = sum(1 for o in outcomes if o.action == BuildOutcomeKind.CACHED)
    skipped = len(report.skipped) + len(report.pruned)
    verb = "would build" if dry_run else "built"
    count = len(report.to_build) if dry_run else built
    where = safe_text(report.location.url)
    if report.location.is_memory:  # no other process can read it: say so where it is named
        where += " (this process's memory: gone when it exits)"
    elsewhere = f", {by_other} built by another runner" if by_other else ""
    elsewhere += f", {cut_off} {RunResult.UNCHANGED}" if cut_off else ""
    print(f"{verb} {count} step(s){elsewhere}, skipped {skipped}; artifacts under {where}")
    if report.plan is not None:
        from marin.execution.plan.sweep_counts import sweep_counts

        counts = sweep_counts(report.plan)
        if counts is not None:
            print(counts.line())
    for spec in targets:
        # Each output once: the readable file in it (or the output itself, if it is one) with
        # what it is, else the output.
        readable = None if dry_run else readable_result(report.location, spec.output_path)
        output = readable or report.location.url_for(spec.output_path)
        print(f"  {safe_text(spec.step_id)}: {safe_text(output)}")


# --- plan --------------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    from marin.execution.step_runner import StepRunner
    from marin.plan_view import plan_json, plan_table, would_change_anything

    options = run_options(args)
    runner = StepRunner(options, prefix=args.prefix)
    graph = _lowered(args.target, args, options)
    location = _reachable(args.prefix)
    plan, location = runner.plan(graph, location=location)
    if args.json:
        print(safe_json(json.dumps(plan_json(plan, location), indent=2, ensure_ascii=False)))
    else:
        sys.stdout.write(plan_table(plan, location, color=sys.stdout.isatty()))
    if args.exit_code and would_change_anything(plan):
        return EXIT_FAILED
    return EXIT_OK


# --- graph -------------------------------------------------------------------------------------


def cmd_graph(args: argparse.Namespace) -> int:
    from marin.graph_view import render_graph

    options = run_options(args)
    graph = _lowered(args.target, args, options)
    states = None
    if args.prefix:
        from marin.execution.step_runner import StepRunner

        # The targets, as `marin plan` plans them: with every step a target, a pruned step
        # would be "needed" and its readers shown stale.
        location = _reachable(args.prefix)
        plan, _ = StepRunner(options, prefix=args.prefix).plan(graph, location=location)
        states = plan.decisions
    sys.stdout.write(render_graph(list(graph.steps), args.format, states))
    return EXIT_OK


# --- show and ls -------------------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    from marin.catalog import resolve_show_target, show_record
    from marin.execution.store.records import read_record

    location, output_path = resolve_show_target(args.what, args.prefix)
    if args.json:
        record = read_record(location, output_path)
        if record is not None:  # the record, and its timing as every view reads it
            from marin.execution.remote.timing import record_timing

            shown = {**json.loads(record.to_json()), "timing": record_timing(record).to_json()}
            text = json.dumps(shown, sort_keys=True, indent=2, ensure_ascii=False)
            sys.stdout.write(safe_json(text) + "\n")
            return EXIT_OK
    text, code = show_record(location, output_path)
    sys.stdout.write(text)
    return code


def cmd_ls(args: argparse.Namespace) -> int:
    from marin.catalog import check_ls_prefix, list_entries, ls_json, ls_table
    from marin.ls_filter import LsFilter

    wanted = LsFilter.from_args(args)  # bad filters fail before any listing
    location, warning = check_ls_prefix(_reachable(args.prefix))
    if warning:
        print(warning, file=sys.stderr)
    entries = wanted.apply(list_entries(location, sizes=not args.no_size))
    if args.json:
        print(safe_json(json.dumps(ls_json(location, entries), indent=2, ensure_ascii=False)))
    else:
        sys.stdout.write(ls_table(location, entries, color=sys.stdout.isatty(), where=args.where))
    return EXIT_OK


# --- why and diff -----------------------------------------------------------------------------


def cmd_why(args: argparse.Namespace) -> int:
    from marin.execution.step_runner import StepRunner
    from marin.why import explain_step, find_step

    options = run_options(args)
    runner = StepRunner(options, prefix=args.prefix)
    graph = _lowered(args.target, args, options)
    find_step(list(graph.steps), args.step)  # a mistyped name fails before any storage access
    location = _reachable(args.prefix)
    plan, _ = runner.plan(graph, location=location)  # placed where each step reads and writes
    placed = [decision.spec for decision in plan.decisions.values()]
    sys.stdout.write(explain_step(plan, find_step(placed, args.step)))
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    from marin.record_diff import diff_records, read_built, render_diff

    a, b = read_built(args.a, args.prefix), read_built(args.b, args.prefix)
    sys.stdout.write(render_diff(a, b))
    return EXIT_FAILED if diff_records(a, b) else EXIT_OK


# --- results -----------------------------------------------------------------------------------


def cmd_results(args: argparse.Namespace) -> int:
    from marin.plan_view import terminal_width
    from marin.results import collect_results, point_specs, render_csv, render_table

    graph = _lowered(args.target, args, run_options(args))
    location = _reachable(args.prefix)
    graph = _scoped(graph, location, args)
    results = collect_results(location, point_specs(list(graph.steps), list(graph.targets)))
    if args.plot:
        from marin.results_plot import plot_results

        output = args.output or f"results-{args.plot.replace('/', '_')}.png"
        print(safe_text(plot_results(results, args.plot, args.x, output)), file=sys.stderr)
    if args.json:
        print(safe_json(json.dumps(results.to_json(location), indent=2, ensure_ascii=False)))
    elif args.csv:
        sys.stdout.write(safe_text(render_csv(results), keep_newlines=True))
    elif not args.plot:
        sys.stdout.write(render_table(results, location, terminal_width()))
    return EXIT_OK


# --- unlock ------------------------------------------------------------------------------------


def cmd_unlock(args: argparse.Namespace) -> int:
    from marin.execution.store.location import open_prefix
    from marin.step_jobs import running_job_notes
    from marin.unlock import step_output_path, unlock

    output_path = step_output_path(args.step)
    location = open_prefix(args.prefix)
    result = unlock(location, output_path, args.step, force=args.force)
    out = sys.stdout if result.unlocked else sys.stderr
    print(safe_text(result.message), file=out)
    for note in running_job_notes(location, output_path, args.step):
        print(safe_text(note), file=out)
    return EXIT_OK if result.unlocked else EXIT_FAILED


# --- logs, cancel ------------------------------------------------------------------------------


def _write_out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()  # a followed log shows as it comes


def _quiet_broken_pipe(command: Callable[[argparse.Namespace], int]) -> Any:
    """``marin logs ... | head``: a reader that stops reading ends the command quietly."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
            return EXIT_OK

    return run


def cmd_logs(args: argparse.Namespace) -> int:
    from marin.catalog import resolve_show_target
    from marin.execution.store.records import read_record
    from marin.execution.vocabulary import JobState
    from marin.step_jobs import RANK_LOG_LINES, RankLines, follow_job_log, follow_step_log, step_job

    location, output_path = resolve_show_target(args.step, args.prefix)
    step = "@".join(output_path.rsplit("/", 1))
    found = step_job(location, output_path, step)
    if found is not None and found.state != JobState.RUNNING and _has_log(location, output_path):
        found = None  # an ended job whose driver copied its log: the step's log has it all
    kept: list[str] = []  # one rank's lines, of which the last are shown (not following)
    write: Any = _write_out
    if args.rank is not None:  # a gang's rank's lines alone: the whole log is read
        write = RankLines(args.rank, _write_out if args.follow else kept.append)
    if found is not None:  # its job's own log: a driver may be gone, the job never is
        print(safe_text(f"{step}: {found.describe()}"), file=sys.stderr)
        lines = args.lines if args.lines is not None else JOB_LOG_LINES
        end = follow_job_log(found, write, follow=args.follow,
                             lines=RANK_LOG_LINES if args.rank is not None else lines)  # fmt: skip
        if args.follow:  # a collected job's folder may be gone already: the record tells
            built = "; the step is built" if read_record(location, output_path) else ""
            print(safe_text(f"{step}: {found.job.backend} job {found.job.job_id} ended "
                            f"({end}){built}"), file=sys.stderr)  # fmt: skip
        return _rank_shown(args, step, write, kept, lines)
    whole = None if args.rank is not None else args.lines
    if follow_step_log(location, output_path, write, follow=args.follow, lines=whole):
        return _rank_shown(args, step, write, kept, args.lines)
    print(safe_text(f"{step}: no log (the step printed and logged nothing, or never ran)"),
          file=sys.stderr)  # fmt: skip
    return EXIT_FAILED


def _rank_shown(args: argparse.Namespace, step: str, write: Any, kept: list[str],
                lines: int | None) -> int:  # fmt: skip
    """After ``marin logs --rank K`` read the log: its last ``lines`` lines of rank K, or
    an error when the log has none of rank K's."""
    if args.rank is None:
        return EXIT_OK
    for line in kept if lines is None else kept[-lines:] if lines else []:
        _write_out(line)
    if write.shown:
        return EXIT_OK
    print(safe_text(f"{step}: no line of rank {args.rank} in its log (a gang's ranks are "
                    "0 to ranks-1; `marin show` lists them)"), file=sys.stderr)  # fmt: skip
    return EXIT_FAILED


def _has_log(location: Any, output_path: str) -> bool:
    from marin.execution.store.records import log_path

    return bool(location.has_file(location.path(log_path(output_path))))


def cmd_cancel(args: argparse.Namespace) -> int:
    from marin.catalog import steps_named
    from marin.execution.store.location import open_prefix
    from marin.step_jobs import JobRefusedError, cancel_step

    location = open_prefix(args.prefix)
    code = EXIT_OK
    for given in args.steps:
        for output_path in steps_named(location, given):
            step = "@".join(output_path.rsplit("/", 1))
            try:
                print(safe_text(cancel_step(location, output_path, step)))
            except JobRefusedError as exc:
                print(safe_text(str(exc), keep_newlines=True), file=sys.stderr)  # error: ...
                code = EXIT_FAILED
    return code


# --- parser ------------------------------------------------------------------------------------

_EPILOG_RUN = """example:
  marin run examples/ngram.py:pipeline --prefix /tmp/marin --max-concurrent 4
  marin run examples/ngram.py:pipeline --force ngram/dataset --no-progress
  marin run examples/ngram.py:pipeline --force ngram/corpus,ngram/dataset
  marin run examples/ngram.py:pipeline --json > run-report.json
  marin run examples/ngram.py:pipeline --select 'ngram/eval/*' \\
      --exclude 'ngram/eval/trigram*'

On a terminal a live display shows progress; elsewhere (CI, pipes,
--no-progress) the run prints plain log lines. Each step's own output goes to
its <output>.marin/log.txt, and is echoed to the terminal one whole line at a
time, labelled with its step ("ngram/corpus@v1 | ..."), unless --no-step-output.
exit codes: 0 success, 1 a step failed, 2 bad input, 130 interrupted.
"""
_EPILOG_PLAN = """example:
  marin plan examples/ngram.py:pipeline --prefix /tmp/marin
  marin plan examples/ngram.py:pipeline --json | jq '.summary'
  marin plan examples/ngram.py:pipeline --exit-code || echo "would run"
  marin plan examples/ngram.py:pipeline --select 'ngram/eval/*'   # part of it

The JSON schema is documented in docs/plan-json.md.
exit codes: 0 (also when steps would run, unless --exit-code), 1 with
--exit-code when a run would build a step, or serve one whose config drifted
(--on-drift warn) or that is stale (--no-cascade); code drift counts only where
a run rebuilds it (--on-code-drift rebuild), 2 bad input.
"""
_EPILOG_GRAPH = """example:
  marin graph examples/ngram.py:pipeline --format mermaid > graph.mmd
  marin graph examples/ngram.py:pipeline --format dot | dot -Tsvg > graph.svg
  marin graph examples/ngram.py:pipeline --format text --prefix /tmp/marin
  marin graph examples/ngram.py:pipeline --select 'ngram/models/*'
"""
_EPILOG_SHOW = """example:
  marin show ngram/dataset@v1 --prefix /tmp/marin
  marin show /tmp/marin/ngram/dataset/v1
  marin show ngram/dataset --prefix /tmp/marin --json   # its latest version

A name without @version shows its latest built version; a name with nothing
built lists the closest built names. A remote step's recorded job is shown with
its backend, state and log (`marin logs STEP -f` follows it, `marin cancel
STEP` stops it); after a crash, an attempt is UNFINISHED, never RUNNING.

exit codes: 0 built, 1 not built (a failed or unfinished attempt is shown),
2 nothing there.
"""
_EPILOG_LS = """example:
  marin ls --prefix /tmp/marin
  marin ls --prefix s3://bucket/experiments --json --no-size
  marin ls --prefix s3://bucket/experiments --where   # pid, engine task
  marin ls --prefix /tmp/marin --json --name 'ngram/eval/*' --after 2026-01-01
  marin ls --prefix /tmp/marin --status built --by alice --git-commit 3f2c1ab

The filters apply to the table and the JSON alike; the JSON is documented in
docs/ls-json.md.
"""
_EPILOG_WHY = """example:
  marin why examples/ngram.py:pipeline ngram/report --prefix /tmp/marin
  marin why examples/ngram.py:pipeline ngram/eval/bigram-add-k@v1 \\
      --on-drift rebuild

It explains the decisions `marin plan` shows (the same plan, never a second
decision): the reason, the chain of upstream causes (what is rebuilt, which
field drifted), the build the record was made from, and the builds upstream
and downstream.
"""
_EPILOG_DIFF = """example:
  marin diff ngram/models/bigram-add-k@v1 ngram/models/trigram-interpolated@v1
  marin diff ngram/dataset@v1 ngram/dataset@v2 --prefix /tmp/marin

Each side is what `marin show` takes. Fields are named as drift names them
(config.smoothing.k: 0.05 -> 0.5, deps.ngram/dataset: v1 -> v2).
exit codes: 0 the same definition, 1 they differ, 2 not found or bad input.
"""
_EPILOG_UNLOCK = """example:
  marin unlock ngram/dataset@v1 --prefix /tmp/marin
  marin unlock ngram/dataset@v1 --prefix s3://bucket/experiments --force

A step's lease (<output>.marin/lease.json) says which runner is building it;
others wait for it. It ends by itself when its holder finishes, when it expires
(MARIN_LEASE_TTL, default 60 s), or at once when its holder's process on this
machine is gone. Unlock a step whose lease blocks it anyway: a holder that died
on another machine with a long TTL, or a planted lease.
The command says who held the lease (host, pid, since when). A lease that still
protects a build (not expired, and its process alive or on another machine) is
refused unless --force; a build whose lease is broken discards its result when
it notices, and never commits.
exit codes: 0 unlocked (or no lease), 1 refused, 2 bad input.
"""
_EPILOG_LOGS = """example:
  marin logs linear/train@v1 --prefix /tmp/marin
  marin logs linear/train --prefix /tmp/marin -f   # until its job ends
  marin logs linear/train --prefix /tmp/marin --rank 2   # a gang's rank 2 alone

A remote step with a recorded job shows the job's own log (from its backend:
a local job's file, Ray's job logs), also while it runs and after its driver
died; any other step shows its <output>.marin/log.txt. Control characters are
shown escaped (\\x1b): a log is data, never acted on.
exit codes: 0 shown, 1 no log, 2 bad input (or a job not provably the step's).
"""
_EPILOG_CANCEL = """example:
  marin cancel linear/train@v1 --prefix /tmp/marin
  marin cancel linear/train --prefix /tmp/marin   # every version's job

Stops the step's running job through its backend (a local job's process
group, Ray's stop_job), once its backend vouches that the job was submitted
for this step. A driver still waiting for it fails the step and releases its
lease; with no live driver the lease and job record are removed here. With a
live driver the cancel is also recorded (<output>.marin/cancel.json): a job
lost (preempted) when it ran is not submitted again, and the step fails as
cancelled. A name without @version cancels the jobs of all its versions (an
old version's job left running by a version bump).
exit codes: 0 cancelled (or recorded for the live driver, or already ended),
1 refused or nothing to cancel.
"""
_EPILOG_EXPORT = """example:
  marin export airflow --help
  marin export prefect --help
"""
JOB_LOG_LINES = 1000
"""``marin logs`` of a job without ``-f``: its last lines (a backend reads them from the end)."""
TARGET_HELP = "the pipeline: path/to/file.py:attr or package.module:attr"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("marin-execution")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help=TARGET_HELP)


def _add_global(parser: argparse.ArgumentParser, *, prefix_help: str | None = PREFIX_HELP) -> None:
    """Options accepted before and after the sub-command (``marin -v run ...``, ``run -v``).

    The sub-command's copy defaults to SUPPRESS, so it only overrides the top-level value when
    it was given after the sub-command.
    """
    add_run_flags(parser, "verbose")
    if prefix_help is not None:
        add_run_flags(parser, "prefix", help={"prefix": prefix_help})


def _add_common(parser: argparse.ArgumentParser) -> None:
    _add_target(parser)
    _add_global(parser)
    add_run_flags(parser, "select", "exclude")
    _add_versions(parser)


def _add_versions(parser: argparse.ArgumentParser) -> None:
    """``--version V``, ``--override NAME=V`` and ``--scope``: the run's codex and scope."""
    add_run_flags(parser, "version", "override", "scope")


def build_parser(exporters: bool = True) -> argparse.ArgumentParser:
    """The ``marin`` command's parser: the global options, then one function per sub-command.
    ``exporters=False`` leaves ``marin export``'s engines out (finding them scans every
    installed distribution's entry points: tens of milliseconds in a large environment)."""
    from marin.arg_parser import SuggestingParser  # did-you-mean for usage errors

    parser = SuggestingParser(
        prog="marin",
        description="Build lazy, fingerprinted ML pipeline steps locally, or export them\n"
        "to Airflow or Prefect.",
        epilog="example:\n  marin run examples/ngram.py:pipeline\n"
        "run 'marin <command> --help' for each command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}", help="print the version"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, and tracebacks for errors"
    )
    parser.add_argument(
        "--prefix",
        type=prefix_arg,
        default=None,
        help="artifact prefix for the sub-command (also accepted after it)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_run_command(commands)
    _add_plan_command(commands)
    _add_graph_command(commands)
    _add_show_command(commands)
    _add_ls_command(commands)
    _add_why_command(commands)
    _add_diff_command(commands)
    _add_unlock_command(commands)
    _add_logs_command(commands)
    _add_cancel_command(commands)
    _add_gc_command(commands)
    _add_register_command(commands)
    _add_results_command(commands)
    _add_export_command(commands, exporters)
    return parser


def _add_run_command(commands: Any) -> None:
    """``marin run``: its options."""
    run = commands.add_parser(
        "run",
        help="build a pipeline's steps that are not built yet",
        description="Build every step TARGET needs, skipping steps already built.",
        epilog=_EPILOG_RUN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(run)
    add_run_flags(run, "max_concurrent", "max_remote")
    run.add_argument("--dry-run", action="store_true", help="check and report; build nothing")
    add_run_flags(run, "force", "on_drift", "on_code_drift", "cascade", "keep_going")
    run.add_argument(
        "--resources",
        type=_capacity_arg,
        default=None,
        metavar="CAPACITY",
        help="this machine's capacity for steps' declared resources, e.g. "
        "cpu=16,memory=64GiB,gpu=2 (default: all CPUs, physical memory, visible GPUs)",
    )
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no live display, plain log lines (the default when stderr is not a terminal)",
    )
    run.add_argument(
        "--no-step-output",
        dest="step_output",
        action="store_false",
        help="keep what steps print off the terminal (it still goes to each step's log.txt)",
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="print one machine-readable report on stdout at the end (implies --no-progress)",
    )
    run.set_defaults(func=cmd_run)


def _add_plan_command(commands: Any) -> None:
    """``marin plan``: its options."""
    plan = commands.add_parser(
        "plan",
        help="show what a run would do and why; changes nothing",
        description="List every step with its status (built, run, drift, dev,\n"
        "failed-before, foreign), fingerprint, output path and reason. Drift is explained\n"
        "field by field.",
        epilog=_EPILOG_PLAN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(plan)
    add_run_flags(plan, "force", "on_drift", "on_code_drift", "cascade")
    plan.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    plan.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when a run would build anything, or serve a config-drifted or stale step "
        "(for CI gates; advisory code drift alone exits 0)",
    )
    plan.set_defaults(func=cmd_plan)


def _add_graph_command(commands: Any) -> None:
    """``marin graph``: its options."""
    graph = commands.add_parser(
        "graph",
        help="draw the pipeline as Mermaid, Graphviz DOT or text",
        description="Render the lowered graph; edges run from a dependency to its reader.\n"
        "With --prefix, nodes are styled by the status `marin plan` shows (built, stale,\n"
        "drift, to run, forced, dev, failed before, pruned).",
        epilog=_EPILOG_GRAPH,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_target(graph)
    graph.add_argument(
        "--format", choices=("mermaid", "dot", "text"), default="text", help="default: text"
    )
    _add_global(graph, prefix_help="style nodes by their status under this prefix")
    add_run_flags(graph, "select", "exclude")
    _add_versions(graph)
    graph.set_defaults(func=cmd_graph)


def _add_show_command(commands: Any) -> None:
    """``marin show``: its options."""
    show = commands.add_parser(
        "show",
        help="print one artifact's record: config, fingerprint, deps, provenance, result",
        description="Print a built step's record. ARTIFACT is name@version, a name (its\n"
        "latest built version), or the path/URL of an output.",
        epilog=_EPILOG_SHOW,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument(
        "what",
        metavar="ARTIFACT",
        help="name@version (ngram/dataset@v1), a name (ngram/dataset), or an output's path/URL",
    )
    _add_global(show)
    show.add_argument("--json", action="store_true", help="the record (record.json) and its timing")
    show.set_defaults(func=cmd_show)


def _add_ls_command(commands: Any) -> None:
    """``marin ls``: its options."""
    ls = commands.add_parser(
        "ls",
        help="list the artifacts built under a prefix",
        description="List built artifacts: name@version, when, by whom, size, build time;\n"
        "and unfinished attempts.",
        epilog=_EPILOG_LS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_global(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.add_argument(
        "--no-size", action="store_true", help="skip measuring outputs (faster on object stores)"
    )
    ls.add_argument(
        "--where",
        action="store_true",
        help="also show where each step was built: process id and the engine's task "
        "(Airflow task instance, Prefect task run)",
    )
    ls.add_argument(
        "--name",
        metavar="PATTERN",
        help="only steps whose name or name@version matches this glob (e.g. 'ngram/eval/*')",
    )
    ls.add_argument(
        "--status",
        # marin.ls_filter.LsStatus's values (not imported: --help stays cheap)
        choices=("built", "unfinished", "failed"),
        help="only built artifacts, only unfinished attempts (running or failed), or only "
        "failed ones",
    )
    ls.add_argument(
        "--after",
        metavar="WHEN",
        help="only artifacts finished at or after WHEN (ISO date or time; UTC unless it has a "
        "zone)",
    )
    ls.add_argument("--before", metavar="WHEN", help="only artifacts finished before WHEN")
    ls.add_argument("--by", metavar="WHO", help="only artifacts built by this user (or user@host)")
    ls.add_argument(
        "--git-commit",
        dest="git_commit",
        metavar="SHA",
        help="only artifacts built from this git commit (a prefix of it is enough)",
    )
    ls.set_defaults(func=cmd_ls)


def _add_why_command(commands: Any) -> None:
    """``marin why``: its options."""
    why = commands.add_parser(
        "why",
        help="why a step would be built or is served, and which builds it is made of",
        description="Explain one step's decision in the plan a run would make: its reason,\n"
        "the chain of upstream causes, and the build ids upstream and downstream.",
        epilog=_EPILOG_WHY,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_target(why)
    why.add_argument("step", metavar="STEP", help="a step name or name@version")
    _add_global(why)
    add_run_flags(why, "select", "exclude")
    _add_versions(why)
    add_run_flags(why, "force", "on_drift", "on_code_drift", "cascade")
    why.set_defaults(func=cmd_why)


def _add_diff_command(commands: Any) -> None:
    """``marin diff``: its options."""
    diff = commands.add_parser(
        "diff",
        help="the field-level config difference between two built steps",
        description="Compare two built steps' records field by field (two versions of one\n"
        "step, or two points of a sweep), with the differ drift uses.",
        epilog=_EPILOG_DIFF,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    diff.add_argument("a", metavar="A", help="name@version, a name, or an output's path/URL")
    diff.add_argument("b", metavar="B", help="the other one")
    _add_global(diff)
    diff.set_defaults(func=cmd_diff)


def _add_unlock_command(commands: Any) -> None:
    """``marin unlock``: its options."""
    unlock = commands.add_parser(
        "unlock",
        help="break a step's lease by hand (a lease left by a dead or skewed runner)",
        description="Remove the lease of STEP (name@version), saying who held it. A live\n"
        "lease is refused unless --force.",
        epilog=_EPILOG_UNLOCK,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    unlock.add_argument("step", metavar="STEP", help="the step, as name@version")
    _add_global(unlock)
    unlock.add_argument(
        "--force",
        action="store_true",
        help="break the lease even if its holder may still be building (it then discards "
        "its result)",
    )
    unlock.set_defaults(func=cmd_unlock)


def _rank_number(text: str) -> int:
    """``--rank K``: a whole number >= 0."""
    if not text.isdigit() or len(text) > 9:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank: use a whole number >= 0")
    return int(text)


def _add_logs_command(commands: Any) -> None:
    """``marin logs``: its options."""
    logs = commands.add_parser(
        "logs",
        help="print or follow a step's log, a running remote job's too",
        description="Print STEP's log: its remote job's, else its log.txt.",
        epilog=_EPILOG_LOGS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    logs.add_argument("step", metavar="STEP", help="name@version, or a name")
    _add_global(logs)
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing while the step's job (or build) runs",
    )
    logs.add_argument(
        "-n",
        "--lines",
        type=int,
        default=None,
        metavar="N",
        help=f"only the last N lines (a job's: default {JOB_LOG_LINES})",
    )
    logs.add_argument(
        "--rank",
        type=_rank_number,
        default=None,
        metavar="K",
        help="a gang step's rank K alone: its lines of the log, without their [rank K] label",
    )
    logs.set_defaults(func=_quiet_broken_pipe(cmd_logs))  # fmt: skip


def _add_cancel_command(commands: Any) -> None:
    """``marin cancel``: its options."""
    cancel = commands.add_parser(
        "cancel",
        help="cancel steps' running remote jobs and release what they hold",
        description="Cancel the running job of each STEP through its backend.",
        epilog=_EPILOG_CANCEL,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cancel.add_argument("steps", nargs="+", metavar="STEP", help="name@version, or a name")
    _add_global(cancel)
    cancel.set_defaults(func=cmd_cancel)


def _add_gc_command(commands: Any) -> None:
    """``marin gc``: its options live in ``marin.gc.command``."""
    from marin.gc.command import add_gc_parser

    add_gc_parser(commands, _add_global, _add_versions)


def _add_register_command(commands: Any) -> None:
    """``marin register``: its options live in ``marin.registry_command``."""
    from marin.registry_command import add_register_parser

    add_register_parser(commands, _add_global)


def _add_results_command(commands: Any) -> None:
    """``marin results``: its options live in ``marin.results``."""
    from marin.results import add_results_parser

    add_results_parser(commands, _add_common).set_defaults(func=cmd_results)


def _add_export_command(commands: Any, exporters: bool) -> None:
    """``marin export ENGINE``, one sub-command per ``marin.exporters`` entry point: its options."""
    export = commands.add_parser(
        "export",
        help="compile a pipeline for another engine (airflow, prefect)",
        description="Compile a pipeline for an external engine.",
        epilog=_EPILOG_EXPORT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    engines = export.add_subparsers(dest="engine", metavar="ENGINE", required=True)
    found = entry_points(group="marin.exporters") if exporters else ()
    for entry in sorted(found, key=lambda e: e.name):
        try:
            entry.load()(engines)
        except ImportError as exc:
            unavailable = engines.add_parser(entry.name, help=f"(unavailable: {exc})")
            unavailable.set_defaults(func=_unavailable(entry.name, exc))


def _unavailable(engine: str, exc: ImportError) -> Any:
    def fail(args: argparse.Namespace) -> int:
        raise UsageError(
            f"error: the {engine} exporter cannot load ({exc}): "
            f"pip install 'marin-execution[{engine}]'"
        )

    return fail


def _route_step_output(args: argparse.Namespace) -> Callable[[], None]:
    """``--no-step-output``: steps' output goes only to their logs. ``run --json``: stdout is
    the report's, so echoed step output (labelled, whole lines) goes to stderr. Echoed lines
    show the escapes a step printed (``safe_text``), on a terminal or not. Returns what
    undoes it: an in-process caller (a test, a notebook) keeps its own streams afterwards."""
    from marin.execution.builder import step_logs

    step_logs.set_shown(safe_text)  # a step prints anything: escapes shown, never acted on
    if getattr(args, "step_output", True) is False:
        token = step_logs.PASS_THROUGH.set(False)  # the runner's workers copy this context

        def undo_quiet() -> None:
            step_logs.PASS_THROUGH.reset(token)
            step_logs.set_shown(None)

        return undo_quiet
    if args.command == "run" and getattr(args, "json", False):
        stderr = step_logs.real_stream(sys.stderr)
        lock = threading.Lock()

        def to_stderr(text: str) -> None:
            with lock:
                stderr.write(text)
                stderr.flush()

        def undo_echo() -> None:
            step_logs.set_echo(None)
            step_logs.set_shown(None)

        step_logs.set_echo(to_stderr)
        return undo_echo
    return lambda: step_logs.set_shown(None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(exporters="export" in argv)
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    undo_routing = _route_step_output(args)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        return _dispatch(args)
    except BrokenPipeError:
        # The reader of stdout went away (``marin plan --json | head``): not an error of ours.
        # Point stdout at /dev/null so that flushing it at exit raises nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    finally:
        undo_routing()


def _dispatch(args: argparse.Namespace) -> int:
    """Run the sub-command; an error becomes its message and exit code."""
    try:
        code = int(args.func(args))
    except KeyboardInterrupt:
        print(
            format_error("interrupted", "run again to resume; built steps are kept"),
            file=sys.stderr,
        )
        sys.stderr.flush()
        from marin.execution.builder.lineage import abort_unfinished

        abort_unfinished()  # OpenLineage ABORT for builds cut short (bounded; none when off)
        os._exit(EXIT_INTERRUPTED)  # don't wait for running steps' threads
    except (StepFailedError, PipelineFailedError, DriftError) as exc:
        from marin.progress import one_line

        # The last line: whole, on one line (joined before escaping: a newline in it is a
        # space, never a literal \x0a).
        print(safe_text(one_line(str(exc))), file=sys.stderr)
        return EXIT_FAILED
    except (MarinError, UsageError, TypeError, ValueError) as exc:
        if args.verbose and not isinstance(exc, MarinError | UsageError):
            raise  # -v: a bug in a pipeline file deserves its traceback
        message = str(exc)
        if not message.startswith("error:"):
            message = f"error: {message}"
        if args.verbose:  # -v: the whole traceback, the engine's frames included
            import traceback

            traceback.print_exception(exc, file=sys.stderr)
        print(safe_text(message, keep_newlines=True), file=sys.stderr)
        details = getattr(exc, "details", "")
        if details and not args.verbose:
            print(safe_text(details, keep_newlines=True), file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
