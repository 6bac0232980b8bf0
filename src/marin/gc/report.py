"""``marin gc``'s report: what was (or, with ``--dry-run``, would be) deleted, kept, skipped and
left alone, as the text the command prints and as ``--json``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from marin.catalog import human_size
from marin.gc.orphans import LEFT_RUNNING, Orphan
from marin.terminal_text import safe_text

GC_SCHEMA = 1


@dataclass(frozen=True)
class Collected:
    """One step deleted (or to delete): its data and its metadata folder."""

    step: str
    output_path: str
    """Relative to the prefix."""
    state: str
    """``built`` (it had a record) or its last attempt's state (``failed``...)."""
    size_bytes: int


@dataclass(frozen=True)
class Left:
    """A step or path not deleted, and why."""

    path: str
    why: str
    step: str | None = None


@dataclass
class GcReport:
    """What ``collect_garbage`` did: the same for the CLI's text, ``--json`` and the API."""

    prefix: str
    dry_run: bool
    collected: list[Collected] = field(default_factory=list)
    """Deleted (a dry run: what a real run would delete), in deletion order."""
    kept: list[Left] = field(default_factory=list)
    skipped: list[Left] = field(default_factory=list)
    """Marin's, not kept, but not deleted: a live lease, or rebuilt since the listing."""
    failed: list[Left] = field(default_factory=list)
    """Could not be deleted: the error."""
    not_marins: list[Left] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    """Inputs of kept builds whose data was already gone."""
    other_users: list[Left] = field(default_factory=list)
    """User folders left alone (another user's, without ``--all-users``), each once."""
    orphans: list[Orphan] = field(default_factory=list)
    """Remote jobs still running for a step not kept: left running, or cancelled."""
    registry: list[Left] = field(default_factory=list)
    """What was kept for the registry: one per registered id whose build is stored."""

    @property
    def total_bytes(self) -> int:
        return sum(c.size_bytes for c in self.collected)

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        def left(items: list[Left]) -> list[dict[str, Any]]:
            return [{"step": x.step, "path": x.path, "why": x.why} for x in items]

        return {
            "schema": GC_SCHEMA,
            "prefix": self.prefix,
            "dry_run": self.dry_run,
            "collected": [
                {
                    "step": c.step,
                    "output_path": c.output_path,
                    "state": c.state,
                    "size_bytes": c.size_bytes,
                }
                for c in self.collected
            ],
            "total_bytes": self.total_bytes,
            "kept": left(self.kept),
            "skipped": left(self.skipped),
            "failed": left(self.failed),
            "not_marins": left(self.not_marins),
            "gone_inputs": list(self.gone),
            "other_users": [{"path": x.path, "why": x.why} for x in self.other_users],
            "orphans": [o.to_json() for o in self.orphans],
            "registry": left(self.registry),
        }


def collected_line(item: Collected, dry_run: bool) -> str:
    verb = "would delete" if dry_run else "deleted"
    return safe_text(
        f"{verb} {item.step} ({item.state}, {human_size(item.size_bytes)}) {item.output_path}"
    )


def orphan_line(orphan: Orphan) -> str:
    """One orphaned job and what was done about it."""
    job = f"{orphan.backend} job {orphan.job_id} of {orphan.step} ({orphan.state})"
    if orphan.action == LEFT_RUNNING:
        return f"orphaned {job}: left running (--cancel-orphans cancels it)"
    return f"orphaned {job}: {orphan.action}"


def render(report: GcReport, *, listed: bool = True) -> str:
    """The text ``marin gc`` prints; ``listed=False`` leaves out the deleted steps (a real run
    printed them as it went)."""
    lines: list[str] = []
    if listed:
        lines += [collected_line(c, report.dry_run) for c in report.collected]
    sections: list[tuple[Sequence[Any], Callable[[Any], str]]] = [
        (report.skipped, lambda x: f"skipped {x.step or x.path}: {x.why}"),
        (report.failed, lambda x: f"error: could not delete {x.step or x.path}: {x.why}"),
        (report.registry, lambda x: f"kept for the registry: {x.step} ({x.why})"),
        (report.gone, lambda note: f"note: {note}"),
        (report.not_marins, lambda x: f"not Marin's, left alone: {x.path} ({x.why})"),
        (report.other_users, lambda x: f"left alone: {x.path}/ ({x.why})"),
        (report.orphans, orphan_line),
    ]
    lines += [safe_text(line(item)) for items, line in sections for item in items]
    verb = "would free" if report.dry_run else "freed"
    lines.append(
        f"{len(report.collected)} step(s) {'to delete' if report.dry_run else 'deleted'}, "
        f"{verb} {human_size(report.total_bytes)}; {len(report.kept)} kept, "
        f"{len(report.skipped)} skipped, {len(report.failed)} failed, "
        f"{len(report.not_marins)} not Marin's"
    )
    return "\n".join(lines) + "\n"
