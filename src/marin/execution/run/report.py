"""What a run did: ``RunReport`` (filled by the run loop), its JSON, and the one wording of every
"not run" reason and of the error a failed run raises, whichever runner ran it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marin.execution.builder.commit import BuildOutcome
from marin.execution.errors import PipelineFailedError, StepFailedError, list_names, step_failed
from marin.execution.pipeline.artifact import Artifact
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.decide import Plan, Policy
from marin.execution.remote.timing import record_timing
from marin.execution.store.location import Location
from marin.execution.store.records import log_path
from marin.execution.vocabulary import Action, BuildOutcomeKind, RunResult

RUN_ACTIONS = tuple(RunResult)
RUN_REPORT_SCHEMA = 1

KEEP_GOING_CLI = "--keep-going"
"""How each runner is told to keep going after a failure: the one part of the fail-fast reason
that differs between runners (``marin run``, a Prefect flow, an Airflow run's conf)."""
KEEP_GOING_PREFECT = "keep_going=True"
KEEP_GOING_AIRFLOW = "keep_going=true in the run's conf"


def blocked_reason(failed: list[str]) -> str:
    """Why a step whose dependencies ``failed`` (step ids) did not run."""
    return f"not run: dependency {list_names(failed)} failed"


def stopped_reason(failed: str, keep_going: str = KEEP_GOING_CLI) -> str:
    """Why a step did not start after ``failed`` failed under fail-fast (every runner's words)."""
    return (
        f"not started: the pipeline stopped after {failed} failed "
        f"(fail-fast; {keep_going} builds independent steps)"
    )


INTERRUPTED_REASON = "not started: the run was interrupted"
INTERRUPTED_RUNNING_REASON = "interrupted while it ran: nothing was committed"
INTERRUPTED_JOB_REASON = (
    "interrupted while its job ran: the job keeps running; the next run reattaches to it"
)


class RunInterrupted(KeyboardInterrupt):
    """A Ctrl-C ended the run; ``report`` says what it did until then (``interrupted``)."""

    def __init__(self, report: RunReport) -> None:
        super().__init__()
        self.report = report


NOT_STARTED_REASON = "not started"
"""A step planned to build when the run ended before it could start (a dry run)."""


@dataclass(frozen=True)
class StepResult:
    """One step of a finished run, in the vocabulary of ``marin run --json``."""

    spec: StepSpec
    action: RunResult
    reason: str
    output_url: str
    duration_s: float | None = None
    attempts: int | None = None
    """How many attempts the step took (``retries``), for a step that ran; None otherwise."""


_RESULT_OF_OUTCOME = {
    BuildOutcomeKind.BUILT: RunResult.BUILT,
    BuildOutcomeKind.BUILT_BY_OTHER: RunResult.BUILT_BY_OTHER,
    # In a run, a build is re-decided (and served) only when it was planned because an
    # upstream was rebuilt, and that upstream's output turned out unchanged (early cutoff).
    BuildOutcomeKind.CACHED: RunResult.UNCHANGED,
}


@dataclass
class RunReport:
    """Everything one run did, by output path: filled by the run loop as steps end.

    Invariant: a path planned to build ends in exactly one of ``outcomes``, ``failures`` and
    ``not_run`` once the loop returns (none of them after a dry run). A served step whose record
    vanished during the run and was rebuilt (or failed) is in ``outcomes`` (or ``failures``) too.
    """

    location: Location
    plan: Plan | None = None
    targets: list[StepSpec] = field(default_factory=list)
    """The steps the run was asked for, in order, placed where the run wrote them."""
    outcomes: dict[str, BuildOutcome] = field(default_factory=dict)
    """The steps built (or found built by another runner) in this run."""
    failures: dict[str, BaseException] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    """Steps to build that never started -> why (a failed dependency, fail-fast, an interrupt)."""
    durations: dict[str, float] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    """How many attempts each step that ran took (1 unless it was retried)."""
    interrupted: bool = False
    """A Ctrl-C ended the run: what did not end is in ``not_run``, saying so."""

    @property
    def to_build(self) -> list[str]:
        return self.plan.paths(Action.BUILD) if self.plan else []

    @property
    def skipped(self) -> list[str]:
        return self.plan.paths(Action.SKIP) if self.plan else []

    @property
    def pruned(self) -> list[str]:
        return self.plan.paths(Action.PRUNE) if self.plan else []

    @property
    def blocked(self) -> list[str]:
        return sorted(self.not_run)

    def artifact(self, spec: StepSpec) -> Artifact:
        url = spec.data_url(self.location.url)  # an adopted step's consumers read its source
        outcome = self.outcomes.get(spec.output_path)
        if outcome is not None:
            return Artifact(spec, url, outcome.record)
        decision = self.plan.decisions.get(spec.output_path) if self.plan else None
        served = decision is not None and decision.action == Action.SKIP
        return Artifact(spec, url, decision.record if decision and served else None)

    def results(self) -> list[StepResult]:
        """Every step of the run, dependencies first."""
        if self.plan is None:
            return []
        out = []
        for path, decision in self.plan.decisions.items():
            url = self.location.url_for(path)
            spec = decision.spec
            ran = (self.durations.get(path), self.attempts.get(path))
            if path in self.outcomes:
                outcome = self.outcomes[path]
                action = _RESULT_OF_OUTCOME[outcome.action]
                out.append(StepResult(spec, action, outcome.reason or decision.reason, url, *ran))
            elif path in self.failures:
                error = self.failures[path]
                why = f"{type(error).__name__}: {error}"
                out.append(StepResult(spec, RunResult.FAILED, why, url, *ran))
            elif path in self.not_run:
                out.append(StepResult(spec, RunResult.BLOCKED, self.not_run[path], url))
            elif decision.action == Action.SKIP:
                out.append(StepResult(spec, RunResult.SKIPPED, decision.reason, url))
            elif decision.action == Action.PRUNE:
                out.append(StepResult(spec, RunResult.PRUNED, decision.reason, url))
            else:  # planned to build, and the run ended first (a dry run)
                out.append(StepResult(spec, RunResult.BLOCKED, NOT_STARTED_REASON, url))
        return out

    def _sweep_json(self) -> dict[str, Any]:
        """``{"sweep": counts}`` when the run holds a sweep's points, else nothing."""
        from marin.execution.plan.sweep_counts import sweep_counts

        counts = sweep_counts(self.plan) if self.plan is not None else None
        return {} if counts is None else {"sweep": counts.to_json()}

    def to_json(self) -> dict[str, Any]:
        """``marin run --json`` (documented in docs/run-json.md)."""
        results = self.results()
        counts = {a: sum(1 for r in results if r.action == a) for a in RUN_ACTIONS}
        policy = self.plan.policy if self.plan else Policy()
        return {
            "schema": RUN_REPORT_SCHEMA,
            "prefix": self.location.url,
            "ok": not self.failures and not self.interrupted,
            "options": {
                "on_drift": policy.on_drift,
                "force": sorted(policy.force),
                "cascade": policy.cascade,
                "on_code_drift": policy.on_code_drift,
            },
            **({"interrupted": True} if self.interrupted else {}),
            "summary": {"total": len(results), **counts},
            **self._sweep_json(),
            "steps": [
                {
                    "step": r.spec.step_id,
                    "action": r.action,
                    "reason": r.reason,
                    **self._timing_json(r),
                    "output_path": r.output_url,
                    "attempts": r.attempts,
                    **self._resumed(r.spec.output_path),
                    **self._job_json(r.spec),
                }
                for r in results
            ],
        }

    def _timing_json(self, r: StepResult) -> dict[str, Any]:
        """``duration_s`` (a reattached job's own time), ``duration_here_s`` (this run's share)
        and ``duration_note`` of a step built here (``record_timing``); others' ``duration_s``."""
        outcome = self.outcomes.get(r.spec.output_path)
        if r.duration_s is None or outcome is None or outcome.action != BuildOutcomeKind.BUILT:
            return {"duration_s": None if r.duration_s is None else round(r.duration_s, 6)}
        return record_timing(outcome.record, r.duration_s).to_json()

    def _resumed(self, path: str) -> dict[str, Any]:
        """A resumable step built in this run: which attempt of its build committed (counting
        attempts of earlier runs it resumed) and whether it resumed; nothing for other steps."""
        outcome = self.outcomes.get(path)
        if outcome is None or outcome.action != BuildOutcomeKind.BUILT:
            return {}
        attempt = outcome.record.provenance.get("attempt")
        if not isinstance(attempt, dict):
            return {}
        return {"build_attempt": attempt.get("number"), "resumed": attempt.get("resumed")}

    def _job_json(self, spec: StepSpec) -> dict[str, Any]:
        """A remote step's job (docs/remote.md): the one that built it, or the one a failure
        names; absent for other steps, so reports of pipelines without any are unchanged."""
        outcome = self.outcomes.get(spec.output_path)
        job = None if outcome is None else (outcome.record.provenance or {}).get("job")
        if job is None and spec.remote is not None:
            job = getattr(self.failures.get(spec.output_path), "job", None)
        return {"job": job} if isinstance(job, dict) else {}

    def raise_failures(self, keep_going: bool, *, not_run_in_message: bool = False) -> None:
        """Raise the run's one error if a step failed: the first failure (fail-fast), or every
        failure under ``keep_going``; ``report`` is attached to it for a summary.

        ``not_run_in_message``: name the steps that did not run in the message too (an engine's
        UI shows only the error; ``marin run`` lists them in its own summary).

        Raises:
            StepFailedError: a step failed and not ``keep_going``: the first failure, with its
                error as the ``__cause__`` and this report as ``.report``.
            PipelineFailedError: a step failed under ``keep_going``: every failure, at once.
        """
        if not self.failures:
            return
        assert self.plan is not None
        specs = {p: d.spec for p, d in self.plan.decisions.items()}
        first_path, first = next(iter(self.failures.items()))
        not_run = [specs[p].step_id for p in self.blocked]
        error: StepFailedError | PipelineFailedError
        if keep_going:
            failures = {specs[p].step_id: e for p, e in self.failures.items()}
            error = PipelineFailedError(failures, not_run)
        else:
            spec = specs[first_path]
            more = f"; not run: {list_names(not_run)}" if not_run and not_run_in_message else ""
            log_url = self.location.url_for(log_path(spec.output_path))
            error = step_failed(first, spec.step_id, log_url, more)
        error.report = self
        raise error from first
