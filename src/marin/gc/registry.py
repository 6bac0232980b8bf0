"""What ``marin gc`` keeps for the registry, whatever targets it is given.

Every build registered under the prefix (``marin register``, ``store/registry.py``) is a root:
kept with everything its record was made from, by build id, transitively (``collect.decide``
follows the inputs). A registered build whose record alone was lost (deleted or torn by hand)
is kept as it is, freeze mark and data: a build there is still refused. One whose path now
holds another build is gone already; gc says so and still keeps the builds it was made from.
A manifest gc cannot read or trust stops it before anything is deleted: it cannot know what
that manifest protects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marin.execution.store.location import Location
from marin.execution.store.records import UNKNOWN_BUILD, replaced_build
from marin.execution.store.registry import (
    REGISTRY_FOLDER,
    ArtifactRegistryError,
    Manifest,
    list_manifests,
    manifest_file,
    manifest_files,
)
from marin.gc.report import Left
from marin.gc.walk import Foreign, Listing, Slot


@dataclass
class RegistryRoots:
    """The registry's roots under one prefix, and what gc says about them."""

    roots: dict[str, str] = field(default_factory=dict)
    """Output path -> why it is kept."""
    kept: list[Left] = field(default_factory=list)
    """One per registered id whose build is stored: the id, its step and path."""
    notes: list[str] = field(default_factory=list)


def registry_roots(location: Location, listing: Listing) -> RegistryRoots:
    """The roots every registered build under ``location`` adds (none, and no listing, when
    the walk found nothing at the registry's path).

    Raises:
        ArtifactRegistryError: a manifest that cannot be read or trusted (nothing is deleted).
        StorageError: storage kept failing.
    """
    stem = REGISTRY_FOLDER.removesuffix(".marin")
    if not any(f.path in (stem, REGISTRY_FOLDER) for f in listing.foreign):
        return RegistryRoots()  # the walk's own listing saw no registry: nothing to protect
    slots = listing.slots
    manifests, problems = list_manifests(location)
    if problems:
        raise ArtifactRegistryError(
            f"the registry under {location.url} holds what gc cannot read: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            "gc cannot know what such a manifest protects, so it deletes nothing: look at "
            f"{location.url_for(REGISTRY_FOLDER)} and restore or remove the file",
        )
    found = RegistryRoots()
    by_path = {s.output_path: s for s in slots}
    foreign = {f.path for f in listing.foreign}  # left alone: what a lost record leaves there
    by_build = {(s.record.step_id, s.record.build_id): s for s in slots if s.record is not None}
    for manifest in manifests:
        why = f"registered as {manifest.id}"
        slot = by_path.get(manifest.output_path)
        if (
            slot is not None
            and slot.record is not None
            and slot.record.build_id == manifest.build_id
        ):
            found.roots.setdefault(manifest.output_path, why)
            found.kept.append(Left(manifest.output_path, why, manifest.step))
            continue
        if _record_lost(slot, manifest) if slot else manifest.output_path in foreign:
            why += " (its record was lost: its folder and data are kept, still frozen)"
            found.roots.setdefault(manifest.output_path, why)
            found.kept.append(Left(manifest.output_path, why, manifest.step))
            continue
        found.notes.append(
            f"{manifest.id} names {manifest.step} build {manifest.build_id}, which is no longer "
            "stored (its path holds another build, or nothing): that data is gone already"
        )
        for dep, build in sorted(manifest.record.inputs.items()):
            made_from = by_build.get((dep, build))
            if made_from is not None:
                found.roots.setdefault(made_from.output_path, f"{manifest.id} was made from it")
    return found


def _record_lost(slot: Slot, manifest: Manifest) -> bool:
    """Whether ``slot``, at ``manifest``'s output path with no record, may still be the build
    it names, its record deleted or torn by hand: what a build there is refused as
    (``registry.registered_at``), unless the step's status says an unfinished rebuild
    replaced another build there (the registered one was gone before it). Its freeze mark and
    whatever is at its path are then kept: deleting them would unfreeze it. (With data at its
    output, the walk finds no slot there but what it leaves alone: the same, and so said.)"""
    if slot.record is not None:
        return False
    replaced = replaced_build(slot.status)
    return not replaced or replaced in (UNKNOWN_BUILD, manifest.build_id)


class RegistryWatch:
    """The registry read again under a step's lease, just before gc deletes it: a build
    registered since gc read the registry, and every build its record was made from, is kept.

    Why that is race-free: ``marin register`` holds the lease of the build it registers and of
    every build that one was made from while it writes the manifest (``registry_lineage``), and
    gc reads the registry under the lease of the step it deletes. So for a registration and the
    deletion of any build in its lineage, one holds that lease first: either gc reads the
    registry after the manifest is written and keeps the build, or the registration finds the
    build deleted and writes nothing. One listing per deleted step; each manifest is read once
    per gc, and its lineage is followed through the records gc listed (a build gc did not list
    is never deleted by it), with no more reads."""

    def __init__(self, location: Location, slots: list[Slot]) -> None:
        self.location = location
        self._read: dict[str, dict[tuple[str, str], str] | str] = {}
        """Manifest file -> (step, build) of its lineage -> why kept; or why it is unreadable."""
        self._by_build = {(s.record.step_id, s.record.build_id): s for s in slots if s.record}

    def why_kept(self, slot: Slot) -> str:
        """Why ``slot`` must not be deleted now ('' if nothing registered names its build or
        was made from it): a manifest naming it, or one gc cannot read (it may name it)."""
        if slot.record is None:
            return ""  # only a build is ever registered or made from
        build = (slot.record.step_id, slot.record.build_id)
        for rel in manifest_files(self.location):
            if rel not in self._read:
                try:
                    self._read[rel] = self._lineage(manifest_file(self.location, rel))
                except ArtifactRegistryError as exc:
                    self._read[rel] = exc.what
            found = self._read[rel]
            if isinstance(found, str):
                return f"the registry holds what gc cannot read ({found}): it may name this build"
            if build in found:
                return found[build]
        return ""

    def _lineage(self, manifest: Manifest) -> dict[tuple[str, str], str]:
        """The builds ``manifest`` keeps, by (step, build id), as gc listed them."""
        kept = {(manifest.step, manifest.build_id): f"registered as {manifest.id} while gc ran"}
        todo = [manifest.record]
        while todo:
            record = todo.pop()
            for dep, build in sorted(record.inputs.items()):
                if (dep, build) in kept:
                    continue
                kept[(dep, build)] = f"{manifest.id}, registered while gc ran, was made from it"
                slot = self._by_build.get((dep, build))
                if slot is not None and slot.record is not None:
                    todo.append(slot.record)
        return kept


def is_registry_folder(entry: Foreign) -> bool:
    """The registry's own folder, which the walk meets as a metadata folder with no step."""
    return entry.path == REGISTRY_FOLDER.removesuffix(".marin") and entry.why.startswith(
        "a metadata folder at the top"
    )
