"""What ``marin gc`` keeps for the registry, whatever targets it is given.

Every build registered under the prefix (``marin register``, ``store/registry.py``) is a root:
kept with everything its record was made from, by build id, transitively (``collect.decide``
follows the inputs). A registered build whose path now holds another build is gone already; gc
says so and still keeps the builds it was made from. A manifest gc cannot read or trust stops it
before anything is deleted: it cannot know what that manifest protects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marin.execution.store.location import Location
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
        found.notes.append(
            f"{manifest.id} names {manifest.step} build {manifest.build_id}, which is no longer "
            "stored (its path holds another build, or nothing): that data is gone already"
        )
        for dep, build in sorted(manifest.record.inputs.items()):
            made_from = by_build.get((dep, build))
            if made_from is not None:
                found.roots.setdefault(made_from.output_path, f"{manifest.id} was made from it")
    return found


class RegistryWatch:
    """The registry read again under a step's lease, just before gc deletes it: a build
    registered since gc read the registry is kept (``marin register`` holds the step's lease
    while it writes its manifest, so the two exclude each other). One listing per deleted step;
    each manifest is read once per gc."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self._read: dict[str, Manifest | str] = {}

    def why_kept(self, slot: Slot) -> str:
        """Why ``slot`` must not be deleted now ('' if nothing registered names its build):
        a manifest naming it, or one gc cannot read (it may name it)."""
        if slot.record is None:
            return ""  # only a build is ever registered
        for rel in manifest_files(self.location):
            if rel not in self._read:
                try:
                    self._read[rel] = manifest_file(self.location, rel)
                except ArtifactRegistryError as exc:
                    self._read[rel] = exc.what
            found = self._read[rel]
            if isinstance(found, str):
                return f"the registry holds what gc cannot read ({found}): it may name this build"
            if found.output_path == slot.output_path and found.build_id == slot.record.build_id:
                return f"registered as {found.id} while gc ran"
        return ""


def is_registry_folder(entry: Foreign) -> bool:
    """The registry's own folder, which the walk meets as a metadata folder with no step."""
    return entry.path == REGISTRY_FOLDER.removesuffix(".marin") and entry.why.startswith(
        "a metadata folder at the top"
    )
