"""What ``marin run`` shows while it runs and when it ends.

``RunObserver`` is a ``RunListener``: the ``StepRunner`` calls it on its scheduler thread as steps
start, finish and fail, and it keeps the timings. With ``live=True`` it also drives a ``rich``
live display on the terminal (done/total, the running steps with their elapsed time, skipped and
failed counts), refreshed on rich's own thread; all shared state sits behind one lock. Without a
terminal, nothing is drawn: the runner's own log lines are the progress.

``render_summary`` is the table printed at the end: every step run or skipped with its duration,
the slowest steps, and for each failure the step, its error and the path of its log.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.execution.builder.step_logs import (
    StepLabelFilter,
    real_stream,
    set_echo,
    terminal_formatter,
    written_log_url,
)
from marin.execution.plan.decide import BUILT_REASON
from marin.execution.remote.follow import LiveJob, live_jobs
from marin.execution.remote.timing import record_timing
from marin.execution.store.records import ArtifactRecord
from marin.execution.vocabulary import BuildOutcomeKind, RunResult
from marin.terminal_text import cell_width, cut_middle, safe_rich, safe_text, table_lines

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

    from marin.execution.builder.commit import BuildOutcome
    from marin.execution.step_runner import RunReport
    from marin.execution.step_spec import StepSpec
    from marin.execution.store.location import Location

MAX_RUNNING_SHOWN = 12
SLOWEST_SHOWN = 5
MAX_SKIPPED_LISTED = 200
SKIPPED_LABEL = RunResult.SKIPPED
"""The summary table's result for a step served from its record (or pruned)."""
NOT_RUN_LABEL = "not run"
INTERRUPTED_LABEL = "interrupted"
SUMMARY_ORDER = (
    RunResult.BUILT,
    RunResult.BUILT_BY_OTHER,
    RunResult.UNCHANGED,
    SKIPPED_LABEL,
    RunResult.FAILED,
    NOT_RUN_LABEL,
    INTERRUPTED_LABEL,
)
"""The summary's results, in the order its count line names them: the words of
``marin run --json`` (docs/run-json.md), plus the two only a cut-short run shows."""
SUMMARY_STYLES = {
    RunResult.BUILT: "green",
    RunResult.BUILT_BY_OTHER: "green",
    RunResult.UNCHANGED: "green",
    SKIPPED_LABEL: "dim",
    RunResult.FAILED: "bold red",
    NOT_RUN_LABEL: "yellow",
    INTERRUPTED_LABEL: "yellow",
}
STEP_MIN_WIDTH = 24
NOTE_MIN_WIDTH = 20


@dataclass
class StepRun:
    """One step as the live display follows it: when it started and how it ended."""

    spec: StepSpec
    started: float
    finished: float | None = None
    action: BuildOutcomeKind | RunResult | None = None
    """How it ended (``RunResult.FAILED``, or the build outcome); None while it runs."""
    error: BaseException | None = None

    @property
    def duration(self) -> float | None:
        return None if self.finished is None else self.finished - self.started


def job_line(live: LiveJob) -> str:
    """``local job marin-ab12 running: epoch 3, loss 0.41``: a remote step's job in the live
    display (its last line as the job printed it: made safe where it is drawn)."""
    text = f"{live.job.backend} job {live.job.job_id} {live.state}"
    return f"{text}: {live.last_line.strip()}" if live.last_line.strip() else text


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f}s" if seconds < 10 else f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class RunObserver:
    """A ``RunListener`` that records what happened and, optionally, shows it live."""

    def __init__(
        self,
        location: Location,
        *,
        live: bool = False,
        console: Console | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.location = location
        self.clock = clock
        self.t0 = clock()
        self.total: int | None = None
        self.skipped = 0
        self.runs: dict[str, StepRun] = {}
        self._lock = threading.Lock()
        self._live_enabled = live
        self._console = console
        self._live: Live | None = None
        self._log_handler: logging.Handler | None = None
        self._echo_lock = threading.Lock()  # not self._lock: rich's refresh thread takes that

    # -- RunListener --------------------------------------------------------------------------

    def on_plan(self, total: int, skipped: int) -> None:
        with self._lock:  # a stream plans each arriving step's sub-graph: the counts add up
            self.total, self.skipped = (self.total or 0) + total, self.skipped + skipped

    def on_start(self, spec: StepSpec) -> None:
        with self._lock:
            self.runs[spec.step_id] = StepRun(spec, self.clock())

    def on_finish(self, outcome: BuildOutcome) -> None:
        with self._lock:
            run = self.runs.setdefault(outcome.spec.step_id, StepRun(outcome.spec, self.clock()))
            run.finished, run.action = self.clock(), outcome.action

    def on_fail(self, spec: StepSpec, error: BaseException) -> None:
        with self._lock:
            run = self.runs.setdefault(spec.step_id, StepRun(spec, self.clock()))
            run.finished, run.action, run.error = self.clock(), RunResult.FAILED, error

    # -- queries ------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        with self._lock:
            runs = list(self.runs.values())
        finished = sum(1 for r in runs if r.finished is not None and r.action != RunResult.FAILED)
        return {
            "total": self.total or 0,
            "done": self.skipped + finished,
            "skipped": self.skipped,
            "built": finished,
            "running": sum(1 for r in runs if r.finished is None),
            "failed": sum(1 for r in runs if r.action == RunResult.FAILED),
        }

    def log_url(self, spec: StepSpec) -> str | None:
        """The step's ``log.txt``, or None when its build never wrote one (``written_log_url``)."""
        return written_log_url(self.location, spec.output_path)

    # -- the live display ---------------------------------------------------------------------

    def __rich__(self) -> RenderableType:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.spinner import Spinner
        from rich.table import Table
        from rich.text import Text

        now = self.clock()
        elapsed = format_duration(now - self.t0)
        if self.total is None:
            return Spinner("dots", Text(f"checking what needs building … {elapsed}"))
        c = self.counts()
        head = Table.grid(padding=(0, 1))
        head.add_row(
            ProgressBar(total=max(c["total"], 1), completed=c["done"], width=30),
            Text(f"{c['done']}/{c['total']} done", style="bold"),
            Text(f"· {c['running']} running · {c['skipped']} skipped ·"),
            Text(f"{c['failed']} failed", style="bold red" if c["failed"] else ""),
            Text(f"· {elapsed}", style="dim"),
        )
        with self._lock:
            running = sorted(
                (r for r in self.runs.values() if r.finished is None), key=lambda r: r.started
            )
        rows = Table.grid(padding=(0, 1))
        for _ in range(3):
            rows.add_column(no_wrap=True)
        rows.add_column(no_wrap=True, overflow="ellipsis")  # a job's last line: cut, not wrapped
        jobs = live_jobs()
        for run in running[:MAX_RUNNING_SHOWN]:
            rows.add_row(
                Spinner("dots", style="yellow"),
                safe_rich(run.spec.step_id),
                Text(format_duration(now - run.started), style="dim"),
                safe_rich(job_line(jobs[run.spec.step_id]), "dim")
                if run.spec.step_id in jobs
                else Text(""),
            )
        parts: list[RenderableType] = [head, rows]
        if len(running) > MAX_RUNNING_SHOWN:
            parts.append(Text(f"  … and {len(running) - MAX_RUNNING_SHOWN} more running"))
        return Group(*parts)

    def _echo(self, text: str) -> None:
        """Step output while the display owns the terminal: whole labelled lines, printed above
        the display (``step_logs`` only hands over complete lines)."""
        if self._console is None:
            return
        with self._echo_lock:  # one step's batch of lines at a time
            for line in text.rstrip("\n").split("\n"):
                self._console.print(safe_rich(line), soft_wrap=True, highlight=False, markup=False)

    def __enter__(self) -> RunObserver:
        if not self._live_enabled:
            return self
        from rich.console import Console
        from rich.live import Live

        if self._console is None:
            self._console = Console(file=real_stream(sys.stderr))
        self._live = Live(
            self,
            console=self._console,
            refresh_per_second=8,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._take_over_logging()
        set_echo(self._echo)
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is None:
            return
        try:
            self._live.stop()
        finally:
            set_echo(None)
            self._give_back_logging()
            self._live = None

    def _take_over_logging(self) -> None:
        """While the display runs, log lines print above it, and only warnings and errors."""
        from marin import terminal_log

        console = self._console
        assert console is not None
        handler = _ConsoleLogHandler(console)
        verbose = logging.getLogger().level <= logging.DEBUG
        handler.setLevel(logging.DEBUG if verbose else logging.WARNING)
        terminal_log.swap(handler)
        self._log_handler = handler

    def _give_back_logging(self) -> None:
        from marin import terminal_log

        if self._log_handler is not None:
            terminal_log.swap(None)
            self._log_handler = None


class _ConsoleLogHandler(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self.setFormatter(terminal_formatter())
        self.addFilter(StepLabelFilter())

    def emit(self, record: logging.LogRecord) -> None:

        try:
            style = (
                "red"
                if record.levelno >= logging.ERROR
                else ("yellow" if record.levelno >= logging.WARNING else "")
            )
            self.console.print(
                safe_rich(self.format(record), style, keep_newlines=True),
                soft_wrap=True,
                highlight=False,
            )
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


# --- the end-of-run summary ----------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryRow:
    """One line of the run summary: a step, its result, its duration and a note."""

    step: str
    result: str
    duration: float | None
    note: str = ""


def summary_rows(
    observer: RunObserver,
    steps: list[StepSpec],
    report: RunReport | None,
    *,
    interrupted: bool = False,
) -> list[SummaryRow]:
    """One row per step of the run, in pipeline order (dependencies first)."""
    rows: list[SummaryRow] = []
    skipped_reason: dict[str, str] = {}
    not_run: dict[str, str] = {}
    unchanged_reason: dict[str, str] = {}
    committed: dict[str, ArtifactRecord] = {}  # its timing: a reattached job's, a resumed attempt
    if report is not None:
        for path, outcome in report.outcomes.items():
            committed[path] = outcome.record
        for result in report.results():
            path = result.spec.output_path
            if result.action == RunResult.SKIPPED:
                built = result.reason == BUILT_REASON
                skipped_reason[path] = "built earlier" if built else result.reason
            elif result.action == RunResult.PRUNED:
                skipped_reason[path] = "pruned: not built, and only built steps read it"
            elif result.action == RunResult.BLOCKED:
                not_run[path] = result.reason
            elif result.action == RunResult.UNCHANGED:
                unchanged_reason[path] = _unchanged_note(result.reason)
    with observer._lock:
        runs = dict(observer.runs)
    # Without the runner's report (it raised), the runner's counts still tell skipped steps from
    # blocked ones whenever all the steps that never started are of one kind.
    unstarted = sum(1 for spec in steps if spec.step_id not in runs)
    if interrupted:
        unknown_note = "not started"
    elif observer.total is not None and observer.skipped == unstarted:
        unknown_note = "built earlier"
    elif observer.total is not None and observer.skipped == 0:
        unknown_note = "blocked by a failure"
    else:
        unknown_note = "skipped, or blocked by a failure"
    for spec in steps:
        run = runs.get(spec.step_id)
        if run is not None:
            row = _row_of_run(spec, run, unchanged_reason.get(spec.output_path, ""),
                              committed.get(spec.output_path))  # fmt: skip
            if row.result == INTERRUPTED_LABEL:  # cut short: why, and whether its job runs on
                row = SummaryRow(row.step, row.result, None, not_run.get(spec.output_path, ""))
            rows.append(row)
        elif spec.output_path in skipped_reason:
            rows.append(
                SummaryRow(spec.step_id, SKIPPED_LABEL, None, skipped_reason[spec.output_path])
            )
        elif spec.output_path in not_run:
            rows.append(SummaryRow(spec.step_id, NOT_RUN_LABEL, None, not_run[spec.output_path]))
        elif report is None:
            rows.append(SummaryRow(spec.step_id, NOT_RUN_LABEL, None, unknown_note))
    return rows


def _row_of_run(
    spec: StepSpec, run: StepRun, unchanged_note: str, record: ArtifactRecord | None
) -> SummaryRow:
    """The row of a step the runner started: its result in ``marin run --json``'s words;
    ``record``: what it committed, whose timing (``record_timing``) its duration and note are
    (a reattached job's own time, this run's share said in the note)."""
    if run.action == RunResult.FAILED:
        error = run.error
        note = f"{type(error).__name__}: {error}" if error is not None else ""
        return SummaryRow(spec.step_id, RunResult.FAILED, run.duration, note)
    if run.finished is None:
        return SummaryRow(spec.step_id, INTERRUPTED_LABEL, None)
    if run.action == BuildOutcomeKind.CACHED:
        # Early cutoff: checked, not built; its few milliseconds are no build time.
        return SummaryRow(spec.step_id, RunResult.UNCHANGED, None, unchanged_note)
    result = RunResult.BUILT if run.action == BuildOutcomeKind.BUILT else RunResult.BUILT_BY_OTHER
    if result != RunResult.BUILT or record is None or run.duration is None:
        return SummaryRow(spec.step_id, result, run.duration)  # another runner's is theirs
    timing = record_timing(record, run.duration)
    return SummaryRow(spec.step_id, result, timing.duration_s, timing.note)


def _unchanged_note(reason: str) -> str:
    """``upstream X rebuilt, output unchanged``: the plan's reason without its ``built: ...``."""
    note = reason.removeprefix(BUILT_REASON).lstrip("; ")
    return note or "upstream unchanged"


def _summary_table(rows: list[SummaryRow], color: bool, width: int) -> list[str]:
    """One line per step, never wider than ``width``: the result and duration columns keep
    their width, a long step name is cut in the middle and a long note (an error) at its end,
    never folded onto the next line (the whole error is printed under "failed:" below)."""
    from rich.table import Table
    from rich.text import Text

    result_width = max([len("result"), *(len(r.result) for r in rows)])
    duration_width = len("duration")
    # Two spaces between columns; a note, when there is one, keeps at least NOTE_MIN_WIDTH.
    room = width - result_width - duration_width - 6
    longest = max([len("step"), *(cell_width(safe_text(r.step)) for r in rows)])
    step_width = max(STEP_MIN_WIDTH, min(longest, room - NOTE_MIN_WIDTH))
    note_width = max(1, room - step_width)
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("step", no_wrap=True, width=step_width)
    table.add_column("result", no_wrap=True, width=result_width)
    table.add_column("duration", no_wrap=True, justify="right", width=duration_width)
    table.add_column("note", no_wrap=True, overflow="ellipsis", max_width=note_width)
    listed_skipped = 0
    for row in rows:
        if row.result == SKIPPED_LABEL:
            listed_skipped += 1
            if listed_skipped > MAX_SKIPPED_LISTED:
                continue
        table.add_row(
            safe_rich(cut_middle(safe_text(row.step), step_width)),
            Text(row.result, style=SUMMARY_STYLES.get(row.result, "") if color else ""),
            format_duration(row.duration) if row.duration is not None else "-",
            safe_rich(one_line(row.note)),
        )
    return table_lines(table, width, color)


def render_summary(
    observer: RunObserver,
    steps: list[StepSpec],
    report: RunReport | None,
    *,
    color: bool = False,
    width: int | None = None,
    interrupted: bool = False,
) -> str:
    """The end-of-run summary, fitted to ``width`` (default: the terminal's): long step names
    are cut in the middle (``marin run --json`` has them whole)."""
    from marin.plan_view import terminal_width

    width = width or terminal_width()
    rows = summary_rows(observer, steps, report, interrupted=interrupted)
    lines = _summary_table(rows, color, width)
    skipped = sum(1 for r in rows if r.result == SKIPPED_LABEL)
    if skipped > MAX_SKIPPED_LISTED:
        lines.append(f"... and {skipped - MAX_SKIPPED_LISTED} more skipped step(s)")

    counts: dict[str, int] = {}
    for row in rows:
        counts[row.result] = counts.get(row.result, 0) + 1
    parts = [f"{counts[k]} {k}" for k in SUMMARY_ORDER if counts.get(k)]
    wall = format_duration(observer.clock() - observer.t0)
    lines.append(f"{len(rows)} steps: {', '.join(parts) or 'nothing to do'} in {wall}")

    # Only real work is timed: served, cut-off and not-run steps have no duration.
    timed = sorted((r for r in rows if r.duration is not None), key=lambda r: -(r.duration or 0.0))
    if len(timed) > 1:
        lines.append("slowest:")
        name_room = width - 12  # "  " + the duration in 8 + "  "
        lines += [
            f"  {format_duration(r.duration or 0.0):>8}  {cut_middle(safe_text(r.step), name_room)}"
            for r in timed[:SLOWEST_SHOWN]
        ]

    lines += served_with_warning_lines(report)

    with observer._lock:
        failed = [r for r in observer.runs.values() if r.action == RunResult.FAILED]
    for run in failed:
        error = run.error
        lines.append("")
        lines.append(f"failed: {safe_text(run.spec.step_id)}")
        if error is not None:
            lines.append(f"  error: {safe_text(one_line(f'{type(error).__name__}: {error}'))}")
            where = _where(error)
            if where:
                lines.append(f"  at:    {safe_text(where)}")
        written = observer.log_url(run.spec)
        if written is not None:  # a build refused before fn ran wrote none
            lines.append(f"  log:   {safe_text(written)}")
    return "\n".join(lines) + "\n"


def served_with_warning_lines(report: RunReport | None) -> list[str]:
    """The warnings a run printed while it scrolled, once more where the run ends: steps served
    although their config drifted (``on_drift=warn``), their upstream was rebuilt (no
    cascade) or their code changed (``on_code_drift=warn``)."""
    if report is None or report.plan is None:
        return []
    served = [d for d in report.plan.decisions.values() if d.served_with_warning]
    drifted = [d for d in served if d.drift]
    stale = [d for d in served if d.stale and not d.drift]
    code = [d for d in served if d.code_drift]
    found = (
        (drifted, "their config changed without a version bump", "",
         "`marin plan` names the changed fields, --on-drift rebuild rebuilds them"),
        (stale, "an upstream was rebuilt after them", "; --no-cascade",
         "run without --no-cascade to rebuild them"),
        (code, "their code changed since they were built", "",
         "`marin plan` names what changed, --on-code-drift rebuild rebuilds them in place"),
    )  # fmt: skip
    return [
        f"warning: {len(steps)} step(s) served although {why} "
        f"(first: {safe_text(steps[0].spec.step_id)}{note}); {hint}"
        for steps, why, note, hint in found
        if steps
    ]


def one_line(text: str) -> str:
    """``text`` on one line: an error message is printed whole, never split across lines."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _where(error: BaseException) -> str:
    """The innermost ``file:line in function`` of the step's traceback, if there is one."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


# --- pointing at the result ----------------------------------------------------------------------

READABLE_MAX_BYTES = 64 * 1024
_TEXT_SUFFIXES = (".md", ".markdown", ".txt", ".rst", ".csv", ".tsv", ".json")


def readable_result(location: Location, output_path: str) -> str | None:
    """``"<url> (Markdown, 9 lines)"`` when a target's output is, or holds, a small text file.

    The output itself counts when it is a file of at most 64 KB of UTF-8 text; for a folder,
    the first small text file directly inside it (Markdown first, then other text suffixes).
    Read errors mean "nothing to point at", never a failed run.
    """
    fs, root = location.fs, location.path(output_path)
    try:
        info = fs.info(root)
        if info.get("type") == "file":
            candidates = [info]
        else:
            entries = [e for e in fs.ls(root, detail=True) if e.get("type") == "file"]
            candidates = sorted(
                (e for e in entries if e["name"].lower().endswith(_TEXT_SUFFIXES)),
                key=lambda e: (not e["name"].lower().endswith((".md", ".markdown")), e["name"]),
            )
        for entry in candidates:
            size = entry.get("size")
            if size is None or size > READABLE_MAX_BYTES:
                continue
            text = _small_text(fs, entry["name"])
            if text is None:
                continue
            kind = _kind(entry["name"], text)
            url = location.url_for(output_path)
            if entry["name"].rstrip("/") != root.rstrip("/"):
                url = url.rstrip("/") + "/" + entry["name"].rstrip("/").rsplit("/", 1)[-1]
            lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
            return f"{url} ({kind}, {lines} line{'s' if lines != 1 else ''})"
    except (OSError, ValueError):
        return None
    return None


def _small_text(fs: Any, path: str) -> str | None:
    with fs.open(path, "rb") as f:
        data = f.read(READABLE_MAX_BYTES + 1)
    if len(data) > READABLE_MAX_BYTES or b"\0" in data:
        return None
    try:
        return str(data.decode("utf-8"))
    except UnicodeDecodeError:
        return None


_KINDS = {".json": "JSON", ".csv": "CSV", ".tsv": "TSV", ".rst": "reStructuredText"}


def _kind(name: str, text: str) -> str:
    """What a person is about to read: Markdown, JSON, CSV... else ``text``."""
    if _looks_like_markdown(name, text):
        return "Markdown"
    suffix = "." + name.lower().rsplit(".", 1)[-1] if "." in name.rsplit("/", 1)[-1] else ""
    return _KINDS.get(suffix, "text")


def _looks_like_markdown(name: str, text: str) -> bool:
    if name.lower().endswith((".md", ".markdown")):
        return True
    first = text.lstrip().split("\n", 1)[0]
    return first.startswith("# ") or "\n| --- |" in text or "\n|---|" in text
