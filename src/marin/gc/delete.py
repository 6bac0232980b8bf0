"""Deleting one collected step, safely against the builds and readers running meanwhile.

Under the step's own lease (a live lease means someone is building it: skipped), with its
heartbeat renewing it:

1. the record is read again: a step rebuilt since the listing is skipped;
2. a status marks the folder as Marin's while it is being deleted (a crash past step 3 would
   otherwise leave a metadata folder with neither record nor status, which no later ``gc``
   could prove is Marin's);
3. the record is deleted: from here on every reader sees "not built"; a build that started from
   this record fails its changed-input check before its commit, rather than committing
   something made from a half-deleted input;
4. the output (never an adopted step's: that data is not Marin's), then the metadata
   folder's other files, then the lease, then the folder.

A crash anywhere leaves either the whole build (record and data) or no record: nothing reads as
built without its data. A step another ``gc`` deleted since the listing (taking its lease
re-made an empty folder for it) is skipped, and what its lease left is removed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

from marin.execution import faults
from marin.execution.store.lease import Heartbeat, Lease, LeaseInfo
from marin.execution.store.location import Location
from marin.execution.store.records import (
    ADOPTION,
    FAILED,
    GC_DELETING,
    ArtifactRecord,
    adoption_status,
    delete_record,
    load_record,
    metadata_dir,
    write_status,
)
from marin.gc.walk import LEASE_FILES, Slot
from marin.unlock import describe_lease

GC_CRASH_POINT = "gc-after-record"
"""``MARIN_FAULT_CRASH=gc-after-record@<step>``: SIGKILL a ``gc`` right after it deleted that
step's record, with its output still there (the crash tests)."""
MARKER = GC_DELETING
GONE = "deleted since the listing (by another `marin gc`, or by hand)"


@dataclass(frozen=True)
class Outcome:
    """How deleting one step went: ``deleted``, else ``skipped`` or ``failed`` with why."""

    deleted: bool
    skipped: str = ""
    failed: str = ""


def adopted(slot: Slot) -> bool:
    """An adopted step (``ArtifactStep.adopt``): its data is not Marin's (adopted in place, it
    is never moved or deleted), so only its record and metadata folder go. So too with no
    record but an adoption attempt's status or lease: that attempt never wrote the output."""
    if slot.record is not None:
        return slot.record.source is not None
    return slot.adoption or adoption_status(slot.status)


def _source_of(slot: Slot) -> str:
    if slot.record is not None and slot.record.source is not None:
        return slot.record.source
    found = (slot.status or {}).get(ADOPTION)
    return found if isinstance(found, str) else "unknown"


def _changed(location: Location, slot: Slot, files: list[str]) -> str:
    """Why ``slot`` no longer holds what the listing saw ('' when it still does): deleted
    (``files``, its metadata folder now, holds no more than this gc's lease), or built again."""
    saw = slot.record is not None or slot.status is not None
    saw = saw or any(name not in LEASE_FILES for name in slot.leftovers)
    if saw and all(f.rsplit("/", 1)[-1] in LEASE_FILES for f in files):
        return GONE
    found = load_record(location, slot.output_path)
    now = found.build_id if isinstance(found, ArtifactRecord) else None
    was = slot.record.build_id if slot.record is not None else None
    if now == was and (found is None) == (slot.record is None):
        return ""
    return (
        "built again since the listing"
        if now is not None
        else "its record changed since the listing"
    )


def delete_step(location: Location, slot: Slot, before: Callable[[], str] | None = None) -> Outcome:
    """Delete ``slot``'s record, output and metadata folder, in that order, under its lease.
    ``before`` runs first under the lease (a remote job is stopped there): what it returns,
    if anything, is why the step is skipped instead."""
    lease = Lease(location, slot.output_path)
    try:
        holder = lease.try_acquire()
    except OSError as exc:
        return Outcome(False, failed=f"could not take its lease ({exc})")
    if holder is not None:
        return Outcome(False, skipped=being_built(holder))
    try:
        with Heartbeat(lease):
            files = location.list_tree(location.path(metadata_dir(slot.output_path)))
            why = _changed(location, slot, files)
            if why == GONE:  # what remains is this gc's own lease: it goes too
                _remove_metadata(location, slot.output_path, lease, files)
            why = why or (before() if before is not None else "")
            if why:
                return Outcome(False, skipped=why)
            # An adoption's mark says so, so that a gc killed here never leaves its data
            # looking like Marin's for the next gc (or a build) to delete.
            mark = {ADOPTION: _source_of(slot)} if adopted(slot) else {}
            write_status(location, slot.output_path, FAILED, error=MARKER, **mark)
            delete_record(location, slot.output_path)
            faults.crash_point(GC_CRASH_POINT, slot.step_id)
            if not adopted(slot):
                location.remove_tree(location.path(slot.output_path))
            _remove_metadata(location, slot.output_path, lease, files)
    except OSError as exc:  # a StorageError (retries exhausted) is one too
        return Outcome(False, failed=f"{type(exc).__name__}: {exc}")
    finally:
        lease.release()
    return Outcome(True)


def being_built(holder: LeaseInfo) -> str:
    """Why a step whose lease is live is skipped."""
    return f"being built: its lease is live, {describe_lease(holder)}"


def _remove_metadata(location: Location, output_path: str, lease: Lease, files: list[str]) -> None:
    """The metadata folder's ``files`` (listed once, under the lease: on an object store a
    second listing would find it empty), the status (Marin's mark) last but the lease; then
    the lease (released by its holder, so a builder waiting on it sees it end) and the folder."""
    folder = location.path(metadata_dir(output_path))
    last = [f for f in files if f.rsplit("/", 1)[-1] in (*LEASE_FILES, "status.json")]
    for path in [f for f in files if f not in last]:
        with contextlib.suppress(FileNotFoundError):
            location.rm_file(path)
    with contextlib.suppress(FileNotFoundError):
        location.rm_file(f"{folder}/status.json")
    lease.release()
    if location.is_local or location.is_memory:
        # What is left: the lease's guard file (local disk), the folder entries themselves. A
        # build that takes the lease in this instant finds its folder gone and discards its
        # attempt (``MetadataFolderGone``). An object store has no folders: nothing is left.
        location.remove_tree(folder)
    _prune_empty_parents(location, output_path)


def _prune_empty_parents(location: Location, output_path: str) -> None:
    """On local disk, remove the name folders the deletion left empty (``rmdir`` removes only
    an empty folder, never a link), up to the prefix; object stores have no folders."""
    if not location.is_local:
        return
    parent = output_path.rpartition("/")[0]
    while parent:
        try:
            os.rmdir(location.path(parent))
        except OSError:  # not empty, gone, or not a folder: stop there
            return
        parent = parent.rpartition("/")[0]
