"""``marin gc``'s look at a prefix: every ``<name>/<version>`` slot, and what is not Marin's.

The walk lists folders only, one listing per folder (a delimiter listing on object stores): an
output beside a metadata folder ``X.marin`` is never listed, so a prefix of N steps costs about
N + (number of name folders) list calls whatever the outputs hold. Links are never followed
(local disk): a link anywhere below the prefix is reported, not entered. Only slots whose
metadata folder holds a record or a status naming *that* step's output, or nothing but the
files a build of Marin's writes there (a crash's leftovers: a lease, a log, ``attempt.json``,
``job.json``; one more listing each) with a lease or ``job.json`` naming it (or no output
beside them), are Marin's, and beside an output only when no file there names another output
(``attempt_not_shown``, the rule a build asks); everything else found is listed as not Marin's
and never touched.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from marin.catalog import Entry
from marin.execution.names import METADATA_SUFFIX
from marin.execution.store.lease import LeaseInfo, read_lease
from marin.execution.store.location import Location, with_retries
from marin.execution.store.records import (
    UNKNOWN_BUILD,
    USERS_FOLDER,
    ForeignRecord,
    load_record,
    metadata_dir,
    read_status_file,
    record_disowns_output,
    replaced_build,
    status_names,
)
from marin.execution.store.step_folder import (
    CHECKPOINTS_DIR,
    DIR,
    FILE,
    JOB_ID,
    LEASE_FILE,
    LEASE_GUARD_FILE,
    LINK,
    RECORD_FILE,
    attempt_not_shown,
    folder_entries,
    job_names_output,
    marins_own,
    names_adoption,
    names_output,
)

IO_PARALLELISM = 32

LINKED = "a symbolic link (never followed)"


@dataclass(frozen=True)
class Slot(Entry):
    """A ``<name>/<version>`` Marin wrote: its record, else its last status, else (a crash's
    leftovers) the names of Marin's own files its metadata folder holds (``size`` unused)."""

    leftovers: tuple[str, ...] = ()
    """With no record and no readable status: the files found in the metadata folder."""
    adoption: bool = False
    """With no record: its lease is an adoption's (``marin gc`` deletes its metadata only)."""

    @property
    def owner(self) -> str | None:
        """The user whose folder holds it (``users/<user>/...``), None for a shared one."""
        return owner_of(self.output_path)


def owner_of(path: str) -> str | None:
    """``users/<user>/...`` -> ``<user>``; None for a shared path (and ``users`` itself)."""
    head, _, rest = path.partition("/")
    return rest.split("/", 1)[0] or None if head == USERS_FOLDER else None


LEASE_FILES = (LEASE_FILE, LEASE_GUARD_FILE)


def is_marin_file(name: str, kind: str) -> bool:
    """Whether an entry of a ``<version>.marin/`` folder is one Marin writes there, as the
    store's ``marins_own`` names them, and of that kind: a folder only for the checkpoints and
    a ``local`` job's folder, never a link."""
    if kind == LINK or not marins_own([name]):
        return False
    return (kind == DIR) == (name == CHECKPOINTS_DIR or bool(JOB_ID.fullmatch(name)))


def name_of(slot: Slot) -> str:
    return slot.record.name if slot.record is not None else slot.output_path.rpartition("/")[0]


def built_at(slot: Slot) -> str | None:
    """When it was built (the record), else when its last attempt ended or began."""
    if slot.record is not None:
        return slot.record.finished_at
    status = slot.status or {}
    found = status.get("finished_at") or status.get("started_at")
    return found if isinstance(found, str) else None


@dataclass(frozen=True)
class Foreign:
    """Something under the prefix that Marin cannot prove it wrote: never touched."""

    path: str
    """Relative to the prefix."""
    why: str


@dataclass(frozen=True)
class Listing:
    """What a walk of a prefix found."""

    slots: list[Slot]
    foreign: list[Foreign]


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _split(
    folder: str, entries: list[tuple[str, str]], found: list[Foreign]
) -> tuple[list[tuple[str, str]], list[str]]:
    """One folder's entries: the slots in it (output path, output kind or ''), and the
    folders to descend into. Links and stray files go to ``found``."""
    kinds = dict(entries)
    meta = {
        n[: -len(METADATA_SUFFIX)] for n, k in entries if k == DIR and n.endswith(METADATA_SUFFIX)
    }
    slots = [(_join(folder, out), kinds.get(out, "")) for out in sorted(meta)]
    deeper: list[str] = []
    for name, kind in sorted(entries):
        path = _join(folder, name)
        is_meta = name.endswith(METADATA_SUFFIX) and name[: -len(METADATA_SUFFIX)] in meta
        if name in meta or is_meta:
            continue  # a slot: reading it says whether its output is a link (listed once)
        if kind == LINK:
            found.append(Foreign(path, LINKED))
        elif kind == FILE:
            found.append(Foreign(path, "a file without Marin metadata"))
        else:
            deeper.append(path)
    return slots, deeper


def walk(
    location: Location,
) -> Iterator[tuple[str, list[tuple[str, str]], list[str], list[Foreign]]]:
    """Breadth-first over the prefix's folders, listing a level's folders in parallel: yields
    each folder with its slots, the folders below it, and what it holds that is not Marin's."""
    frontier = [""]
    with ThreadPoolExecutor(IO_PARALLELISM, "marin-gc") as pool:
        while frontier:
            listings = pool.map(lambda rel: folder_entries(location, location.path(rel)), frontier)
            following: list[str] = []
            for folder, entries in zip(frontier, listings, strict=True):
                found: list[Foreign] = []
                slots, deeper = _split(folder, entries, found)
                following.extend(deeper)
                yield folder, slots, deeper, found
            frontier = following


def _read_slot(location: Location, output_path: str, output_kind: str) -> Slot | Foreign:
    """A slot's record or status, or the leftovers of a crashed build, or why it is not
    provably Marin's."""
    if output_kind == LINK:
        return Foreign(output_path, "its output is a symbolic link (never followed)")
    if "/" not in output_path:
        return Foreign(output_path, "a metadata folder at the top of the prefix (no step name)")
    found = load_record(location, output_path)
    if isinstance(found, ForeignRecord):
        return Foreign(
            output_path, f"its metadata folder holds another step's record ({found.why})"
        )
    if found is not None:
        why = record_disowns_output(location, output_path, found) if output_kind else ""
        return Foreign(output_path, why) if why else Slot(output_path, found, None, None)
    status = read_status_file(location, output_path)
    if status is not None and replaced_build(status) != UNKNOWN_BUILD:
        # Beside an output, the build's rule first (in its words): no file there may name
        # another output; then the status must name this one.
        why = _not_shown_beside(location, output_path) if output_kind else ""
        if why or not status_names(status, output_path):
            return Foreign(output_path, why or UNATTRIBUTED.format("status"))
        return Slot(output_path, None, status, None)
    # A corrupt status proves nothing, but is kept as read: it may keep a reader stale.
    entries = folder_entries(location, location.path(metadata_dir(output_path)))
    names = [name for name, _ in entries]
    if not entries:
        return Foreign(output_path, "its metadata folder is empty")
    if not all(is_marin_file(name, kind) for name, kind in entries):
        return Foreign(output_path, "its metadata folder holds files Marin does not write")
    if RECORD_FILE in names:  # a newer Marin's or damaged: maybe a build (red team r25-5)
        return Foreign(output_path, UNREADABLE_RECORD)
    # The rule a build asks before clearing an output (``output_not_marins``): with no file an
    # attempt leaves (only the lease's guard, an empty checkpoints folder), or with one naming
    # another output (a copy), the output is not Marin's. With no output beside them, such
    # leftovers are Marin's own, and go.
    why = attempt_not_shown(location, output_path, names) if output_kind else ""
    if why:
        return Foreign(output_path, why)
    # Unnamed leftovers with no output beside them (an older gc's lease guard) hold nothing
    # but Marin's own files: they go. Beside an output, a status, lease or job naming it proves
    # it, as a build reads them (a status whose replaced build is unknown names it too).
    lease = read_lease(location, output_path)
    named = status is not None and status_names(status, output_path)
    if output_kind and not named and not _leftovers_named(location, output_path, lease):
        return Foreign(output_path, UNATTRIBUTED.format("lease or job"))
    leftovers = tuple(sorted(names))
    adoption = lease is not None and names_adoption(lease.raw)  # its data is not Marin's
    return Slot(output_path, None, status, None, leftovers, adoption)


def _not_shown_beside(location: Location, output_path: str) -> str:
    """``attempt_not_shown`` of a slot with a status and an output beside it (one more
    listing): a status, lease or attempt file there naming another output makes it a copy."""
    entries = folder_entries(location, location.path(metadata_dir(output_path)))
    return attempt_not_shown(location, output_path, (name for name, _ in entries))


UNREADABLE_RECORD = (
    "its record cannot be read by this Marin (a newer Marin's, or damaged): it may be a build "
    "(a step's returned value is its record alone)"
)
UNATTRIBUTED = (
    "no record, and its {} does not name this output (a copy, or one an older Marin wrote): "
    "not provably Marin's build of it"
)


def _leftovers_named(location: Location, output_path: str, lease: LeaseInfo | None) -> bool:
    """Whether a crash's leftovers are provably this step's: its ``lease`` (held while a build
    runs, left behind by one that died) or its remote job's ``job.json`` names this output.
    A log or an attempt file names nothing."""
    if lease is not None and names_output(lease.raw, output_path):
        return True
    return job_names_output(location, output_path)


def list_prefix(location: Location) -> Listing:
    """Walk the prefix; read each slot's record (and status when it has none) in parallel."""
    invalidate = getattr(location.fs, "invalidate_cache", None)
    if invalidate is not None:
        invalidate()  # an object store's listing cache may predate the last builds
    candidates: list[tuple[str, str]] = []
    foreign: list[Foreign] = []
    empty_below: dict[str, bool] = {}
    parents: dict[str, str] = {}
    for folder, slots, deeper, found in walk(location):
        candidates.extend(slots)
        foreign.extend(found)
        empty_below[folder] = not slots
        for child in deeper:
            parents[child] = folder
    unmarked = _unmarked_folders(empty_below, parents)
    tops = tuple(f.path + "/" for f in unmarked)
    foreign = [f for f in foreign if not f.path.startswith(tops)] + unmarked
    with ThreadPoolExecutor(IO_PARALLELISM, "marin-gc") as pool:
        read = list(pool.map(lambda c: _read_slot(location, *c), candidates))
    foreign.extend(r for r in read if isinstance(r, Foreign))
    return Listing(
        sorted((r for r in read if isinstance(r, Slot)), key=lambda s: s.output_path),
        sorted(foreign, key=lambda f: f.path),
    )


def _unmarked_folders(empty: dict[str, bool], parents: dict[str, str]) -> list[Foreign]:
    """The topmost folders with no Marin metadata anywhere below them (listed once each)."""
    holds = {folder for folder, none in empty.items() if not none}
    for folder in list(holds):
        while folder in parents:
            folder = parents[folder]
            holds.add(folder)
    unmarked = {f for f in empty if f and f not in holds}
    return [
        Foreign(f, "a folder without Marin metadata")
        for f in sorted(unmarked)
        if parents.get(f, "") not in unmarked
    ]


def tree_size(location: Location, relative: str) -> int:
    """Bytes stored at or under ``relative`` (links counted as themselves, never followed)."""
    return tree_listing(location, relative)[0]


def tree_listing(location: Location, relative: str) -> tuple[int, str | None]:
    """Bytes stored at or under ``relative``, and the first metadata folder (``*.marin``) found
    below it, relative to the prefix: another step's build inside this output, which deleting
    it would delete (None: none). One listing, the one that measures it."""
    path = location.path(relative)
    if location.is_local:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return 0, None
        if not os.path.isdir(path) or os.path.islink(path):
            return info.st_size, None
        total, nested = 0, None
        for root, dirs, files in os.walk(path):  # os.walk never follows links by default
            inner = next((d for d in sorted(dirs) if d.endswith(METADATA_SUFFIX)), None)
            if nested is None and inner is not None:
                nested = f"{relative}/{os.path.relpath(os.path.join(root, inner), path)}"
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    continue
        return total, nested
    base = path.rstrip("/")
    try:
        found = with_retries(
            lambda: location.fs.find(base, withdirs=False, detail=True), f"list {base}"
        )
    except (FileNotFoundError, NotADirectoryError):
        return 0, None
    below = {n: i for n, i in found.items() if n.rstrip("/") == base or n.startswith(base + "/")}
    folders = (n[len(base) + 1 :].split("/")[:-1] for n in sorted(below))
    nested = next((f for f in folders if any(p.endswith(METADATA_SUFFIX) for p in f)), None)
    if nested is not None:
        end = next(i for i, p in enumerate(nested) if p.endswith(METADATA_SUFFIX))
        nested_path: str | None = "/".join([relative, *nested[: end + 1]])
    else:
        nested_path = None
    return sum(int(info.get("size") or 0) for info in below.values()), nested_path
