"""What is at a step's output path before a build, and clearing it: only what Marin provably wrote
there, literally (never a glob), never another step's metadata, never an adopted step's data
(``refuse_clearing_adopted``: not even once the step is built instead), never a registered
build (``refuse_frozen``). ``build_step`` asks before it takes the lease
(``output_left_by_marin``), and its lease holder clears (``earlier_attempt``,
``check_clearable``, ``clear_output``).

Each rule is one function that returns its refusal (``inside_another``, ``adopted_data``,
``odd_metadata``, ``output_not_marins``, ``frozen_build``, ``metadata_inside``): a build raises
it (the ``refuse_*`` forms, or the listing and reads they stand for), and ``marin plan`` shows it
before any run (``refusal_before_writing``, which asks them as a build does, through a plan's
memoized listings).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from marin.execution.errors import (
    AdoptedDataError,
    MarinError,
    NotAFolderError,
    NotRegularFileError,
    RegisteredBuildFrozenError,
    StorageError,
    SymlinkError,
)
from marin.execution.names import METADATA_SUFFIX
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.store.lease import Lease, read_lease
from marin.execution.store.location import Location, with_retries
from marin.execution.store.placement import overlaps_output
from marin.execution.store.records import (
    ArtifactRecord,
    adoption_status,
    load_record,
    metadata_dir,
    metadata_files,
    read_record,
    read_status_file,
    record_disowns_output,
    unread_record_names,
)
from marin.execution.store.registry import REGISTRY_FOLDER, frozen
from marin.execution.store.step_folder import (
    ADOPTED_FILE,
    RECORD_FILE,
    REGISTERED_FILE,
    STATUS_FILE,
    attempt_not_shown,
    folder_entries,
    has_adoption_mark,
    lease_path,
    names_adoption,
    registered_path,
)
from marin.execution.vocabulary import Leftover

log = logging.getLogger("marin")

Exists = Callable[[str], bool]
"""Whether anything is at a path below the prefix (relative to it): ``exists_in`` for a build,
a plan's memoized listings (``ListedFolders.exists``) for its advisory look."""


def exists_in(location: Location) -> Exists:
    """``location.exists`` for paths relative to its prefix: a build's own look."""
    return lambda relative: location.exists(location.path(relative))


def refusal_before_writing(
    location: Location,
    spec: StepSpec,
    record: ArtifactRecord | None,
    status: Mapping[str, Any] | None,
    exists: Exists,
) -> MarinError | None:
    """What a build of ``spec`` would be refused with, having written nothing, given what a
    plan read (``record``: its committed record; ``status``: its status, read without one);
    None when no rule of this module refuses it. The rules, asked in ``build_step``'s order:
    before the lease, inside another step's output and adopted data (``_build``), then a
    file where the step folder or a folder above the output must be (``folder_in_the_way``),
    a step-folder file that is not a regular file (``odd_metadata``: its listing, or the read
    of the lease) and data Marin never wrote (``output_left_by_marin``); under the lease, a
    registered build (or an unreadable freeze mark), adopted data with what an earlier
    attempt left, and another step's metadata in the output (``_build_holding``). Read only:
    ``marin plan`` shows the refusal a run would raise.

    Raises:
        OSError: a read failed.
        ArtifactRegistryError: a manifest cannot be trusted (as a build would raise).
    """
    refusal: MarinError | None = inside_another(location, spec, exists) or adopted_data(
        location, spec, record, False, exists
    )
    if refusal is not None:
        return refusal
    refusal = folder_in_the_way(location, spec) or odd_metadata(location, spec, exists)
    if refusal is not None:
        return refusal
    seen, refusal = output_not_marins(location, spec, exists)
    if refusal is not None:
        return _or_frozen(location, spec, refusal)
    leftover = record is not None or status is not None or seen
    leftover = leftover or _metadata_left(location, spec, exists)
    return (
        frozen_build(location, spec, record, leftover)
        or adopted_data(location, spec, record, leftover, exists)
        or (metadata_inside(location, spec) if leftover else None)
    )


def odd_metadata(location: Location, spec: StepSpec, exists: Exists) -> StorageError | None:
    """Why a build fails before writing: a file of the step folder that Marin reads, replaces
    or deletes is not a regular file (a folder at ``log.txt``, a FIFO at ``lease.json``), or is
    a link. A build meets it in its listing of the folder (``metadata_files``, before it clears
    anything) or in its read of the lease; a plan reads neither file unless asked here. Local
    disk only: an object store has no folders or FIFOs at a file's name."""
    if not location.is_local or not exists(metadata_dir(spec.output_path)):
        return None
    try:
        metadata_files(location, spec.output_path)
    except (NotRegularFileError, SymlinkError) as exc:
        return exc
    return None


def folder_in_the_way(location: Location, spec: StepSpec) -> NotAFolderError | None:
    """Why a build fails before writing: a file (or a FIFO, a device) is where it must make a
    folder, its step folder ``<output>.marin`` or a folder above the output (``rt``, for step
    ``rt/s``); its lease, the first thing it writes, could only fail with ``NotADirectoryError``.
    A build meets it in its listing of the step folder (``output_not_marins``, when something
    is at the output) or at its lease (``_lease_and_build``): no look of its own, so a first
    build pays nothing for it; a plan asks it of each step it builds (one ``lstat``).

    Local disk and ``memory://`` (whose own writes refuse a key above them; a build asks there
    before its lease, in a few dict lookups, since Marin's writes go straight into the store):
    on an object store a folder is only a prefix of keys, so an object at ``.../v1.marin`` or
    ``rt`` is in nobody's way: the keys below it are written and read all the same."""
    found = location.non_folder_on_the_way(metadata_dir(spec.output_path))
    if found is None:
        return None
    url = location.url_for(found)
    if found == metadata_dir(spec.output_path):
        where = f"{spec.step_id} keeps its metadata (record, status, lease) in a folder there"
    else:
        out = location.url_for(spec.output_path)
        where = f"{spec.step_id}'s output {out} and its metadata folder lie below it"
    return NotAFolderError(
        f"{url} is not a folder: {where}",
        "move it away (or delete it yourself), then run again; Marin never deletes a file it "
        "did not write",
        spec.step_id,
    )


def _or_frozen(location: Location, spec: StepSpec, refusal: StorageError) -> MarinError:
    """``refusal`` of data at the output that Marin did not provably write, or, when that data
    is a build a manifest names (its record and files lost by hand), that build's refusal, or
    when an adoption's mark says so, the adoption's (its record torn or lost)."""
    if isinstance(refusal, NotAFolderError):
        return refusal  # no step folder there: no freeze mark to read
    return (
        frozen_build(location, spec, None, True)
        or adopted_data(location, spec, None, True, exists_in(location))
        or refusal
    )


def _metadata_left(location: Location, spec: StepSpec, exists: Exists) -> bool:
    """Whether a record, status or lease is beside the output, for a plan that read neither a
    record nor a status there (a torn record, a lease alone): what ``earlier_attempt`` counts
    as an earlier attempt's (a lease is taken over, or its holder leaves a record or status).
    """
    if not exists(metadata_dir(spec.output_path)):
        return False  # a new step's: no read
    lease = location.has_file(location.path(lease_path(spec.output_path)))
    present = metadata_files(location, spec.output_path)
    return lease or bool(present) or freeze_mark_beside(location, spec, present)


def freeze_mark_beside(location: Location, spec: StepSpec, present: set[str]) -> bool:
    """Whether ``marin register``'s freeze mark (``registered.json``) is in the step folder,
    asked when no record or status there (``present``, from ``metadata_files``) says an
    earlier attempt worked: a registered build whose record was lost, and whose artifact is
    only its returned value (no output path: nothing else shows it), leaves only its mark and
    its log. On local disk the listing ``present`` came from says so at no cost; elsewhere it
    is one more lookup (a dict lookup on ``memory://``), made only when neither a record nor a
    status is there."""
    if location.is_local:
        return REGISTERED_FILE in present
    if RECORD_FILE in present or STATUS_FILE in present:
        return False  # already a leftover
    return location.has_file(location.path(registered_path(spec.output_path)))


def output_left_by_marin(location: Location, spec: StepSpec) -> bool:
    """Whether something is at the output path; fail, having written nothing, if it is not
    provably Marin's (``output_not_marins``).

    Raises:
        RegisteredBuildFrozenError: what is there, unproven, is a build a manifest names.
        ArtifactRegistryError: a manifest cannot be trusted (it may name this build).
        StorageError: something is there that Marin did not write (``NotAFolderError``: a
            file where its step folder must be).
    """
    if location.is_memory:  # Marin's writes there skip the parent checks fsspec's make
        in_the_way = folder_in_the_way(location, spec)
        if in_the_way is not None:
            raise in_the_way
    seen, refusal = output_not_marins(location, spec, exists_in(location))
    if refusal is not None:
        # A registered build whose record and files were lost by hand is named as such.
        raise _or_frozen(location, spec, refusal)
    return seen


def output_not_marins(
    location: Location, spec: StepSpec, exists: Exists
) -> tuple[bool, StorageError | None]:
    """Whether something is at the output path, and the refusal when it is not provably
    Marin's (None: nothing there, or Marin's).

    An output path may be cleared only when Marin provably wrote there: its metadata folder
    beside it (``<output>.marin/``) holds a file an attempt leaves (a record, a status, a
    lease, a log: ``ATTEMPT_FILES``), never just the lease's guard, an empty ``checkpoints/``
    or nothing, and none of its files names another output (``marin gc`` asks the same,
    ``attempt_not_shown``). Asked before the lease is
    taken (which makes that folder and the guard), so that a held or taken-over lease is
    itself that proof (``earlier_attempt``): any attempt that held it had passed this check.
    The same on every backend, ``memory://`` too (where ``exists`` is one lookup).
    """
    if spec.source is not None:
        return False, None  # an adopted step writes nothing there (see clear_output)
    if not exists(spec.output_path):
        return False, None  # the common first build: nothing there
    folder = metadata_dir(spec.output_path).rsplit("/", 1)[-1]
    why = f"no {folder} folder beside it"
    if exists(metadata_dir(spec.output_path)):
        not_a_folder = folder_in_the_way(location, spec)  # a file there lists as an empty folder
        if not_a_folder is not None:
            return True, not_a_folder
        why = _proves_nothing(location, spec)
        if not why:
            return True, None
    inside = metadata_inside(location, spec)  # Marin wrote what is there: another step's build
    if inside is not None:
        return True, inside
    if why.startswith(UNREAD_RECORD):
        return True, StorageError(
            f"output path {location.url_for(spec.output_path)} already exists {why}",
            "run it with the Marin that wrote that record, or move the data away (or delete it "
            "yourself) and run again; Marin never deletes data it cannot prove is this build",
            spec.step_id,
        )
    return True, StorageError(
        f"output path {location.url_for(spec.output_path)} already exists and was not "
        f"written by Marin ({why})",
        "move it away (or delete it yourself), then run again; Marin never deletes "
        f"data it did not write (to serve that data as {spec.step_id}, adopt it where it is: "
        f"ArtifactStep.adopt({spec.name!r}, {spec.version!r}, {spec.output_path!r}))",
        spec.step_id,
    )


UNREAD_RECORD = "beside a record"
"""How ``_proves_nothing`` starts the reason for a record naming this build it cannot read."""


def _proves_nothing(location: Location, spec: StepSpec) -> str:
    """Why the metadata folder beside ``spec``'s output proves nothing about what lies there,
    or "" when it shows a Marin attempt worked there. A record read as this step's proves it;
    another step's, whole or damaged (``unread_record_names``), disproves it; one this Marin
    cannot read that names this build, or nothing, proves nothing, as ``marin gc`` reads it
    (a newer Marin's on a shared bucket, a damaged or torn one). Else the one rule
    (``attempt_not_shown``: a status, lease or ``job.json`` naming this output, none naming
    another), and no adoption's lease or status (``adoption_status``): an adoption never
    writes its output path, whether it failed, was killed holding its lease, or was being
    deleted by ``marin gc``."""
    output_path = spec.output_path
    folder = metadata_dir(output_path).rsplit("/", 1)[-1]
    step = (spec.name, spec.version)
    found = load_record(location, output_path, step=step)
    if isinstance(found, ArtifactRecord):
        return record_disowns_output(location, output_path, found)
    # A record this Marin cannot read proves nothing, even naming this build (a newer Marin's
    # on a shared bucket, or damaged), as ``marin gc`` reads it: the other files may prove it.
    named = unread_record_names(location, output_path, step) if found is None else False
    if named is False:
        return (
            f"its {folder} folder holds a record of another step or output (a copy, whole, "
            "damaged or of a newer Marin): no proof that Marin wrote this one"
        )
    entries = folder_entries(location, location.path(metadata_dir(output_path)))
    names = (name for name, _ in entries)
    why = attempt_not_shown(location, output_path, names, f"its {folder} folder")
    if why:
        # The record once more, last: a runner building the step commits its record before it
        # releases its lease, so a lease gone when read above means that record is there now.
        committed = load_record(location, output_path, step=step)
        if isinstance(committed, ArtifactRecord):
            return record_disowns_output(location, output_path, committed)
        if named:  # red team r23-4: not "not written by Marin", nor advice to adopt it
            return (
                f"{UNREAD_RECORD} naming this build that this Marin cannot read (a newer "
                "Marin's, or damaged), and nothing else proves the data is this build"
            )
        return why
    lease = read_lease(location, output_path)
    if adoption_status(read_status_file(location, output_path)) or (
        lease is not None and names_adoption(lease.raw)
    ):
        return f"{folder} holds only an adoption's lease or status (an adoption never writes there)"
    return ""


def refuse_clearing_adopted(
    location: Location, spec: StepSpec, previous: ArtifactRecord | None, leftover: bool
) -> None:
    """Refuse, before anything is written, to build over an adopted step's output path that
    holds data (``adopted_data``).

    Raises:
        AdoptedDataError: the step's current record is an adoption, or it has none and the
            adoption mark is there, and its output path holds data.
    """
    refusal = adopted_data(location, spec, previous, leftover, exists_in(location))
    if refusal is not None:
        raise refusal


def adopted_data(
    location: Location,
    spec: StepSpec,
    previous: ArtifactRecord | None,
    leftover: bool,
    exists: Exists,
) -> AdoptedDataError | None:
    """Why a build must not clear the output path, when it holds an adopted step's data
    (adopted in place, or put there since): an adoption writes only its record, so whatever
    is there is not Marin's to clear. None when the path is empty (the data is elsewhere), or
    for another adoption (it clears nothing). With no record (``previous`` None: torn or
    deleted) and something left there (``leftover``), the mark an adoption writes before its
    record (``adopted.json``) refuses too."""
    if spec.source is not None:
        return None
    adopted = previous is not None and previous.source is not None
    # A record that is torn or gone (None) says nothing: the mark an adoption wrote before
    # its record does. Beside a build's record, a mark is an older adoption's, moot.
    if not adopted and not (
        previous is None and leftover and has_adoption_mark(location, spec.output_path)
    ):
        return None
    if not exists(spec.output_path):
        return None
    out = location.url_for(spec.output_path)
    if previous is None or previous.source is None:
        mark = f"{metadata_dir(spec.output_path)}/{ADOPTED_FILE}"
        held = f"data an adoption left there, never Marin's ({mark} says so)"
    elif overlaps_output(location, spec.output_path, previous.source):
        held = f"data it adopted in place (its record's source is {previous.source})"
    else:
        held = f"data put there since it was adopted from {previous.source}"
    return AdoptedDataError(
        f"{spec.step_id} is now built, but its output path {out} holds {held}; building "
        "would delete that data, which Marin never wrote",
        f"bump {spec.name}'s version (the data stays where it is), or move the data away "
        "first (adopt it from its new place if you still need it)",
        spec.step_id,
    )


def earlier_attempt(present: set[str], lease: Lease, output_seen: bool) -> Leftover | None:
    """What an earlier attempt left at the output path: a build, debris, or nothing (None).

    Asked by the lease holder, from the metadata files ``present`` beside the output. A record
    means an earlier build; a status file (a FAILED attempt, or one of an older version), a
    lease taken over from an attempt that died, or an output ``output_left_by_marin`` saw
    before the lease means debris may be there. With none of these, nothing is cleared.
    """
    if RECORD_FILE in present:
        return Leftover.BUILD
    if STATUS_FILE in present or lease.took_over or output_seen:
        return Leftover.DEBRIS
    return None


def refuse_frozen(
    location: Location, spec: StepSpec, committed: ArtifactRecord | None, leftover: bool
) -> None:
    """Refuse, before anything is cleared or written, to replace a registered build in place
    (``frozen_build``). Asked by the lease holder, which ``marin register`` also takes.

    Raises:
        RegisteredBuildFrozenError: the stored build is registered (final: never retried).
        ArtifactRegistryError: a manifest the mark lists cannot be trusted.
        StorageError: storage kept failing.
    """
    refusal = frozen_build(location, spec, committed, leftover)
    if refusal is not None:
        raise refusal


def frozen_build(
    location: Location, spec: StepSpec, committed: ArtifactRecord | None, leftover: bool
) -> RegisteredBuildFrozenError | None:
    """Why the ``committed`` build may not be replaced in place: ``marin register`` released
    it (a manifest names it; ``registry.frozen`` asks its freeze mark, then the registry), or
    its freeze mark is there but cannot be read; None when it may. Free, with no read, when
    nothing is there. With no readable record (``committed`` None: torn or deleted) but
    something left at the output (``leftover``: ``earlier_attempt`` found it), a manifest
    naming this step's output still freezes the build stored there.

    Raises:
        ArtifactRegistryError: a manifest cannot be trusted (it may name this build).
        StorageError: storage kept failing.
    """
    if not (committed is not None or leftover):
        return None  # a first build: nothing to freeze, and no read
    found = frozen(location, spec.output_path, committed, spec.step_id, scan=not spec.mutable)
    if not found:
        return None
    out = location.url_for(spec.output_path)
    build = f"build {committed.build_id}" if committed and committed.build_id else "build"
    damaged = "" if committed is not None else " (its record is unreadable or gone)"
    fix = (
        "a registered build is never rebuilt in place: bump the version (or register a new "
        "build under a new tag)"
    )
    if found.unreadable_mark is not None:
        mark = found.unreadable_mark
        damaged += f" has a freeze mark that cannot be read ({mark.path}: {mark.why}) and"
        if not found.ids:
            return RegisteredBuildFrozenError(
                f"the {build} at {out}{damaged} may be registered: this run would rebuild it "
                "in place, and a damaged mark is never read as 'not registered'; nothing was "
                "cleared or written",
                f"no manifest under {location.url_for(REGISTRY_FOLDER)} names this build now: "
                f"if it was never registered, delete {mark.path} and run again; else bump "
                "the version",
                spec.step_id,
            )
    return RegisteredBuildFrozenError(
        f"the {build} at {out}{damaged} is registered as {', '.join(found.ids)}: this run "
        "would rebuild it in place (--force, a drift rebuild, a rebuilt input or a lost "
        "record); nothing was cleared or written",
        fix,
        spec.step_id,
    )


def check_clearable(location: Location, spec: StepSpec) -> None:
    """Refuse, before anything is written, to clear a folder holding another step's metadata
    (``metadata_inside``).

    Raises:
        StorageError: the output path holds another step's metadata folder.
    """
    refusal = metadata_inside(location, spec)
    if refusal is not None:
        raise refusal


def metadata_inside(location: Location, spec: StepSpec) -> StorageError | None:
    """Why the output path may not be cleared: it holds another step's metadata folder (one
    listing of everything under it); None when it may."""
    if spec.source is not None:
        return None  # nothing is cleared (clear_output), and its data may be large
    out = location.path(spec.output_path)
    foreign = _foreign_metadata(out, location.list_tree(out))
    if foreign is None:
        return None
    return StorageError(
        f"output path {location.url_for(spec.output_path)} holds another step's "
        f"{_nested_build(location, spec.output_path, foreign)}; clearing it would delete that "
        "step's artifact",
        "rename one of the two steps so that neither output is inside the other",
        spec.step_id,
    )


def _nested_build(location: Location, output_path: str, found: str) -> str:
    """``build <step> (its metadata <folder>)`` for the metadata file ``found`` (a listing's
    path) inside ``output_path``; ``metadata <folder>`` when no record there names its step."""
    parts = found[len(location.path(output_path)) :].strip("/").split("/")
    depth = next(i for i, part in enumerate(parts) if part.endswith(METADATA_SUFFIX))
    folder = "/".join([output_path, *parts[: depth + 1]])
    try:
        record = read_record(location, folder[: -len(METADATA_SUFFIX)])
    except (MarinError, OSError):  # a refusal all the same: it names the folder
        record = None
    if record is None:
        return f"metadata ({folder})"
    return f"build {record.name}@{record.version} (its metadata {folder})"


def refuse_inside_another(location: Location, spec: StepSpec) -> None:
    """Refuse, before anything is written, to build inside another step's output
    (``inside_another``).

    Raises:
        StorageError: the output lies inside another step's output.
    """
    refusal = inside_another(location, spec, exists_in(location))
    if refusal is not None:
        raise refusal


def inside_another(location: Location, spec: StepSpec, exists: Exists) -> StorageError | None:
    """Why the step may not be built: its output lies inside another step's output (a folder
    ``A`` above the output with ``A.marin`` beside it), so the build would change that step's
    committed artifact, and deleting that step (gc) would delete this build; None when it does
    not. ``lower()`` refuses this within one graph; this catches two pipelines on one prefix."""
    # An adopted step's build writes only its record, but that record (beside its output
    # path) would still lie inside the other step's artifact: refused the same way.
    parts = spec.output_path.split("/")
    for end in range(1, len(parts)):
        outer = "/".join(parts[:end])
        if exists(metadata_dir(outer)):
            return StorageError(
                f"output path {location.url_for(spec.output_path)} lies inside another "
                f"step's output {location.url_for(outer)} (its metadata {outer}"
                f"{METADATA_SUFFIX} is there); building it would change that step's artifact",
                "rename one of the two steps so that neither output is inside the other",
                spec.step_id,
            )
    return None


def clear_output(location: Location, spec: StepSpec, built: bool) -> None:
    """Remove the output path, literally (never as a glob); ``built`` picks the message."""
    if spec.source is not None:
        # An adopted step's build writes only its record: its output path may be the adopted
        # data itself (adopted in place), or hold or lie inside it. Never Marin's to delete.
        return
    out = location.path(spec.output_path)
    if location.exists(out):
        if built:
            log.info("clear %s: replacing the previous build at %s", spec.step_id, out)
        else:
            log.info("clear %s: removing debris from an earlier attempt at %s", spec.step_id, out)
        with_retries(lambda: location.remove_tree(out), f"clear {out}")


def _foreign_metadata(out: str, files: list[str]) -> str | None:
    """The first file under ``out`` that sits in a ``*.marin`` metadata folder, if any."""
    base = out.rstrip("/") + "/"
    for file in files:
        relative = file[len(base) :] if file.startswith(base) else ""
        if any(part.endswith(METADATA_SUFFIX) for part in relative.split("/")[:-1]):
            return file
    return None
