"""A registry of released artifacts: ``ns/name/tag`` -> one build, append-only.

``marin register NAME@VERSION --id ns/name/tag`` writes one manifest per id under the prefix, at
``<prefix>/registry.marin/<ns>/<name>/<tag>.json`` (a folder no step can take: a name segment
ending in ``.marin`` is reserved). The manifest holds the build's record as it was registered
(its ``build_id``, fingerprint, config, result and inputs); ``Artifact.from_id`` resolves an
id with that read and one of the record at its path (``resolve``), and ``marin gc`` keeps the
build and everything it was made from.

A registered build is frozen at the source: before its first manifest, ``register`` writes a
freeze mark in the step's folder (``registered.json``, naming the build and its ids) under the
step's lease, and the one commit path refuses to replace a build that a manifest names
(``frozen``: the mark's ids first; when they name none, one listing of the registry, since a
mark may be deleted or damaged by hand), or whose mark is there but cannot be read. So a
manifest's build is the one stored at its path, unless someone deleted or replaced it by hand
(``resolve`` then refuses a build replaced). An adoption whose source lies in or holds other
steps' builds under the prefix freezes them too (each its own mark, naming the same ids):
their data is the registered data.

A manifest is created only if none is there, atomically on every backend that can: a temporary
file ``link``-ed into place on local disk (``link`` fails when the name exists, as ``O_EXCL``
does, and a reader never sees half a manifest), ``If-None-Match: *`` on S3, ``ifGenerationMatch=0``
on GCS, one lock on ``memory://``. A second registration of an id is refused, never written: of
two racing ones exactly one wins. A file system with no conditional create is refused.

Stored manifests are untrusted: one is served only if it parses, names the id it is stored under,
and holds a record of the step and build it names; its data is read under the prefix it was
found in (the path it names is relative), never at a URL it carries.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from marin.execution.errors import MarinError, NotAFolderError, StorageError
from marin.execution.faults import crash_point
from marin.execution.ids import new_id
from marin.execution.names import (
    DEVICE_NAMES,
    METADATA_SUFFIX,
    is_mutable_version,
    validate_name,
)
from marin.execution.store.location import Location, durable, with_retries
from marin.execution.store.placement import adopted_builds, relative_under
from marin.execution.store.records import (
    UNKNOWN_BUILD,
    ArtifactRecord,
    parse_json,
    read_record,
    read_status_file,
    record_path,
    replaced_build,
)
from marin.execution.store.step_folder import (
    RegisteredMark,
    UnreadableMark,
    load_registered_mark,
    read_registered_mark,
    write_registered_mark,
)

REGISTRY_FOLDER = "registry.marin"
"""Under the prefix: a segment ending in ``.marin`` is never a step's (``names.py``)."""
MANIFEST_SCHEMA = 1
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}")

__all__ = [
    "REGISTRY_FOLDER",
    "ArtifactAlreadyExistsError",
    "ArtifactNotFoundError",
    "ArtifactRegistryError",
    "Frozen",
    "InvalidArtifactIdError",
    "Manifest",
    "RegistryId",
    "frozen",
    "frozen_ids",
    "list_manifests",
    "lookup",
    "manifest_file",
    "manifest_files",
    "register",
    "registered_at",
    "registered_by",
    "resolve",
]


class ArtifactRegistryError(MarinError):
    """A registry error (Marin's name): a manifest that cannot be read or trusted."""


class ArtifactNotFoundError(ArtifactRegistryError, KeyError):
    """No manifest for this id under the prefix."""

    def __str__(self) -> str:
        return Exception.__str__(self)  # the message, never ``KeyError``'s quoted repr of it


class ArtifactAlreadyExistsError(ArtifactRegistryError):
    """The id is registered already; ``existing`` is its manifest (never overwritten)."""

    existing: Manifest | None = None


def _portable_segment(segment: str) -> bool:
    """An id segment names one file on every disk: the id alphabet, no trailing ``.``, no
    metadata folder's ``.marin`` ending, no Windows device name (``CON``, ``nul.txt``)."""
    folded = segment.casefold()
    return (
        bool(_SEGMENT.fullmatch(segment))
        and not segment.endswith(".")
        and not folded.endswith(METADATA_SUFFIX)
        and folded.split(".", 1)[0] not in DEVICE_NAMES
    )


class InvalidArtifactIdError(ArtifactRegistryError, ValueError):
    """An id that is not ``namespace/name/tag``."""


_ID_FIX = (
    "give an id of three segments, namespace/name/tag (e.g. datasets/fineweb/v3): letters, "
    "digits, '.', '_', '=' and '-', each starting with a letter or digit"
)


@dataclass(frozen=True)
class RegistryId:
    """``namespace/name/tag`` (Marin's ``(id, version)`` is ``("namespace/name", "tag")``)."""

    namespace: str
    name: str
    tag: str

    @classmethod
    def parse(cls, text: object, tag: object = None) -> RegistryId:
        """``"ns/name/tag"``, or Marin's two arguments ``("ns/name", "tag")``.

        Raises:
            InvalidArtifactIdError: not three segments of the id alphabet.
        """
        if not isinstance(text, str) or (tag is not None and not isinstance(tag, str)):
            raise InvalidArtifactIdError(f"artifact id {text!r} is not a string", _ID_FIX)
        full = f"{text}/{tag}" if tag is not None else text
        parts = full.split("/")
        bad = next((p for p in parts if not _portable_segment(p)), None)
        if len(parts) != 3 or bad is not None:
            why = f"segment {bad!r} is not allowed" if bad is not None else "not 3 segments"
            raise InvalidArtifactIdError(f"artifact id {full!r}: {why}", _ID_FIX)
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}/{self.tag}"

    @property
    def manifest_path(self) -> str:
        """Relative to the prefix."""
        return f"{REGISTRY_FOLDER}/{self.namespace}/{self.name}/{self.tag}.json"


@dataclass(frozen=True)
class Manifest:
    """One registration: the id, the build it names and that build's record as registered."""

    id: str
    step: str
    output_path: str
    """The build's output, relative to the prefix the manifest is under."""
    build_id: str
    registered_at: str
    registered_by: str
    token: str
    """Random: tells two registrations of one id apart (the loser of a race reads another)."""
    record: ArtifactRecord

    def url(self, location: Location) -> str:
        """Where consumers read the data: an adopted step's source, else its output."""
        return self.record.source or location.url_for(self.output_path)

    def to_bytes(self) -> bytes:
        body = {
            "schema": MANIFEST_SCHEMA,
            "id": self.id,
            "step": self.step,
            "output_path": self.output_path,
            "build_id": self.build_id,
            "registered_at": self.registered_at,
            "registered_by": self.registered_by,
            "token": self.token,
            "record": json.loads(self.record.to_json()),
        }
        return (json.dumps(body, sort_keys=True, ensure_ascii=False) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes, reg_id: RegistryId) -> Manifest:
        """Parse and check a stored manifest (untrusted).

        Raises:
            ValueError: not a manifest of ``reg_id``, or its record is not the build it names.
        """
        data = parse_json(raw.decode())
        if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
            raise ValueError(f"not a schema-{MANIFEST_SCHEMA} manifest")
        fields = ("id", "step", "output_path", "build_id", "registered_at", "registered_by")
        texts = {k: data.get(k) for k in (*fields, "token")}
        if not all(isinstance(v, str) for v in texts.values()):
            raise ValueError("a manifest field is missing or not a string")
        if texts["id"] != str(reg_id):
            raise ValueError(f"it is the manifest of {texts['id']!r}")
        record = ArtifactRecord.from_json(json.dumps(data.get("record")))
        output_path = str(texts["output_path"])
        validate_name(output_path)  # relative and literal: never a URL from the file
        if record.step_id != texts["step"] or record.build_id != texts["build_id"]:
            raise ValueError("its record is not the build it names")
        if record.owner_mismatch(output_path) is not None:
            raise ValueError(f"its record is not the record of {output_path}")
        return cls(record=record, **texts)  # type: ignore[arg-type]


_LEASE_PATIENCE_S = 10.0
"""How long a registration waits for a step's lease another registration (a moment) or a
build or gc (longer: refused once this passes) holds."""


def register(
    location: Location, output_path: str, reg_id: RegistryId, registered_by: str
) -> Manifest:
    """Register the build at ``output_path`` (relative to the prefix) as ``reg_id``, holding the
    lease of that step and of every build it was made from (``registry_lineage``): a
    ``marin gc`` deletes a step only under its lease, after reading the registry again, so gc
    never deletes a build registered meanwhile nor one it was made from, and a registration
    never names a build (or lineage) gc is deleting.

    Raises:
        ArtifactNotFoundError: nothing is built at ``output_path`` (no record of its step).
        ArtifactRegistryError: the step's version is mutable (``dev``), the build's record
            predates build ids (rebuild it first), a
            build it was made from is no longer stored, or a lease is live (being built, or
            deleted by gc): nothing written.
        ArtifactAlreadyExistsError: ``reg_id`` is registered already (its manifest attached).
        NotAFolderError: a file is where the manifest's folder must be: nothing written.
        StorageError: the storage has no conditional create, or kept failing.
    """
    first = _built_record(location, output_path)  # nothing built: refused before any lease
    _refuse_file_in_the_way(location, reg_id, first.step_id)
    if is_mutable_version(first.version):
        raise ArtifactRegistryError(
            f"{first.step_id} has a mutable version ({first.version!r}): every run rebuilds "
            "it, and a registered build is never rebuilt in place, so every later run of it "
            "would fail",
            "give the step a fixed version (v1, 2026-12-06, ...), build it, and register that",
            first.step_id,
        )
    seen = _lineage(location, output_path, first)
    with _hold_leases(location, sorted(seen), reg_id, first.step_id):
        record = _built_record(location, output_path)  # again, under the leases
        if _lineage(location, output_path, record) != seen:
            raise ArtifactRegistryError(
                f"{record.step_id} or a build it was made from changed while it was being "
                "registered (rebuilt, or deleted by gc)",
                "run marin register again",
                record.step_id,
            )
        manifest = Manifest(
            id=str(reg_id),
            step=record.step_id,
            output_path=output_path,
            build_id=record.build_id,
            registered_at=_now(),
            registered_by=registered_by,
            token=new_id(),
            record=record,
        )
        _freeze(location, output_path, record.build_id, reg_id)  # before the manifest
        for path, build in seen.items():  # the builds an adopted source lies in or holds
            if path != output_path and _holds_source(location, path, record, output_path):
                _freeze(location, path, build, reg_id)
        crash_point("register-before-manifest", record.step_id)
        if not create_once(location, reg_id.manifest_path, manifest.to_bytes()):
            raise _taken(location, reg_id, record.step_id)
    return manifest


def _refuse_file_in_the_way(location: Location, reg_id: RegistryId, step: str) -> None:
    """Refuse, before the freeze mark is written, a file where the manifest's folder must be
    (``registry.marin`` itself, or a namespace; red team r19-9: a raw ``NotADirectoryError``
    after the mark). Local disk and ``memory://``: on an object store a key is in no way.

    Raises:
        NotAFolderError: a file is there (move it away).
    """
    found = location.non_folder_on_the_way(reg_id.manifest_path.rpartition("/")[0])
    if found is None:
        return
    raise NotAFolderError(
        f"{location.url_for(found)} is not a folder: the registry keeps "
        f"{reg_id}'s manifest below it ({location.url_for(reg_id.manifest_path)})",
        "move it away (or delete it yourself), then run marin register again; nothing was "
        "registered",
        step,
    )


def _freeze(location: Location, output_path: str, build_id: str, reg_id: RegistryId) -> None:
    """Mark the build at ``output_path`` registered as ``reg_id`` (the caller holds the step's
    lease, as a build does: no build commits between this and the manifest)."""
    mark = read_registered_mark(location, output_path) or RegisteredMark(build_id, ())
    write_registered_mark(location, output_path, mark.adding(build_id, str(reg_id)))


@dataclass(frozen=True)
class Frozen:
    """What freezes the build stored at an output path (``frozen``); false when nothing
    does: it may be replaced in place."""

    ids: tuple[str, ...] = ()
    """The ids registered for it: their manifests name it."""
    unreadable_mark: UnreadableMark | None = None
    """Its freeze mark, there but no mark: the build stays frozen even when no manifest names
    it now (a damaged mark is never read as "not registered")."""

    def __bool__(self) -> bool:
        return bool(self.ids) or self.unreadable_mark is not None


def frozen_ids(
    location: Location, output_path: str, record: ArtifactRecord | None, step_id: str = ""
) -> list[str]:
    """The ids under which the build ``record`` (stored at ``output_path``) is registered
    (``frozen``'s ids).

    Raises:
        ArtifactRegistryError: a manifest cannot be trusted (it may name this build).
        StorageError: storage kept failing.
    """
    return list(frozen(location, output_path, record, step_id).ids)


def frozen(
    location: Location,
    output_path: str,
    record: ArtifactRecord | None,
    step_id: str = "",
    *,
    scan: bool = True,
) -> Frozen:
    """Whether the build ``record`` (stored at ``output_path``) is registered, so never to be
    replaced in place. First the freeze mark: the ids it lists whose manifests name this very
    build (one read each). When it names none (absent, a stale mark of another build, a
    registration that crashed before its manifest, an edited one), the registry itself: one
    listing of its folder, each manifest read once per ``Location`` (``registered_at``); the
    mark is only the fast answer, never the one that unlocks. A mark that is there but cannot
    be read freezes the build whatever the registry says (``Frozen.unreadable_mark``).
    ``scan=False`` (a mutable version, never registered) asks the mark alone.

    ``record`` None (no readable record: torn or deleted), or one without a build id: the
    build the mark names, when a manifest names it as ``step_id``'s at ``output_path``; else
    any manifest naming ``output_path`` (``registered_at``). The manifest holds the record's
    copy: the registered build is still the one stored there, whatever happened to its record.

    Raises:
        ArtifactRegistryError: a manifest cannot be trusted (look at it: a registration's
            manifest is never changed; it may name this build).
        StorageError: storage kept failing.
    """
    built = record if record is not None and record.build_id else None
    mark = load_registered_mark(location, output_path)
    if isinstance(mark, RegisteredMark):
        ids = _marked_ids(location, output_path, mark, built, step_id)
        if ids:
            return Frozen(tuple(ids))
    unreadable = mark if isinstance(mark, UnreadableMark) else None
    if not scan and unreadable is None:
        return Frozen()
    ids = registered_at(location, output_path, built.build_id if built else None)
    return Frozen(tuple(ids), unreadable)


def _marked_ids(
    location: Location,
    output_path: str,
    mark: RegisteredMark,
    built: ArtifactRecord | None,
    step_id: str,
) -> list[str]:
    """The ids ``mark`` lists whose manifests name the build ``built`` (None: the build the
    mark names, as ``step_id``'s), or whose adopted data lies in it.

    Raises:
        ArtifactRegistryError: a manifest the mark lists cannot be trusted.
        StorageError: storage kept failing.
    """
    step, build = (step_id, mark.build_id) if built is None else (built.step_id, built.build_id)
    if mark.build_id != build:
        return []
    found = []
    for text in mark.ids:
        try:
            manifest = lookup(location, RegistryId.parse(text))
        except (InvalidArtifactIdError, ArtifactNotFoundError):
            continue  # not an id, or never registered: freezes nothing
        if (manifest.step, manifest.output_path, manifest.build_id) == (step, output_path, build):
            found.append(manifest.id)
        elif _holds_source(location, output_path, manifest.record, manifest.output_path):
            found.append(manifest.id)  # its data lies in this build (the mark names it)
    return found


def registered_at(location: Location, output_path: str, build_id: str | None) -> list[str]:
    """The ids whose manifests name the build ``build_id`` stored at ``output_path``, or hold
    an adoption whose data lies in it or holds it, asked of the registry itself: one listing
    of its folder, and each manifest read once per ``Location`` (none is ever changed).

    ``build_id`` None (no readable record there): any manifest naming ``output_path``, unless
    the step's status says an unfinished rebuild replaced another build there (``REPLACES``:
    the registered one was gone before it).

    Raises:
        ArtifactRegistryError: a manifest cannot be trusted: it may name this build.
        StorageError: storage kept failing.
    """
    named: list[Manifest] = []
    for rel in manifest_files(location):
        manifest = _manifest_once(location, rel, output_path)
        here = manifest.output_path == output_path and build_id in (None, manifest.build_id)
        if here or _holds_source(location, output_path, manifest.record, manifest.output_path):
            named.append(manifest)  # it names this build, or its adopted data lies in it
    if build_id is None and named:
        replaced = replaced_build(read_status_file(location, output_path))
        if replaced and replaced != UNKNOWN_BUILD:  # a build of its own was there since
            named = [m for m in named if m.output_path != output_path or m.build_id == replaced]
    return [m.id for m in named]


def _manifest_once(location: Location, rel: str, output_path: str) -> Manifest:
    """The manifest at ``rel`` in the registry's folder, read once per ``Location``.

    Raises:
        ArtifactRegistryError: it cannot be trusted: it may name the build at ``output_path``.
        StorageError: storage kept failing.
    """
    memo = location.manifests_read
    found = memo.get(rel)
    if isinstance(found, Manifest):
        return found
    try:
        manifest = manifest_file(location, rel)
    except ArtifactRegistryError as exc:
        raise ArtifactRegistryError(
            f"{exc.what}: it may name the build at {location.url_for(output_path)}, which a "
            "registration freezes",
            f"{exc.fix}; restore or remove the file (nothing was cleared or written)",
            exc.step,
        ) from None
    if len(memo) < _MANIFESTS_KEPT:
        memo[rel] = manifest
    return manifest


_MANIFESTS_KEPT = 100_000
"""How many manifests a ``Location`` keeps read (a few KiB each)."""


def _holds_source(
    location: Location, output_path: str, adoption: ArtifactRecord, adopted_at: str
) -> bool:
    """Whether the source of ``adoption`` (the record stored at ``adopted_at``) lies in the
    build at ``output_path`` (is it, or inside it) or holds it, placed under the prefix as
    ``marin gc`` places an adopted source; never the adoption's own output (adopted in place)."""
    if adoption.source is None or output_path == adopted_at:
        return False
    inside = output_path.rstrip("/") + "/"
    return any(
        (rel + "/").startswith(inside) or inside.startswith(rel + "/")  # lies in it, or holds it
        for rel in relative_under(adoption.source, location.url)
    )


def _adopted_source(location: Location, output_path: str, record: ArtifactRecord) -> dict[str, str]:
    """The builds (output path -> build id) under the prefix that the adoption ``record``'s
    source lies in or holds: registering the adoption freezes them too, since rebuilding one
    in place would change the registered data."""
    if record.source is None:
        return {}
    found = adopted_builds(location, output_path, record.source)
    return {path: stored.build_id for path, stored in found.items()}


def _lineage(location: Location, output_path: str, record: ArtifactRecord) -> dict[str, str]:
    from marin.execution.store.registry_lineage import LineageGone, lineage

    try:
        return {
            **lineage(location, output_path, record),
            **_adopted_source(location, output_path, record),
        }
    except LineageGone as gone:
        raise ArtifactRegistryError(
            f"{gone}: a registered build is kept with everything it was made from, and that "
            "is gone already",
            f"rebuild it (marin run ... --force {record.name}), then register the new build",
            record.step_id,
        ) from None


def _hold_leases(
    location: Location, paths: list[str], reg_id: RegistryId, step_id: str
) -> contextlib.ExitStack:
    """The leases of ``paths``, taken in this (sorted) order and renewed until the stack
    closes, each waited for up to ``_LEASE_PATIENCE_S`` in all (another registration holds one
    for a moment).

    Raises:
        ArtifactAlreadyExistsError: ``reg_id`` was registered meanwhile.
        ArtifactRegistryError: a lease is still held once the patience ran out.
        StorageError: storage kept failing.
    """
    from marin.execution.store.lease import Heartbeat, Lease

    deadline = time.monotonic() + _LEASE_PATIENCE_S
    with contextlib.ExitStack() as held:
        for path in paths:
            lease = Lease(location, path)
            holder = lease.try_acquire()
            while holder is not None and time.monotonic() < deadline:
                if location.exists(location.path(reg_id.manifest_path)):
                    raise _taken(location, reg_id, step_id)
                time.sleep(0.2)
                holder = lease.try_acquire()
            if holder is not None:
                raise ArtifactRegistryError(
                    f"{location.url_for(path)} is being built or deleted (its lease is held by "
                    f"{holder.holder}): the build to register, or one it was made from, may "
                    "change or vanish",
                    "register it once that ends (marin show NAME@VERSION says whether it is built)",
                    step_id,
                )
            held.callback(lease.release)
            held.enter_context(Heartbeat(lease))
        return held.pop_all()
    raise AssertionError("unreachable")


def _built_record(location: Location, output_path: str) -> ArtifactRecord:
    """The record of the build at ``output_path``, which must have a build id."""
    record = read_record(location, output_path)
    if record is None:
        raise ArtifactNotFoundError(
            f"nothing is built at {location.url_for(output_path)}",
            "build the step first (marin run), then register it",
            None,
        )
    if not record.build_id:
        raise ArtifactRegistryError(
            f"the record of {record.step_id} predates build ids: gc could not protect its inputs",
            f"rebuild it (marin run ... --force {record.name}), then register it",
            record.step_id,
        )
    return record


def _taken(location: Location, reg_id: RegistryId, step_id: str) -> ArtifactAlreadyExistsError:
    existing = _existing(location, reg_id)
    error = ArtifactAlreadyExistsError(
        f"{reg_id} is registered already"
        + (f" (to {existing.step}, build {existing.build_id})" if existing else ""),
        "a registration is never replaced: register this build under a new tag",
        step_id,
    )
    error.existing = existing
    return error


def _existing(location: Location, reg_id: RegistryId) -> Manifest | None:
    with contextlib.suppress(ArtifactRegistryError):
        return lookup(location, reg_id)
    return None


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="milliseconds")


def lookup(location: Location, reg_id: RegistryId) -> Manifest:
    """The manifest of ``reg_id``: one read.

    Raises:
        ArtifactNotFoundError: no manifest for ``reg_id`` under the prefix.
        ArtifactRegistryError: the manifest is there but cannot be trusted (corrupt, another
            id's, or a record that is not the build it names).
        StorageError: storage kept failing.
    """
    path = location.path(reg_id.manifest_path)
    try:
        raw = _read_once(location, path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise ArtifactNotFoundError(
            f"{reg_id} is not registered under {location.url}",
            f"register a build first (marin register NAME@VERSION --id {reg_id}), or give "
            "the prefix it was registered under",
            None,
        ) from None
    try:
        return Manifest.from_bytes(raw, reg_id)
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ArtifactRegistryError(
            f"the manifest of {reg_id} at {location.url_for(reg_id.manifest_path)} cannot be "
            f"trusted ({exc})",
            "look at the file: manifests are written once by marin register and never changed",
            None,
        ) from None


def resolve(location: Location, reg_id: RegistryId) -> Manifest:
    """The manifest of ``reg_id`` (``lookup``), checked against the record stored at its path
    (a second read): the build it names must still be the one stored there. A registered build
    is frozen, but one deleted by hand and built again, or replaced by hand, is not that build;
    a record torn or deleted says nothing (the manifest holds its copy).

    Raises:
        ArtifactNotFoundError: no manifest for ``reg_id`` under the prefix.
        ArtifactRegistryError: the manifest cannot be trusted, or the record at its path is
            another build's (the registered build is gone).
        StorageError: storage kept failing.
    """
    manifest = lookup(location, reg_id)
    try:  # one request, as the manifest's (S3 and GCS: a single GET)
        raw = _read_once(location, location.path(record_path(manifest.output_path)))
        other = ArtifactRecord.from_json(raw.decode())
    except (FileNotFoundError, NotADirectoryError, ValueError, TypeError, UnicodeDecodeError):
        return manifest  # no record, or a torn one: the manifest holds its copy
    if other.build_id == manifest.build_id:
        return manifest
    raise ArtifactRegistryError(
        f"{reg_id} names {manifest.step} build {manifest.build_id}, which is no longer stored: "
        f"{location.url_for(manifest.output_path)} holds {other.step_id} build "
        f"{other.build_id or '(no build id)'} (the registered build was deleted or replaced "
        "by hand)",
        "the registered data is gone: register the build stored there now under a new tag "
        "if it is the one you want, or rebuild the registered one under a new version",
        None,
    )


def _read_once(location: Location, path: str) -> bytes:
    """A manifest's bytes in one request: S3 and GCS get a single GET (fsspec's ``cat_file``
    asks for the object's size first)."""
    if location.is_local or location.is_memory:
        return location.read_file(path)
    from marin.execution.store.lease.backends import lease_store
    from marin.execution.store.lease.store import ConditionalObjectStore

    store = lease_store(location)
    if not isinstance(store, ConditionalObjectStore):
        return location.read_file(path)
    found = store.read(path)
    if found is None:
        raise FileNotFoundError(path)
    return bytes(found[0])


def list_manifests(location: Location) -> tuple[list[Manifest], list[str]]:
    """Every manifest under the prefix, and a sentence for each file that is not one.

    Raises:
        StorageError: storage kept failing (``SymlinkError``: a link in the registry folder).
    """
    found: list[Manifest] = []
    problems: list[str] = []
    for rel in manifest_files(location):
        try:
            found.append(manifest_file(location, rel))
        except ArtifactRegistryError as exc:
            problems.append(exc.what)
    return found, problems


def manifest_files(location: Location) -> list[str]:
    """The registry's files (relative to its folder), sorted: one listing.

    Raises:
        StorageError: storage kept failing (``SymlinkError``: a link in the registry folder).
    """
    root = location.path(REGISTRY_FOLDER)
    found = (path[len(root.rstrip("/")) + 1 :] for path in location.list_tree(root))
    # A temporary file is a registration that crashed before its link: never a manifest.
    return sorted(rel for rel in found if ".json.tmp-" not in rel)


def manifest_file(location: Location, rel: str) -> Manifest:
    """The manifest at ``rel`` in the registry's folder (``manifest_files``).

    Raises:
        ArtifactRegistryError: not a manifest's name, or a manifest that cannot be trusted.
        StorageError: storage kept failing.
    """
    try:
        reg_id = RegistryId.parse(rel.removesuffix(".json"))
    except InvalidArtifactIdError:
        raise ArtifactRegistryError(
            f"{REGISTRY_FOLDER}/{rel} is not a manifest's name",
            "look at the file: marin register names each manifest ns/name/tag.json",
        ) from None
    return lookup(location, reg_id)


def create_once(location: Location, relative: str, data: bytes) -> bool:
    """Write ``data`` at ``relative`` only if nothing is there; False if something is.

    Raises:
        StorageError: the backend has no conditional create (the registry cannot be
            append-only there), or storage kept failing.
    """
    path = location.path(relative)
    if location.is_local:
        return _link_once(location, path, data)
    from marin.execution.store.lease.backends import lease_store

    store = lease_store(location)
    if not store.atomic:
        raise StorageError(
            f"{location.url} has no conditional create: a registration could overwrite another",
            "keep the registry on local disk, memory://, s3:// or gs://",
        )
    return store.create(path, data)


def _link_once(location: Location, path: str, data: bytes) -> bool:
    """Local disk: a complete temporary file, hard-linked to ``path`` (``link`` never replaces
    an existing name, and never follows a link there)."""
    folder = os.path.dirname(path)
    if location.check_no_links(folder) is False:
        os.makedirs(folder, exist_ok=True)
        location.check_no_links(folder)
    tmp = f"{path}.tmp-{new_id()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable():
                os.fsync(fd)
        finally:
            os.close(fd)
        try:
            with_retries(lambda: os.link(tmp, path), f"create {path}")
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def registered_by() -> str:
    """``user@host`` of this process: ``$MARIN_USER``, else the OS user."""
    import getpass
    import socket

    try:
        user = os.environ.get("MARIN_USER") or getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def manifest_fields(manifest: Manifest) -> dict[str, Any]:
    """The manifest as ``marin register --json`` prints it."""
    return {
        "id": manifest.id,
        "step": manifest.step,
        "output_path": manifest.output_path,
        "build_id": manifest.build_id,
        "registered_at": manifest.registered_at,
        "registered_by": manifest.registered_by,
    }
