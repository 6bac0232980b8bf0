"""The record and status files beside an output.

For an output at ``<prefix>/<name>/<version>`` the metadata lives in the sibling folder
``<prefix>/<name>/<version>.marin/``: ``record.json`` (the commit point), ``status.json``,
``lease.json`` and ``log.txt``. Keeping it beside rather than inside the output lets ``fn`` write
a single file at its output path, and lets a rebuild clear the output without touching the lease.
The folder's files are named in ``step_folder``; the record and the status are parsed here.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import logging
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marin.execution.atomic_file import TMP_MARK
from marin.execution.digest.code import CodeDigest
from marin.execution.digest.output import OutputDigest, is_output_digest
from marin.execution.errors import ConfigError
from marin.execution.store.location import (
    Location,
    durable,
    not_a_regular_file,
    symlink_refused,
)
from marin.execution.store.metadata_io import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from marin.execution.store.metadata_io import parse_json as parse_json
from marin.execution.store.metadata_io import too_deep
from marin.execution.store.metadata_io import write_atomic as write_atomic
from marin.execution.store.step_folder import ADOPTION as ADOPTION
from marin.execution.store.step_folder import (
    CANCEL_FILE,
    OWNER_FIELD,
    PLAIN_FILES,
    RECORD_FILE,
    REGISTERED_FILE,
    STATUS_FILE,
)
from marin.execution.store.step_folder import lease_path as lease_path
from marin.execution.store.step_folder import log_path as log_path
from marin.execution.store.step_folder import metadata_dir as metadata_dir
from marin.execution.store.step_folder import record_path as record_path
from marin.execution.store.step_folder import status_path as status_path
from marin.execution.vocabulary import AttemptState

log = logging.getLogger("marin")

RECORD_SCHEMA = 1
RUNNING, SUCCESS, FAILED = AttemptState.RUNNING, AttemptState.SUCCESS, AttemptState.FAILED


@dataclass(frozen=True)
class ArtifactRecord:
    """The commit point of one build: written last, atomically, beside the output; its presence
    is the SUCCESS status. Stored JSON is untrusted: ``from_json`` checks every field."""

    name: str
    version: str
    fingerprint: str
    fingerprint_payload: str
    config: Any
    """The run-time config: the same as the fingerprinted one, with real paths."""
    dep_paths: dict[str, str]
    output_path: str
    result: Any
    provenance: dict[str, Any]
    started_at: str
    finished_at: str
    duration_s: float
    artifact_type: str = "artifact"
    schema: int = RECORD_SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)
    build_id: str = ""
    """Unique per commit: a dependent records the build it consumed (``inputs``). Empty in records
    written before lineage existed."""
    inputs: dict[str, str] = field(default_factory=dict)
    """Each dependency's ``step_id`` -> the ``build_id`` of the build this one was made from."""
    code: CodeDigest = field(default_factory=lambda: CodeDigest.from_record(None))
    """The code digest of the step's function when it was built (unknown in older records)."""
    output: OutputDigest = field(default_factory=lambda: OutputDigest.from_record(None))
    """The digest of the output tree this build committed (unknown in older records)."""
    input_digests: dict[str, str] = field(default_factory=dict)
    """Each dependency's ``step_id`` -> the output digest of the build this one consumed (only
    the known ones): a rebuilt dependency with the same digest leaves this build current."""
    replaced: dict[str, str] = field(default_factory=dict)
    """The ``build_id`` of the build this one replaced at its path -> that build's output
    digest, when known: a dependent that recorded no digest for it can still be compared."""
    source: str | None = None
    """An adopted step's data, resolved (``gs://b/data``, ``/data/raw``): what its consumers
    read (Marin's ``record.source``). None for a step that built its own output; not written
    then, so such records keep their bytes."""

    @property
    def step_id(self) -> str:
        return f"{self.name}@{self.version}"

    def to_json(self, indent: int | None = None) -> str:
        """Sorted-key JSON; compact by default, because ``indent`` makes ``json`` fall back to its
        pure-Python encoder, which was the largest single cost of a commit. ``marin show --json``
        pretty-prints."""
        # A shallow field dict: the values are already plain JSON data (asdict deep-copies them),
        # except the two digests, which say how they are stored. Every value is a canonical
        # form (``to_canonical`` builds new trees), which has no cycles: the encoder's circular
        # reference check (a third of its time on a record) has nothing to find.
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        fields["code"] = self.code.to_record()
        fields["output"] = self.output.to_record()
        if self.source is None:
            del fields["source"]
        text = json.dumps(
            fields, sort_keys=True, indent=indent, ensure_ascii=False, check_circular=False
        )
        return text + "\n"

    @classmethod
    def from_json(cls, text: str) -> ArtifactRecord:
        """Parse and type-check a stored record: untrusted bytes (written by another version,
        torn, or crafted) must not crash ``run``, ``plan``, ``show`` or ``ls`` later.

        Raises:
            ValueError: not a schema-1 record: malformed JSON, a field missing or of the wrong
                type, nesting deeper than :data:`MAX_JSON_DEPTH` (``load_record``: not built).
        """
        data = parse_json(text)
        if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
            raise ValueError(f"not a schema-{RECORD_SCHEMA} record")
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in data.items() if k in known}
        for name, kind in _FIELD_TYPES.items():
            if name not in fields:
                if name in _OPTIONAL_FIELDS:
                    continue
                raise ValueError(f"field {name!r} is missing")
            value = fields[name]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"field {name!r} is a {type(value).__name__}")
        if not all(
            isinstance(k, str) and isinstance(v, str) for k, v in fields["dep_paths"].items()
        ):
            raise ValueError("field 'dep_paths' is not a mapping of strings")
        inputs = fields.get("inputs", {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in inputs.items()):
            raise ValueError("field 'inputs' is not a mapping of strings")
        provenance = fields["provenance"]
        for key, kind in _PROVENANCE_TYPES.items():
            value = provenance.get(key)
            # A bool is an int to isinstance: a pid of true is as wrong as a git_dirty of 1.
            if value is not None and (
                isinstance(value, bool) != (kind is bool) or not isinstance(value, kind)
            ):
                raise ValueError(f"field 'provenance.{key}' is a {type(value).__name__}")
        argv = provenance.get("argv", [])  # present, it is a list (``show`` joins it)
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("field 'provenance.argv' is not a list of strings")
        try:
            finite = math.isfinite(fields["duration_s"])
        except OverflowError:  # an integer too large for a float
            finite = False
        if not finite:
            raise ValueError("field 'duration_s' is not a finite number")
        # The one string field read as JSON again (``explain_drift``): it gets the same guards
        # as the record's own text, so a document nested inside it can't crash a plan either.
        if not isinstance(parse_json(fields["fingerprint_payload"]), dict):
            raise ValueError("field 'fingerprint_payload' is not a JSON object")
        # The cache's fields (issue 25) only ever allow skipping work: a corrupt one loads as
        # unknown (no code drift reported, no early cutoff), and the record stays usable.
        fields["code"] = CodeDigest.from_record(fields.get("code"))
        fields["output"] = OutputDigest.from_record(fields.get("output"))
        fields["input_digests"] = _digest_map(fields.get("input_digests"))
        fields["replaced"] = _digest_map(fields.get("replaced"), limit=1)
        if not isinstance(fields.get("source"), str | None):
            raise ValueError(f"field 'source' is a {type(fields['source']).__name__}")
        return cls(**fields)

    def _pinned_at(self, output_path: str) -> bool:
        """A pinned step's record sits at its pin, not at ``name/version``: its payload says so.
        (Parsed only on this rare path; ``from_json`` checked it is a bounded JSON object.)"""
        try:
            payload = json.loads(self.fingerprint_payload)
        except ValueError:
            return False
        pin = payload.get("pin") if isinstance(payload, dict) else None
        # An absolute pin is placed under the prefix by the run (``plan/scope.place_pins``).
        return isinstance(pin, str) and (pin == output_path or pin.endswith("/" + output_path))

    def owner_mismatch(self, output_path: str, step: tuple[str, str] | None = None) -> str | None:
        """Why this record is not the record of the step at ``output_path`` (``name/version``,
        relative to the prefix), or None when it is.

        ``step``: the ``(name, version)`` of the step that reads it, when the caller knows the
        step. Its record must name exactly that step: a step pinned onto another step's output
        (``pin="a/v1"``, say from another pipeline) never takes ``a@v1``'s record for its own.

        A record names its step and its output; one copied or moved beside another step's
        output (a user "renaming" a step by copying folders) names the step it was built for.
        The output path is compared below the prefix only, so a prefix moved or copied as a
        whole (or reached through another spelling, such as a link) keeps its records. With no
        name in ``output_path`` (``marin show <output path>`` opens the output's parent folder,
        not knowing the prefix) only the version and the output path's tail are compared.
        """
        # A user-scope output (``users/<user>/<name>/<version>``) is that step's too.
        own = user_scoped_tail(output_path)
        name, _, version = own.rpartition("/")
        if step is not None:
            if (self.name, self.version) != step:
                return f"record belongs to {self.step_id}"
        elif (self.version != version or (name and self.name != name)) and not self._pinned_at(own):
            return f"record belongs to {self.step_id}"
        if not (self.output_path == output_path or self.output_path.endswith("/" + output_path)):
            return f"record was written for the output {self.output_path}"
        return None


USERS_FOLDER = "users"
"""Under the prefix, ``users/<user>/`` holds a user's scoped outputs (``plan/scope.py``)."""


def user_scoped_tail(output_path: str) -> str:
    """``users/<user>/<rest>`` -> ``<rest>``; any other path as it is."""
    head, sep, rest = output_path.partition("/")
    if head == USERS_FOLDER and sep and "/" in rest:
        return rest.split("/", 1)[1]
    return output_path


def _digest_map(value: Any, limit: int = 10_000) -> dict[str, str]:
    """A stored ``name -> output digest`` map, keeping only well-formed entries."""
    if not isinstance(value, dict) or len(value) > limit:
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and is_output_digest(v)}


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "version": str,
    "fingerprint": str,
    "fingerprint_payload": str,
    "dep_paths": dict,
    "output_path": str,
    "provenance": dict,
    "started_at": str,
    "finished_at": str,
    "duration_s": (int, float),
    "artifact_type": str,
    "extra": dict,
    "build_id": str,
    "inputs": dict,
}
_OPTIONAL_FIELDS = {"artifact_type", "extra", "build_id", "inputs"}
"""Optional: records written before lineage (``build_id``, ``inputs``) still load."""
_PROVENANCE_TYPES: dict[str, type | tuple[type, ...]] = {
    "git_commit": str,
    "git_dirty": bool,
    "user": str,
    "host": str,
    "pid": int,
    "time": str,
    "lowered": dict,
}
"""What ``collect_provenance`` writes (each may be absent or null; ``argv``, checked apart, may
not be null; other keys are kept as they are): ``marin show`` and ``ls`` print these."""


def parse_stored_time(text: object) -> datetime.datetime | None:
    """A time as a record or status file stores it (``finished_at``, ``started_at``: ISO 8601),
    as an aware datetime; one without a zone is UTC, as Marin writes them.

    Stored data is untrusted, so this never raises: anything but an ISO time string gives None,
    which a caller treats as "unknown" (``marin ls --after`` keeps no such build, ``marin gc``
    keeps it as of unknown age).
    """
    if not isinstance(text, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)


@dataclass(frozen=True)
class ForeignRecord:
    """A well-formed record beside a step's output that is not that step's: it names another
    step, or another output. It is never served as the step's record and never deleted by it:
    ``decide`` refuses to build the step over it, naming the file."""

    path: str
    """The record file, as the file system names it."""
    record: ArtifactRecord
    """What the file holds (the record of ``record.step_id``)."""
    why: str
    """``record belongs to other@v0``, or the output it was written for."""


def record_disowns_output(location: Location, output_path: str, record: ArtifactRecord) -> str:
    """Why data at ``output_path`` is not the build ``record`` (this build's, read) made, or ""
    (red team r24-3): the record says the build wrote no file there (a step whose artifact is
    its returned value; its digest known), and a file is there now, put by someone later. Asked
    wherever a record proves the output Marin's (a build's look before clearing, ``marin gc``);
    one listing, only for such a record."""
    if record.output.digest is None or record.output.files or record.output.bytes:
        return ""
    path = location.path(output_path)
    try:
        found = location.fs.find(path, withdirs=False)
    except (FileNotFoundError, NotADirectoryError):
        return ""
    if not found:
        return ""
    return (
        "its record says the build wrote no file there (its artifact is its returned value), "
        "and files are there now: put there since"
    )


def unread_record_names(location: Location, output_path: str, step: tuple[str, str]) -> bool | None:
    """Whose a ``record.json`` is that ``load_record`` cannot read (a newer schema, a field
    damaged, torn): True when its JSON object still names ``step`` (``(name, version)``) and
    ``output_path``, False when it names another step or output (a copy), None when it names
    none (torn, not an object, those fields gone) or there is no such file. Asked only to
    tell whether the data beside it is Marin's build (``clearing``): never read as a build."""
    try:
        raw = location.read_file(location.path(record_path(output_path)))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        data = parse_json(raw.decode())
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    named = (data.get("name"), data.get("version"), data.get("output_path"))
    if not all(isinstance(value, str) and value for value in named):
        return None
    out = str(named[2])
    return named[:2] == step and (out == output_path or out.endswith("/" + output_path))


def _remember_stored(record: ArtifactRecord, raw: bytes) -> None:
    """Keep on ``record`` the bytes it was read from or written as.

    Kept beside the fields (never one of them: not in its JSON, not compared), so that a reader
    who already holds this record recognises the same bytes again by comparing them, without a
    parse. The bytes themselves, not a hash of them: an exact answer, and a comparison never
    releases the GIL (hashlib does, for a record's size: a thread switch per read).
    """
    object.__setattr__(record, "_stored_bytes", raw)


def load_record(
    location: Location,
    output_path: str,
    known: ArtifactRecord | None = None,
    step: tuple[str, str] | None = None,
) -> ArtifactRecord | ForeignRecord | None:
    """The one reader of ``record.json``: the step's committed record, a ``ForeignRecord``
    when the file holds another step's, or None (no record, or a corrupt one).

    ``known``: a record the caller holds for this step (its dependency's build, as the run
    knows it). When the file holds exactly the bytes ``known`` was read from or written as,
    ``known`` itself is the answer, with no parse: a run re-reads each
    dependency's record at every dependent's start and again before its commit, and a long
    run's records fall out of the parse cache.

    ``step``: the ``(name, version)`` of the step reading it (``owner_mismatch``); without it,
    the step is the one ``output_path`` names (or a step pinned there).

    A corrupt record counts as not built, with a warning naming the file (once per process):
    the next build replaces it, so no person has to delete anything.

    Raises:
        SymlinkError: a folder on the way to the file, or the file itself, is a symbolic link
            (local disk).
        StorageError: storage kept failing, or the file is not a regular file.
    """
    path = location.path(record_path(output_path))
    try:
        raw = location.read_file(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    record = None
    if known is not None and getattr(known, "_stored_bytes", None) == raw:
        record = known
    if record is None:
        record = _PARSED.get(raw)
    if record is None:
        try:
            record = ArtifactRecord.from_json(raw.decode())
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            if _first_sighting(path, raw):
                log.warning(
                    "corrupt record %s (%s): treating %s as not built", path, exc, output_path
                )
            return None
        _remember_stored(record, raw)
        _PARSED.put(raw, record)
    why = record.owner_mismatch(output_path, step)
    if why is None:
        return record
    return ForeignRecord(path, record, why)


def read_record(
    location: Location,
    output_path: str,
    known: ArtifactRecord | None = None,
    step: tuple[str, str] | None = None,
) -> ArtifactRecord | None:
    """The step's committed record, or None: not built, corrupt, or another step's (warned
    about once per process; ``load_record`` says which, and what ``known`` saves).

    Raises:
        SymlinkError: a folder on the way to the file, or the file itself, is a symbolic link
            (local disk).
        StorageError: storage kept failing, or the file is not a regular file.
    """
    found = load_record(location, output_path, known, step)
    if isinstance(found, ForeignRecord):
        if _first_sighting(found.path, found.why.encode()):
            name, version = step or user_scoped_tail(output_path).rpartition("/")[::2]
            log.warning(
                "foreign record %s (%s): %s@%s is not built",
                found.path, found.why, name, version,
            )  # fmt: skip
        return None
    return found


class _ParsedRecords:
    """Stored record bytes -> the record ``from_json`` makes of them, for the last few thousand
    distinct records this process read or wrote.

    ``from_json`` is a pure function of the bytes, so a hit is exactly as strict as parsing
    again: the full field validation ran on these very bytes (or this process built the record
    they are the JSON of). A run reads each dependency's record at the dependent's start and
    again before its commit; only changed bytes cost a parse. Keyed by the whole bytes, never a
    hash of them. Records are frozen and never mutated, so sharing one object is safe.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        # An OrderedDict, not a dict: evicting a plain dict's oldest entry leaves a hole at its
        # front that every later `next(iter(...))` walks over (a run slowed down as it went).
        self._items: collections.OrderedDict[bytes, ArtifactRecord] = collections.OrderedDict()

    def get(self, raw: bytes) -> ArtifactRecord | None:
        with self._lock:
            return self._items.get(raw)

    def put(self, raw: bytes, record: ArtifactRecord) -> None:
        if len(raw) > _PARSED_MAX_BYTES:
            return  # a rare big record (a large config or result) is parsed each time
        with self._lock:
            self._items[raw] = record
            self._items.move_to_end(raw)
            if len(self._items) > self._size:
                self._items.popitem(last=False)  # the oldest entry


_PARSED_MAX_BYTES = 16 * 1024
"""Records larger than this are not kept (a no-op step's record is about 1.5 KiB)."""
_PARSED = _ParsedRecords(4096)
"""Bounded in entries and in each entry's size: at most 64 MiB of record bytes, a few MiB for
typical records (see ``_ParsedRecords``)."""

_seen_corrupt: set[tuple[str, int]] = set()
_seen_lock = threading.Lock()


def _first_sighting(path: str, raw: bytes) -> bool:
    """True the first time this process reads these corrupt bytes at ``path``: a run reads a
    record several times (plan, then the re-check under the lease), and one warning is enough."""
    key = (path, hash(raw))
    with _seen_lock:
        if key in _seen_corrupt:
            return False
        if len(_seen_corrupt) > 10_000:
            _seen_corrupt.clear()
        _seen_corrupt.add(key)
        return True


def write_record(location: Location, record: ArtifactRecord, output_path: str) -> None:
    """Commit ``record`` beside the output at ``output_path``, atomically (``write_atomic``).

    Raises:
        ConfigError: the record would nest deeper than any reader reads (``MAX_JSON_DEPTH``):
            nothing is written (red team r23-3: such a record was written, then every later
            run refused the build beside it as not provably Marin's).
        SymlinkError: as ``write_atomic``.
        StorageError: as ``write_atomic``.
    """
    text = record.to_json()
    if too_deep(text):
        raise ConfigError(
            f"the record of {record.step_id} would be nested deeper than {MAX_JSON_DEPTH} "
            "levels (its config or the value fn returned), deeper than Marin reads back; "
            "nothing was committed",
            "return a flatter value (write a deep structure to the output path as a file), "
            "or flatten the config",
            record.step_id,
        )
    data = text.encode()
    write_atomic(
        location,
        location.path(record_path(output_path)),
        data,
        crash_step=record.step_id,
        durable=durable(),
    )
    # Its dependents read these very bytes back (at their start and before their commit): what
    # they parse to is ``record`` itself (``from_json(to_json())`` is the identity, tested).
    _remember_stored(record, data)
    _PARSED.put(data, record)


def metadata_files(
    location: Location, output_path: str, *, remove_temporaries: bool = False
) -> set[str]:
    """Which of ``record.json`` and ``status.json`` sit beside the output; on local disk,
    ``registered.json`` too (``marin register``'s freeze mark), which the same listing shows at
    no cost (elsewhere a caller that needs it asks, ``clearing.freeze_mark_beside``).

    On local disk one listing answers all three. The lease holder's look, before its first write,
    passes ``remove_temporaries``: the temporary record and status files a crashed write left
    there go (a leftover of a crash in the middle of a big record write may be what fills the
    disk, so it goes first). Only this module's own temporary names (``record.json.tmp-*``,
    ``status.json.tmp-*``) are touched, and only the lease holder writes those: anyone else who
    removed them would delete the holder's write in flight. Object stores and ``memory://``
    write in one put: no temporary files, two checks.

    Raises:
        SymlinkError: the metadata folder, a folder on the way to it, or an entry in it is a
            symbolic link (local disk), but for ``cancel.json`` (a link there is no mark).
        NotRegularFileError: one of Marin's files in it (``PLAIN_FILES``) is a folder, a FIFO
            or a device (local disk): as a read of it says, so plan and run refuse alike.
        StorageError: storage kept failing (object stores).
    """
    names = (RECORD_FILE, STATUS_FILE)
    if not location.is_local:
        folder = metadata_dir(output_path)
        return {n for n in names if location.has_file(location.path(f"{folder}/{n}"))}
    folder = location.path(metadata_dir(output_path))
    # The folder may not be a link, nor hold one: every file in it is Marin's to read, replace
    # or delete, and the listing says which entries are links at no extra system call.
    location.check_no_links(folder)
    try:
        with os.scandir(folder) as entries:  # the kinds come with the names (d_type)
            listing = {e.name: (e.is_symlink(), e.is_file(follow_symlinks=False)) for e in entries}
    except (FileNotFoundError, NotADirectoryError):
        return set()
    # cancel.json is anyone's to plant and never followed (``read_cancel_mark``): no mark
    link = next((n for n, (is_link, _) in listing.items() if is_link and n != CANCEL_FILE), None)
    if link is not None:
        raise symlink_refused(os.path.join(folder, link))
    odd = next((n for n, (_, is_file) in listing.items() if not is_file and n in PLAIN_FILES), None)
    if odd is not None:  # a folder at log.txt, say: every build would fail on it
        raise not_a_regular_file(os.path.join(folder, odd))
    for name in listing if remove_temporaries else ():
        if name.startswith((RECORD_FILE + TMP_MARK, STATUS_FILE + TMP_MARK)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
    return {n for n in (*names, REGISTERED_FILE) if n in listing}


def delete_record(location: Location, output_path: str) -> None:
    """Delete the step's ``record.json``, if there is one.

    Raises:
        SymlinkError: a folder on the way to the file is a symbolic link (local disk).
        StorageError: storage kept failing (object stores).
    """
    with contextlib.suppress(FileNotFoundError):
        location.rm_file(location.path(record_path(output_path)))


def clear_status(location: Location, output_path: str) -> None:
    """Drop an earlier attempt's status file: the new attempt's lease now says RUNNING, and its
    record or a new FAILED status will say how it ended; an old status could only contradict.

    Raises:
        SymlinkError: a folder on the way to the file is a symbolic link (local disk).
        StorageError: storage kept failing (object stores).
    """
    with contextlib.suppress(FileNotFoundError):
        location.rm_file(location.path(status_path(output_path)))


def _read_json_object(
    location: Location, path: str, what: str, types: Mapping[str, type]
) -> dict[str, Any] | None:
    """A small metadata file (a status, a lease) as a JSON object whose ``types`` fields, where
    present and not null, have those types; None for anything else (with one warning)."""
    found = _read_json_file(location, path, what, types)
    return found if isinstance(found, dict) else None


_ABSENT, _CORRUPT = "absent", "corrupt"


def _read_json_file(
    location: Location,
    path: str,
    what: str,
    types: Mapping[str, type],
    corrupt_means: str = "ignoring it",
) -> dict[str, Any] | str:
    """``_read_json_object``, telling an absent file (``_ABSENT``) from one that is there and
    cannot be read (``_CORRUPT``, with one warning saying what that means). An empty file
    counts as absent only for a lease, which is empty for a moment while it is created on
    local disk; other files are written whole (``write_atomic``)."""
    try:
        raw = location.read_file(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return _ABSENT
    if not raw and what == "lease":
        return _ABSENT
    try:
        data = parse_json(raw.decode())
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        for key, kind in types.items():
            value = data.get(key)
            if value is not None and not isinstance(value, kind):
                raise ValueError(f"field {key!r} is a {type(value).__name__}")
    except (ValueError, UnicodeDecodeError) as exc:
        if _first_sighting(path, raw):
            log.warning("corrupt %s %s (%s): %s", what, path, exc, corrupt_means)
        return _CORRUPT
    return data


STEP_FIELD = "step"
"""A status field: the ``name@version`` of the attempt that wrote it. A pinned step's output
path is shared by its versions: another version's failure there is not this one's."""

_STATUS_TYPES = {
    "state": str,
    "error": str,
    "holder": str,
    "started_at": str,
    "finished_at": str,
    "traceback": str,
    "replaces": str,
    STEP_FIELD: str,
    OWNER_FIELD: str,
}
"""The fields a status file may have: ``write_status``'s callers write these, as strings."""

REPLACES = "replaces"
"""A status field: the build id of the record a rebuild deleted, until a new build commits.

A rebuild deletes the step's record before it clears the output; had it killed or failed
there, nothing would say the step was being replaced, and what read the deleted build would
look current (a step merely missing, as if pruned). The status keeps that build's id instead
(``_clear_earlier`` writes it, every later status of the step keeps it, the commit drops it),
so its readers are stale (``identity._lineage``). ``write_status`` owns it: a status written
without it keeps what the one it overwrites names."""

UNKNOWN_BUILD = "unknown"
"""``REPLACES`` of a status file that is there but cannot be read (torn, empty, planted): it
may have named a replaced build, so what read the step is stale, never served (fail closed)."""


def replaced_build(status: Mapping[str, Any] | None) -> str:
    """The build id a status says an unfinished rebuild deleted ("" when none)."""
    value = (status or {}).get(REPLACES)
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class SharedBuild:
    """For a step placed in a user's folder with no record there: what its shared placement
    holds for the builds that read it (``shared_build``). Either field makes every record that
    read the step stale (``identity._gone_input``): the user's run builds its own now."""

    build: str = ""
    """The shared record's ``build_id`` ("": none)."""
    replaced: str = ""
    """Without a shared record: the build an unfinished rebuild of it deleted, as its shared
    status names it (``replaced_build``; ``UNKNOWN_BUILD`` for a status that cannot be read)."""


NO_SHARED_BUILD = SharedBuild()


def shared_build(location: Location, output_path: str, user_home: str | None) -> SharedBuild:
    """For a step placed in a user's folder (``user_home``) that has no record there: what its
    shared placement holds, read as the shared plan reads it (its record, else its status);
    nothing when not placed so.

    Raises:
        SymlinkError: a folder on the way to the shared status is a symbolic link (local disk).
        StorageError: storage kept failing, or the status is not a regular file.
    """
    if not user_home or not output_path.startswith(f"{user_home}/"):
        return NO_SHARED_BUILD
    shared = output_path[len(user_home) + 1 :]
    record = read_record(location, shared)
    if record is not None:
        return SharedBuild(build=record.build_id)
    return SharedBuild(replaced=replaced_build(read_status_file(location, shared)))


_LEASE_TYPES = {"holder": str, "started_at": str}
"""The lease fields a status reader uses (``lease.LeaseInfo.parse`` checks the rest)."""


def read_status_file(location: Location, output_path: str) -> dict[str, Any] | None:
    """The status file, or None when absent. A corrupt one (torn or empty, not a JSON object
    with a string state, a field of the wrong type) reads as a ``FAILED`` attempt replacing
    ``UNKNOWN_BUILD``: whatever it said, nothing read from the step is served as current.

    Builds write one when an attempt fails (``FAILED``), and ``RUNNING`` while a rebuild
    replaces a committed build (naming it: ``REPLACES``); versions before the lean commit path
    also wrote ``RUNNING`` and ``SUCCESS``, which still read.

    Raises:
        SymlinkError: a folder on the way to the file, or the file itself, is a symbolic link
            (local disk).
        StorageError: storage kept failing, or the file is not a regular file.
    """
    path = location.path(status_path(output_path))
    status = _read_json_file(location, path, "status", _STATUS_TYPES, _CORRUPT_STATUS_MEANS)
    if status == _ABSENT:
        return None
    if isinstance(status, dict) and isinstance(status.get("state"), str):
        return status
    if status != _CORRUPT and _first_sighting(path, b"no state"):
        log.warning("corrupt status %s (no state): %s", path, _CORRUPT_STATUS_MEANS)
    # It may have named the build a rebuild deleted: its readers stay stale (fail closed).
    return {"state": FAILED, "error": f"its status file {path} is corrupt",
            REPLACES: UNKNOWN_BUILD}  # fmt: skip


_CORRUPT_STATUS_MEANS = (
    "read as a failed attempt that may have replaced a build (what read the step is stale)"
)


def read_attempt(location: Location, output_path: str) -> dict[str, Any] | None:
    """How the step's latest unfinished or failed attempt stands; None if there is none.

    A build writes no status while all goes well, to keep the commit path short: its lease is
    its RUNNING status (held while it builds, left behind if it crashed), a failure writes a
    ``FAILED`` status file, and the record is the SUCCESS. So: the status file if there is one,
    else ``RUNNING`` while a lease is there. A lease without a string holder says nothing (it
    protects nothing either, see ``lease.LeaseInfo.parse``).

    Raises:
        SymlinkError: a folder on the way to the file, or the file itself, is a symbolic link
            (local disk).
        StorageError: storage kept failing, or the file is not a regular file.
    """
    status = read_status_file(location, output_path)
    if status is not None:
        return status
    lease = _read_json_object(
        location, location.path(lease_path(output_path)), "lease", _LEASE_TYPES
    )
    if lease is None or not isinstance(lease.get("holder"), str):
        return None
    state: dict[str, Any] = {"state": RUNNING, "holder": lease["holder"]}
    if isinstance(lease.get("started_at"), str):
        state["started_at"] = lease["started_at"]
    return state


def read_status(location: Location, output_path: str) -> dict[str, Any] | None:
    """The step's state for readers (``ls``, ``show``, tests): its attempt, else ``SUCCESS``
    when a record is there, else None (never tried).

    Raises:
        SymlinkError: a folder on the way to the file, or the file itself, is a symbolic link
            (local disk).
        StorageError: storage kept failing, or the file is not a regular file.
    """
    attempt = read_attempt(location, output_path)
    if attempt is not None:
        return attempt
    record = read_record(location, output_path)
    if record is None:
        return None
    return {"state": SUCCESS, "started_at": record.started_at, "finished_at": record.finished_at}


GC_DELETING = "marin gc was deleting this step and did not finish: run `marin gc` again"
"""The error of the FAILED status ``marin gc`` writes while it deletes a step: its mark that the
folder is Marin's meanwhile, and, to a build that read the step, who deleted its record."""


GC_WAS_DELETING = "marin gc was deleting the step"
"""Why nothing a half-deleted step's folder holds (a partial attempt, a job) is reused."""


def gc_was_deleting(status: Mapping[str, Any] | None) -> bool:
    """Whether ``status`` (a status file's content) is ``marin gc``'s mark that it was deleting
    the step and did not finish: its output is half deleted, so an attempt's partial output or
    a job's output there is never resumed or collected (a copied or planted mark only makes
    the step build from scratch)."""
    return isinstance(status, Mapping) and status.get("error") == GC_DELETING


def status_names(status: Mapping[str, Any] | None, output_path: str) -> bool:
    """Whether ``status`` was written for the step at ``output_path`` (relative to the prefix).
    A status names its step as a record does (``owner_mismatch``): one copied beside another
    output, or written before it named one, is not provably that step's."""
    return status is not None and status.get(OWNER_FIELD) == output_path


def adoption_status(status: object) -> bool:
    """Whether ``status`` (a status file's content, untrusted) is an adopted step's attempt's:
    it never wrote the output path, so the status is no proof that Marin did."""
    return isinstance(status, dict) and isinstance(status.get(ADOPTION), str)


def write_status(location: Location, output_path: str, state: str, **details: Any) -> None:
    """Write the step's status file: ``state``, the output path it is of (``OWNER_FIELD``) and
    ``details``, atomically (``write_atomic``).
    The one owner of ``REPLACES``: only a rebuild that deletes a record names it
    (``_mark_replacing``); every other status keeps what the one it overwrites names (one read,
    on these failure paths only), until a commit drops the status.

    Raises:
        SymlinkError: as ``write_atomic``.
        StorageError: as ``write_atomic``.
    """
    if REPLACES not in details:
        replaced = replaced_build(read_status_file(location, output_path))
        if replaced:
            details[REPLACES] = replaced
    body = {"state": state, OWNER_FIELD: output_path, **details}
    write_atomic(
        location,
        location.path(status_path(output_path)),
        (json.dumps(body, sort_keys=True) + "\n").encode(),
    )
