"""``collect_garbage``: the Python API of ``marin gc`` (the command prints what it returns)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from marin.execution.pipeline.graph import Graph
from marin.execution.pipeline.versions import VersionCodex
from marin.execution.store.lease import read_lease
from marin.execution.store.location import Location
from marin.execution.store.probe import open_reachable
from marin.execution.store.records import metadata_dir
from marin.gc import roots
from marin.gc.collect import Decision, age_too_large, check_keep_versions, decide, parse_age
from marin.gc.delete import adopted, being_built, delete_step
from marin.gc.orphans import check_job
from marin.gc.registry import RegistryWatch, is_registry_folder, registry_roots
from marin.gc.report import Collected, GcReport, Left
from marin.gc.walk import Listing, Slot, list_prefix, owner_of, tree_listing, tree_size

Target = Any
"""A handle (``ArtifactStep``), a ``StepSpec``, or a target string ``file.py:attr``."""


def _graph(targets: Sequence[Target], versions: VersionCodex | None) -> Graph:
    """The targets' graph, lowered as ``marin plan`` lowers it (with the run's codex)."""
    from marin.execution.pipeline.lower import lower_graph
    from marin.execution.pipeline.targets import load_target

    handles: list[Any] = []
    for target in targets:
        handles.extend(load_target(target) if isinstance(target, str) else [target])
    return lower_graph(handles, versions=versions) if handles else Graph((), ())


def _state(slot: Slot) -> str:
    if slot.record is not None:
        return "adopted" if adopted(slot) else "built"
    if slot.status is None:
        return "unfinished"  # a crash's leftovers
    return str(slot.status.get("state", "unknown")).lower()


def _cutoff(older_than: datetime.timedelta | str | None) -> datetime.datetime | None:
    if older_than is None:
        return None
    age = parse_age(older_than) if isinstance(older_than, str) else older_than
    try:
        return datetime.datetime.now(datetime.UTC) - age
    except OverflowError:
        raise age_too_large(older_than) from None


@dataclass(frozen=True)
class _Options:
    """How one ``collect_garbage`` call deletes: dry, cancelling orphaned jobs or not."""

    dry_run: bool
    cancel_orphans: bool
    registry: RegistryWatch
    """Read again under each step's lease before it is deleted."""


def collect_garbage(
    targets: Iterable[Target],
    prefix: str | Location | None = None,
    *,
    keep_versions: int | None = None,
    older_than: datetime.timedelta | str | None = None,
    dry_run: bool = False,
    on_deleted: Callable[[Collected, int, int], None] | None = None,
    versions: VersionCodex | None = None,
    scope: str = "shared",
    all_users: bool = False,
    cancel_orphans: bool = False,
) -> GcReport:
    """Delete what Marin wrote under ``prefix`` that ``targets`` do not need.

    Kept (``roots.py``): what the targets' plans serve, lowered with ``versions`` and placed as
    ``marin plan --scope scope`` places them, for the user running it (``$MARIN_USER``) or, with
    ``all_users``, for each user folder; registered builds; user folders the plan does not place
    steps in (unless ``all_users``); the newest ``keep_versions`` of each name; what was built
    within ``older_than`` (``"30d"`` or a ``timedelta``); every build a kept record was made
    from, and whatever the paths it read them from hold now (what keeps a stale reader stale);
    every build an adopted step reads (its source, under the prefix). Only Marin's
    folders are deleted; a live lease is skipped, and so is a step whose remote job still runs
    (an orphan; ``cancel_orphans`` cancels it first). ``dry_run`` deletes nothing;
    ``on_deleted(item, done, total)`` follows each deletion; a failure is reported, not raised.

    Raises:
        OptionError: a bad ``keep_versions`` or ``older_than``, before anything is read.
        TargetError: a target string that does not name a pipeline.
        MarinError: what ``lower`` raises for the targets (``InvalidStepError``,
            ``CycleError``, ``DuplicateStepError``, ``ConfigError``, ...), a bad ``scope`` or
            user name, ``ArtifactRegistryError`` (an unreadable manifest): nothing deleted.
        StorageError: the prefix cannot be opened, does not answer within
            ``$MARIN_STORAGE_PROBE_TIMEOUT``, or cannot be listed (``SymlinkError`` for a link
            where Marin must not follow one).
    """
    keep, cutoff = check_keep_versions(keep_versions), _cutoff(older_than)
    graph = _graph(list(targets), versions)
    location = prefix if isinstance(prefix, Location) else open_reachable(prefix)
    listing = list_prefix(location)
    users, others, served = roots.looked_after(graph, location, scope, listing, all_users)
    registry = registry_roots(location, listing)  # kept whatever the targets
    # The roots: everything kept for its own sake, every kind in this one place.
    kept_roots = roots.merged(
        served,
        roots.other_versions(listing.slots, graph, users),
        registry.roots,
        roots.left_alone(listing.slots, others),
        roots.recent(listing.slots, keep, cutoff),
    )
    sources = roots.adopted_sources(graph, location)
    decision = _decide_with_jobs(location, listing, kept_roots, sources)
    report = _report(location, listing, decision.kept, others, dry_run)
    report.gone, report.registry = decision.gone + registry.notes, registry.kept
    options = _Options(dry_run, cancel_orphans, RegistryWatch(location, listing.slots))
    for slot in decision.collect:  # one RegistryWatch: each manifest is read once
        deleted = _collect_one(location, slot, report, options)
        if deleted is not None and on_deleted is not None:
            on_deleted(deleted, len(report.collected), len(decision.collect))
    return report


def _decide_with_jobs(
    location: Location, listing: Listing, kept_roots: roots.Roots, sources: roots.Roots
) -> Decision:
    """``decide``, then keep too what the remote jobs of the steps it would delete read
    (``roots.read_by_jobs``), with what those were built from."""
    decision = decide(listing.slots, kept_roots, sources, location.url)
    jobs_read = roots.read_by_jobs(location, decision.collect, listing.slots)
    if not jobs_read:
        return decision
    return decide(listing.slots, roots.merged(kept_roots, jobs_read), sources, location.url)


def _report(
    location: Location,
    listing: Listing,
    kept: dict[str, str],
    others: dict[str, str],
    dry_run: bool,
) -> GcReport:
    """The report before anything is deleted: what is kept, not Marin's, and left alone
    (another user's folder is one line, its contents never listed)."""
    report = GcReport(location.url, dry_run)
    left = {owner_of(folder) for folder in others}
    report.not_marins = [
        Left(f.path, f.why)
        for f in listing.foreign
        if owner_of(f.path) not in left and not is_registry_folder(f)
    ]
    report.other_users = [Left(folder, why) for folder, why in sorted(others.items())]
    by_path = {s.output_path: s for s in listing.slots}
    report.kept = [
        Left(p, why, by_path[p].step_id)
        for p, why in sorted(kept.items())
        if by_path[p].owner not in left
    ]
    return report


def _collect_one(
    location: Location, slot: Slot, report: GcReport, options: _Options
) -> Collected | None:
    """Measure, then delete (a dry run: check the lease and the job only) one step, into
    ``report``; what it deleted, if it did. A step whose output holds another step's build
    (found by the listing that measures it) is never deleted, as a build never clears it."""
    size, nested = (0, None) if adopted(slot) else tree_listing(location, slot.output_path)
    if nested is not None:
        why = (
            f"its output holds another step's build ({nested}): deleting it would delete "
            "that build too; move one of the two, then run gc again"
        )
        report.skipped.append(Left(slot.output_path, why, slot.step_id))
        return None
    size += tree_size(location, metadata_dir(slot.output_path))
    item = Collected(slot.step_id, slot.output_path, _state(slot), size)

    def stop_its_job() -> str:
        """Under the step's lease: a build registered since gc read the registry stays; an
        orphaned job is listed, and its step stays unless it was cancelled."""
        registered = options.registry.why_kept(slot) if not options.dry_run else ""
        if registered:
            return registered
        orphan = check_job(location, slot, cancel=options.cancel_orphans, dry_run=options.dry_run)
        if orphan is None:
            return ""
        report.orphans.append(orphan)
        return "" if orphan.stopped else orphan.why_skipped()

    if options.dry_run:
        info = read_lease(location, slot.output_path)
        why = being_built(info) if info is not None and info.live else stop_its_job()
        if why:
            report.skipped.append(Left(slot.output_path, why, slot.step_id))
        else:
            report.collected.append(item)
        return None
    outcome = delete_step(location, slot, stop_its_job)
    if outcome.deleted:
        report.collected.append(item)
        return item
    if outcome.skipped:
        report.skipped.append(Left(slot.output_path, outcome.skipped, slot.step_id))
    else:
        report.failed.append(Left(slot.output_path, outcome.failed, slot.step_id))
    return None
