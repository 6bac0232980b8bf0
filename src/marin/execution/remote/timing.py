"""How long a committed build took, as every view says it (issue 55): one reading of a record.

A build that reattached to (or collected) a job an earlier driver submitted spent only its wait
here: its duration is the job's own wall time, from the job's submission to its end (both in the
record's ``provenance.job``), and this run's share is said beside it. A build that resumed an
earlier attempt's partial output took this attempt's time; its note says when the earlier
attempts began. ``marin run`` (its summary, log and ``--json``), ``marin show`` and ``marin ls``
read durations only through ``build_timing``. Stored data is untrusted: a time that does not
parse, or that lies outside the build's own span, is left out, never trusted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from marin.execution.remote.view import short_duration
from marin.execution.store.records import parse_stored_time


@dataclass(frozen=True)
class BuildTiming:
    """A build's duration, this run's share of it, and what the two numbers mean."""

    duration_s: float
    """The step's: its job's own wall time for a build that reattached to or collected a job
    another build submitted; else this build's."""
    here_s: float
    """This run's share: the time the build took here (its wait, for a reattached job)."""
    note: str = ""
    """What the duration does not say by itself ("" for a build that did its work itself)."""

    def to_json(self) -> dict[str, Any]:
        """``duration_s``, ``duration_here_s`` and ``duration_note``, as every ``--json`` says."""
        return {
            "duration_s": round(self.duration_s, 6),
            "duration_here_s": round(self.here_s, 6),
            "duration_note": self.note,
        }


def _span(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 60 else short_duration(seconds)


def _job_span(job: dict[str, Any], finished_at: str) -> float | None:
    """The job's wall time: its submission to its end (``ended_at``, else the commit)."""
    start, commit = parse_stored_time(job.get("submitted_at")), parse_stored_time(finished_at)
    if start is None or commit is None or commit < start:
        return None
    end = parse_stored_time(job.get("ended_at"))
    end = end if end is not None and start <= end <= commit else commit
    return (end - start).total_seconds()


def _earlier(attempt: dict[str, Any], earlier: object) -> str:
    """`` (attempts 1-2 began 12m earlier)``: when the attempts this one resumed began
    (``earlier``: the record's ``provenance.earlier_attempts_s``)."""
    number = attempt.get("number")
    if type(number) is not int or number < 2 or not isinstance(earlier, int | float):
        return ""
    if isinstance(earlier, bool) or not math.isfinite(earlier) or earlier < 0:
        return ""
    which = "attempt 1" if number == 2 else f"attempts 1-{number - 1}"
    return f" ({which} began {_span(float(earlier))} earlier)"


def build_timing(
    provenance: object, build_id: str, finished_at: str, duration_s: float,
    here_s: float | None = None,
) -> BuildTiming:  # fmt: skip
    """The timing of a committed build from its record's ``provenance``, ``build_id``,
    ``finished_at`` and ``duration_s``; ``here_s``: this run's own measure of its share, when
    the caller has one (``marin run``), else the record's."""
    here = duration_s if here_s is None else here_s
    prov = provenance if isinstance(provenance, dict) else {}
    job, attempt = prov.get("job"), prov.get("attempt")
    duration, notes = here, []
    if isinstance(job, dict) and job.get("build_id") not in (None, build_id):
        span = _job_span(job, finished_at)  # submitted by another build: an earlier driver
        if span is not None and span > here:
            duration = span
            notes.append(f"reattached: the job's time; {_span(here)} waited here")
        else:
            notes.append("reattached to its job")
    if isinstance(attempt, dict) and attempt.get("resumed") is True:
        number = attempt.get("number")
        resumed = f"resumed attempt {number}" if type(number) is int else "resumed"
        notes.append(resumed + _earlier(attempt, prov.get("earlier_attempts_s")))
    return BuildTiming(duration, here, "; ".join(notes))


def record_timing(record: Any, here_s: float | None = None) -> BuildTiming:
    """``build_timing`` of an ``ArtifactRecord``."""
    return build_timing(
        record.provenance, record.build_id, record.finished_at, record.duration_s, here_s
    )
