"""Lazily consumed step streams: ``StepRunner.run`` over any iterable, even an endless one.

Marin's ``StepRunner.run`` takes any iterable of steps, so a sweep can be a generator that yields
the next config once it has seen earlier results. Here the stream is driven by this module, not
by the run loop: steps are pulled from the iterable only while fewer than ``lookahead`` of them
are in flight (bounded look-ahead: an endless generator is never drained), and each arriving step
is one sub-run through the ordinary ``StepRunner.run``: its sub-graph is planned when it arrives
(``decide``, as ``marin plan`` does) and built by the one run loop, on a worker thread.

A stream holds each step once, as a list does: a step arriving with another config (or
function) than an earlier arrival's step of one ``name@version`` is refused with the list's
``DuplicateStepError`` when it arrives (what arrived before it still runs to its end).

What is already planned keeps its decision: a step that an earlier sub-run of the stream holds
(a shared dependency) is never planned again while that sub-run is under way. The later sub-run
waits for it, and then plans its sub-graph against storage, where the shared step is now built;
if it failed, the later sub-run is not run (its report names the failed step), never retried.

``marin plan`` plans a list: it cannot plan a stream ahead, since the steps a generator yields
may depend on results not built yet (docs/marin.md says so).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

from marin.execution.errors import InvalidStepError
from marin.execution.pipeline.graph import Graph, check_same_step, collect_steps
from marin.execution.pipeline.lower import lower
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.pipeline.versions import VersionCodex, build_context
from marin.execution.plan.decide import Plan
from marin.execution.run.report import RunReport, blocked_reason
from marin.execution.store.location import Location


@dataclass(frozen=True)
class StreamHook:
    """How the stream reaches a runner: ``run`` plans and builds one sub-graph (a list, as
    ``StepRunner.run``), ``plan`` plans one (``StepRunner.plan``)."""

    run: Callable[[list[StepSpec]], RunReport]
    plan: Callable[[list[StepSpec]], tuple[Plan, Location]]


def is_stream(steps: object) -> TypeGuard[Iterable[Any]]:
    """An iterable that is not a spec, a list or a tuple: consumed lazily by this module."""
    return not isinstance(steps, StepSpec | Graph | list | tuple) and isinstance(steps, Iterable)


def iter_stream(
    hook: StreamHook, steps: Iterable[Any], *, lookahead: int, keep_going: bool = False
) -> Iterator[RunReport]:
    """Pull ``steps`` while fewer than ``lookahead`` are in flight; yield each sub-run's report
    as it ends (completion order; sub-runs that ended together in the order they arrived, so a
    shared step's owner comes before the sub-runs that waited for it). Closing this iterator
    (the consumer stops) stops pulling, waits for the sub-runs in flight and closes ``steps``
    if it is a generator. ``keep_going``: a failed sub-run does not stop the pulling.

    Raises:
        DuplicateStepError: an arriving step is another definition (config or function) of a
            step that arrived before, as ``lower()`` refuses it in a list.
        InvalidStepError: a bad ``lookahead``, or the stream yields something not a step.
    """
    if not isinstance(lookahead, int) or lookahead < 1:
        raise InvalidStepError(f"lookahead={lookahead!r}", "use a whole number >= 1")
    source = iter(steps)
    owner: dict[str, cf.Future[RunReport]] = {}  # output path -> the sub-run that holds it
    known: dict[str, StepSpec] = {}  # output path -> the step that arrived for it
    in_flight: dict[cf.Future[RunReport], None] = {}  # in the order they arrived
    exhausted = stopped = False
    pool = cf.ThreadPoolExecutor(lookahead, thread_name_prefix="marin-stream")
    try:
        while in_flight or not (exhausted or stopped):
            while not (exhausted or stopped) and len(in_flight) < lookahead:
                item = next(source, _END)
                if item is _END:
                    exhausted = True
                    break
                in_flight[_submit(pool, hook, _as_spec(item), owner, known)] = None
            if not in_flight:
                break
            done, _ = cf.wait(in_flight, return_when=cf.FIRST_COMPLETED)
            for future in [f for f in in_flight if f in done]:
                del in_flight[future]
                report = _report_of(future)
                stopped = stopped or (bool(report.failures or report.not_run) and not keep_going)
                yield report
    finally:
        pool.shutdown(wait=True)  # a build in flight finishes: it is never abandoned half-way
        close = getattr(source, "close", None)
        if close is not None:
            close()


_END = object()


def _as_spec(item: Any) -> StepSpec:
    if isinstance(item, StepSpec):
        return item
    lower = getattr(item, "lower", None)
    if lower is None:
        raise InvalidStepError(
            f"the stream yielded a {type(item).__name__}", "yield ArtifactStep handles or StepSpecs"
        )
    spec: StepSpec = lower()
    return spec


def _submit(
    pool: cf.ThreadPoolExecutor,
    hook: StreamHook,
    spec: StepSpec,
    owner: dict[str, cf.Future[RunReport]],
    known: dict[str, StepSpec],
) -> cf.Future[RunReport]:
    """One sub-run for ``spec``'s sub-graph, after the earlier sub-runs holding its steps;
    ``known``: every step arrived so far (a step arriving with another definition is refused).

    Raises:
        DuplicateStepError: a step of ``spec`` differs from one arrived before (config, fn).
    """
    steps = collect_steps([spec])
    for step in steps:  # one step per output path, as in a list
        if step.output_path in known:
            check_same_step(known[step.output_path], step)
    earlier = {owner[s.output_path] for s in steps if s.output_path in owner}
    future = pool.submit(_after, earlier, hook, spec)
    for step in steps:
        owner.setdefault(step.output_path, future)  # the first sub-run keeps its decision
        known.setdefault(step.output_path, step)
    return future


def _after(earlier: set[cf.Future[RunReport]], hook: StreamHook, spec: StepSpec) -> RunReport:
    earlier_reports = [_report_of(f) for f in earlier]
    failed = {
        path: report.plan.decisions[path].spec.step_id
        for report in earlier_reports
        if report.plan is not None
        for path in (*report.failures, *report.not_run)
    }
    if not failed:
        return hook.run([spec])
    # Decided by the earlier sub-run: failed, and never retried by a later one.
    plan, location = hook.plan([spec])
    report = RunReport(location, plan)
    for path in plan.to_build:
        if path not in failed:
            report.not_run[path] = blocked_reason(sorted(set(failed.values())))
    return report


def _report_of(future: cf.Future[RunReport]) -> RunReport:
    """A sub-run's report; a failed one's is attached to the error it raised."""
    try:
        return future.result()
    except Exception as exc:
        report = getattr(exc, "report", None)
        if isinstance(report, RunReport):
            return report
        raise


class LoweredStream:
    """``marin run file.py:stream``: the target's handles, lowered one at a time as the run
    pulls them (under the run's codex: ``--version``/``--override``), and remembered, so the
    run's summary can name every step that arrived. An override is not checked against the
    deferred steps: a stream cannot know them ahead."""

    def __init__(self, source: Iterator[Any], versions: VersionCodex | None = None) -> None:
        self._source = source
        self._versions = versions
        self._memo: dict[Any, Any] = {}  # a shared dependency is lowered once
        self.targets: list[StepSpec] = []
        """The steps the stream yielded so far, in order (the run places each for its scope)."""

    def __iter__(self) -> Iterator[StepSpec]:
        try:
            for item in self._source:
                spec = self._lower(item)
                self.targets.append(spec)
                yield spec
        finally:  # the run stopped pulling: the user's generator is closed too
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    def _lower(self, item: Any) -> StepSpec:
        if not hasattr(item, "lower") and not isinstance(item, StepSpec):
            raise InvalidStepError(
                f"the stream yielded a {type(item).__name__}", "yield ArtifactStep handles"
            )
        with build_context(self._versions) if self._versions else contextlib.nullcontext():
            spec: StepSpec = lower(item, memo=self._memo)
        return spec

    @property
    def steps(self) -> list[StepSpec]:
        """Every step the arrived targets need, dependencies first."""
        return collect_steps(self.targets)


def run_stream(
    hook: StreamHook, steps: Iterable[Any], location: Location, *, lookahead: int, keep_going: bool
) -> RunReport:
    """``StepRunner.run`` of a stream: every sub-run to the end, one merged report; the
    stream's first failure (every failure under ``keep_going``) is raised as a list's is."""
    report = merged(iter_stream(hook, steps, lookahead=lookahead, keep_going=keep_going), location)
    report.raise_failures(keep_going)
    return report


def merged(reports: Iterable[RunReport], location: Any) -> RunReport:
    """One report of a whole stream: each path's first decision, every outcome and failure."""
    out = RunReport(location, None)
    decisions: dict[str, Any] = {}
    policy = None
    for report in reports:
        if report.plan is not None:
            policy = policy or report.plan.policy
            for path, decision in report.plan.decisions.items():
                decisions.setdefault(path, decision)
        out.targets.extend(report.targets)
        out.outcomes.update(report.outcomes)
        out.failures.update(report.failures)
        out.not_run.update(report.not_run)
        out.durations.update(report.durations)
        out.attempts.update(report.attempts)
    if policy is not None:
        out.plan = Plan(decisions, policy)
    return out
