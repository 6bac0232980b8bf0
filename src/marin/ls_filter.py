"""``marin ls`` filters: name pattern, status, built before or after, by whom, git commit.

They narrow the entries ``marin.catalog.list_entries`` found, for the table and ``--json``
alike. A time, a user or a commit describes a build, so an unfinished attempt (which has no
record) only passes filters on name and status.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
from dataclasses import dataclass
from enum import StrEnum

from marin.catalog import Entry, who
from marin.execution.errors import MarinError
from marin.execution.store.records import FAILED, parse_stored_time


class LsStatus(StrEnum):
    """``marin ls --status``: which artifacts to list."""

    BUILT = "built"
    UNFINISHED = "unfinished"  # no record: an attempt running, or one that failed
    FAILED = "failed"


STATUSES = tuple(LsStatus)


class LsFilterError(MarinError, ValueError):
    """A ``marin ls`` filter that cannot be understood."""


def parse_when(text: str, option: str) -> datetime.datetime:
    """An ISO date or date-time, read as records' times are (one without a zone is UTC).

    Raises:
        LsFilterError: ``text`` is not an ISO date or time.
    """
    when = parse_stored_time(text.strip())
    if when is None:
        raise LsFilterError(
            f"{option} {text!r} is not a date or time",
            f"use an ISO date or time, e.g. {option} 2026-01-31 or {option} 2026-01-31T12:00:00Z",
        )
    return when


@dataclass(frozen=True)
class LsFilter:
    """What ``marin ls`` keeps; a field left ``None`` keeps everything."""

    name: str | None = None
    status: str | None = None
    after: datetime.datetime | None = None
    before: datetime.datetime | None = None
    by: str | None = None
    git_commit: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LsFilter:
        status = getattr(args, "status", None)
        if status is not None and status not in STATUSES:
            raise LsFilterError(f"--status {status!r}", f"use one of {', '.join(STATUSES)}")
        after, before = getattr(args, "after", None), getattr(args, "before", None)
        return cls(
            name=getattr(args, "name", None),
            status=status,
            after=parse_when(after, "--after") if after else None,
            before=parse_when(before, "--before") if before else None,
            by=getattr(args, "by", None),
            git_commit=getattr(args, "git_commit", None),
        )

    def _about_builds(self) -> bool:
        return any(v is not None for v in (self.after, self.before, self.by, self.git_commit))

    def keeps(self, entry: Entry) -> bool:
        if self.name is not None:
            name = entry.step_id.rpartition("@")[0]
            if not any(fnmatch.fnmatchcase(n, self.name) for n in (name, entry.step_id)):
                return False
        record = entry.record
        if self.status == LsStatus.BUILT and record is None:
            return False
        if self.status == LsStatus.UNFINISHED and record is not None:
            return False
        failed = record is None and (entry.status or {}).get("state") == FAILED
        if self.status == LsStatus.FAILED and not failed:
            return False
        if record is None:
            return not self._about_builds()
        if self.after is not None or self.before is not None:
            finished = parse_stored_time(record.finished_at)
            if finished is None:
                return False
            if self.after is not None and finished < self.after:
                return False
            if self.before is not None and finished >= self.before:
                return False
        if self.by is not None:
            user = (record.provenance or {}).get("user")
            if self.by not in (user, who(record)):
                return False
        if self.git_commit is not None:
            commit = str((record.provenance or {}).get("git_commit") or "")
            if not self.git_commit or not commit.startswith(self.git_commit):
                return False
        return True

    def apply(self, entries: list[Entry]) -> list[Entry]:
        return [e for e in entries if self.keeps(e)]
