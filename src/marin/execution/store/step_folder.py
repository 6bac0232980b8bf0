"""The step folder, ``<prefix>/<name>/<version>.marin/``: every file Marin keeps beside an output.

Named here, once: ``record.json`` (the commit point) and ``status.json`` (parsed in
``records``), ``lease.json`` and its ``lease.json.guard`` (``lease/``), ``log.txt`` (the step's
prints), ``job.json`` (a remote step's job), ``attempt.json`` (a resumable step's attempt),
``cancel.json`` (``marin cancel``'s intent, ``CancelMark``), ``registered.json`` (``marin
register``'s freeze mark, ``RegisteredMark``), ``adopted.json`` (an adoption's: what lies at
the output path is not Marin's; the mark outlives a torn record) and ``checkpoints/``. The two files
a build reuses work by, ``job.json`` and ``attempt.json``, are
parsed and validated here into typed values (``JobRecord``, ``Attempt``), each stating the
recipe it was made for; whether that is the current recipe is ``identity.judge_claim``'s answer.

Everything read here is untrusted (anyone who can write the bucket can plant a file): a
malformed ``attempt.json`` is ``UnreadableAttempt`` (its partial output is cleared, never resumed
on a guess, and ``marin plan`` says why); a ``job.json`` that cannot be read is
``UnreadableJob``, never "no job", because a job it named may still be writing the output.
``marins_own`` says which names in a folder are Marin's own files (``gc`` asks it), and
``attempt_not_shown`` whether they show that an attempt worked at the output beside them (one
of the files an attempt leaves, none naming another output: a build, ``marin plan`` and ``gc``
ask it before calling what is there Marin's).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from marin.execution.atomic_file import TMP_MARK, write_file_atomically
from marin.execution.digest.code import CodeDigest, unknown_digest
from marin.execution.errors import NotRegularFileError, RemoteJobError, StorageError
from marin.execution.names import METADATA_SUFFIX
from marin.execution.store.location import Location, with_retries
from marin.execution.store.metadata_io import parse_json, write_atomic

log = logging.getLogger("marin")

RECORD_FILE = "record.json"
STATUS_FILE = "status.json"
LEASE_FILE = "lease.json"
LEASE_GUARD_FILE = "lease.json.guard"
LOG_FILE = "log.txt"
JOB_FILE = "job.json"
ATTEMPT_FILE = "attempt.json"
CANCEL_FILE = "cancel.json"
REGISTERED_FILE = "registered.json"
ADOPTED_FILE = "adopted.json"
CHECKPOINTS_DIR = "checkpoints"
OWNER_FIELD = "output_path"
"""The field of a lease, status or ``job.json`` naming the output (relative to the prefix) of
the step that wrote it."""

ADOPTION = "adoption"
"""In a lease or status an adopted step's attempt (or ``marin gc`` deleting an adoption) wrote:
the source it adopts. Such an attempt never writes its output path, so its files prove nothing
about what lies there (a build never clears it, gc never deletes it: ``adoption_status``)."""

JOB_ID = re.compile(r"marin-[0-9a-f]{20}")
"""The ids Marin gives jobs (a backend's idempotency key); a record naming another is not
Marin's, and is never followed to a folder or a cluster."""

_OWN_FILES = frozenset(
    {RECORD_FILE, STATUS_FILE, LEASE_FILE, LEASE_GUARD_FILE, LOG_FILE, JOB_FILE, ATTEMPT_FILE,
     CANCEL_FILE, REGISTERED_FILE, ADOPTED_FILE}
)  # fmt: skip
PLAIN_FILES = _OWN_FILES - {CANCEL_FILE}
"""The step folder's files Marin reads, replaces or deletes as its own: each must be a regular
file (a folder, a FIFO or a device there is refused, ``records.metadata_files``); a
``cancel.json`` is anyone's to plant and never followed, so it is ignored instead."""
_OWN_TEMPORARY = re.compile(
    r"(?:(?:record|status|lease|job|attempt|cancel|registered|adopted)\.json"
    + re.escape(TMP_MARK)
    + r".+"
    r"|\.job\..+\.tmp)"
)
"""A crashed atomic write's temporary sibling (``record.json.tmp-<hex>``, ``.job.<x>.tmp``)."""


def metadata_dir(output_path: str) -> str:
    """``<output>.marin``: the step folder beside the output at ``output_path``."""
    return output_path + METADATA_SUFFIX


def _in_folder(output_path: str, name: str) -> str:
    return f"{metadata_dir(output_path)}/{name}"


def record_path(output_path: str) -> str:
    return _in_folder(output_path, RECORD_FILE)


def status_path(output_path: str) -> str:
    return _in_folder(output_path, STATUS_FILE)


def lease_path(output_path: str) -> str:
    return _in_folder(output_path, LEASE_FILE)


def log_path(output_path: str) -> str:
    return _in_folder(output_path, LOG_FILE)


def job_path(output_path: str) -> str:
    return _in_folder(output_path, JOB_FILE)


def attempt_path(output_path: str) -> str:
    """``<output>.marin/attempt.json``: the latest attempt of a resumable step."""
    return _in_folder(output_path, ATTEMPT_FILE)


def checkpoint_dir(output_path: str) -> str:
    """``<output>.marin/checkpoints``: the folder ``current_context().checkpoint_path`` names."""
    return _in_folder(output_path, CHECKPOINTS_DIR)


def marins_own(names: Iterable[str]) -> list[str]:
    """The entries of a step folder (names, not paths) that are Marin's own files: the record,
    status, lease (and its guard), log, ``job.json``, ``attempt.json``, ``cancel.json``,
    ``registered.json``, ``adopted.json``, the checkpoint folder, a
    crashed write's temporary sibling of one of those, and a ``local`` job's folder (named by
    its job id). A folder holding any of them was written by Marin (``gc`` asks this)."""
    return sorted(
        name
        for name in names
        if name in _OWN_FILES
        or name == CHECKPOINTS_DIR
        or _OWN_TEMPORARY.fullmatch(name)
        or JOB_ID.fullmatch(name)
    )


def is_marins(names: Iterable[str]) -> bool:
    """Whether a step folder holding these entries is provably Marin's (``marins_own``)."""
    return bool(marins_own(names))


ATTEMPT_FILES = frozenset(
    {RECORD_FILE, STATUS_FILE, LEASE_FILE, LOG_FILE, JOB_FILE, ATTEMPT_FILE, REGISTERED_FILE,
     ADOPTED_FILE}
)  # fmt: skip
"""The files of a step folder that show a Marin attempt worked at the output beside it (a
build, or an adoption, or ``marin register`` beside a build, each of whose own rules then
refuses what it must). Not the lease's guard: a lock holding no state, the one file a build
that went well leaves on local disk besides its record, and on object stores not there at all.
Not ``cancel.json`` (anyone's intent), nor an empty ``checkpoints/`` folder."""


def no_attempt_shown(names: Iterable[str], folder: str = "its metadata folder") -> str:
    """Why a step folder holding the entries ``names`` does not show that a Marin attempt
    worked at the output beside it ("" when one of ``ATTEMPT_FILES`` is there): what is at that
    output path is then not Marin's to clear (a build refuses it, ``marin plan`` says so, and
    ``marin gc`` leaves it alone). ``folder`` names the folder in the sentence."""
    listed = set(names)
    if listed & ATTEMPT_FILES:
        return ""
    if not listed:
        return f"{folder} is empty"
    return (
        f"{folder} holds none of the files a Marin attempt leaves there: a record, a status, "
        "a lease, a log, attempt.json or job.json"
    )


_NAME_FIELDS = {STATUS_FILE: OWNER_FIELD, LEASE_FILE: OWNER_FIELD, JOB_FILE: OWNER_FIELD,
                ATTEMPT_FILE: "placement"}  # fmt: skip
"""The step-folder files that name the output they were written for, and their field."""


_PROOF_FILES = (STATUS_FILE, LEASE_FILE, JOB_FILE)
"""The step-folder files whose naming of the output proves a Marin attempt worked there: a
build's status (failed, unlocked, or gc deleting it), its lease (held, or left by a crash),
its remote job's ``job.json``. An attempt file names its placement but is never alone."""


def attempt_not_shown(
    location: Location, output_path: str, names: Iterable[str], folder: str = "its metadata folder"
) -> str:
    """Why the step folder beside ``output_path``, holding the entries ``names`` (its record
    not read as this step's: absent, unreadable or another step's), is no proof that a Marin
    attempt worked at that output ("" when it is): ``no_attempt_shown``; one of its files names
    another output (a status, lease, ``job.json`` or ``attempt.json`` copied from another step's
    folder, or planted); or none of ``_PROOF_FILES`` names this one (a log alone, a file that
    cannot be read, or one that names nothing proves nothing). The one rule a build,
    ``marin plan`` and ``marin gc`` ask before calling what lies at an output Marin's."""
    listed = set(names)
    why = no_attempt_shown(listed, folder)
    if why:
        return why
    named = {
        n: _named_output(location, output_path, n) for n in sorted(listed & _NAME_FIELDS.keys())
    }
    for name, other in named.items():
        if other is not None and other != output_path:
            return (
                f"{folder}'s {name} does not name this output: it names {other[:120]!r} "
                "(copied from that step's folder, or planted), no proof that Marin wrote this one"
            )
    if not any(named.get(name) == output_path for name in _PROOF_FILES):
        return (
            f"{folder} holds no readable record, status, lease or job.json naming this output "
            "(a log alone, a file that cannot be read, or one naming no output proves nothing)"
        )
    return ""


def _named_output(location: Location, output_path: str, name: str) -> str | None:
    """The output the step folder's file ``name`` says it was written for (None: the file is
    gone, unreadable as a JSON object, or names none: a value that is no path, as a hand-edited
    ``attempt.json``'s, names no output, and such an attempt is judged by its own rule)."""
    try:
        raw = location.read_file(location.path(_in_folder(output_path, name)))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    data = json_object(raw)
    named = None if data is None else data.get(_NAME_FIELDS[name])
    # "": an attempt that did not record its placement.
    return named if isinstance(named, str) and named else None


DIR, FILE, LINK = "dir", "file", "link"


def folder_entries(location: Location, folder: str) -> list[tuple[str, str]]:
    """``(name, kind)`` of each entry directly in ``folder`` (a file system path; kind ``DIR``,
    ``FILE`` or ``LINK``, never followed): one listing, ``[]`` when there is no such folder.

    Raises:
        StorageError: storage kept failing (object stores).
    """
    if location.is_local:
        try:
            with os.scandir(folder) as found:
                return [(e.name, _local_kind(e)) for e in found]
        except (FileNotFoundError, NotADirectoryError):
            return []
    try:
        listed = location.list_folder(folder, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    base = folder.rstrip("/") + "/"
    out = []
    for entry in listed:
        name = str(entry["name"]).rstrip("/")
        if not name.startswith(base) or "/" in name[len(base) :]:
            continue  # not a direct child (a key spelled with '//', the folder itself)
        out.append((name[len(base) :], DIR if entry.get("type") == "directory" else FILE))
    return out


def _local_kind(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return LINK
    return DIR if entry.is_dir(follow_symlinks=False) else FILE


# --- job.json: the one job of a remote step's build ---------------------------------------------


@dataclass(frozen=True)
class JobHandle:
    """A submitted job, as ``job.json`` stores it: plain data, so any later driver can rebuild
    it and ask the backend about the job."""

    backend: str
    job_id: str
    data: dict[str, str] = field(default_factory=dict)
    """Backend-specific details a later driver needs (untrusted when read back: the built-in
    backends keep none, and find a job by its id alone)."""


_NO_JOB_CODE = "the job record has no code digest (written before jobs recorded their code)"


@dataclass(frozen=True)
class JobRecord:
    """Which job builds (or built) a step, and the recipe it was submitted for: plain data,
    shown by ``marin plan`` and ``show``. A job is reattached or collected only for that same
    recipe (``identity.judge_claim``)."""

    backend: str
    job_id: str
    build_id: str
    submitted_at: str
    data: dict[str, str]
    fingerprint: str = ""
    """The config the job runs ("" if unknown: never this step's)."""
    code: CodeDigest = field(default_factory=lambda: unknown_digest(_NO_JOB_CODE))
    """The code digest it was submitted for (the job checks it runs that code)."""
    inputs: dict[str, str] = field(default_factory=dict)
    """Each dependency's step id -> the build the job reads (empty: not recorded)."""
    placement: str = ""
    """The output path (below the prefix) it writes ("" : not recorded)."""
    scope: dict[str, str] = field(default_factory=dict)
    """Where its backend can see it, as the backend said before the submit (a ``local`` job's
    host, user and jobs root); empty: not recorded. A driver elsewhere cannot tell a lost job
    from one it cannot see (``fence.is_this_steps``)."""
    preemptions: int = 0
    """How many jobs of this build were lost (killed by a signal, their node gone) before
    this one was submitted: the preemptions the build survived."""

    @property
    def handle(self) -> JobHandle:
        return JobHandle(self.backend, self.job_id, dict(self.data))

    def to_json(self, code: bool = True) -> dict[str, Any]:
        """As ``job.json`` stores it: the job first, the long code digest last (a torn file
        still names its job); without ``code`` for a record's provenance (which has its own)."""
        return {
            "job_id": self.job_id,
            "backend": self.backend,
            "build_id": self.build_id,
            "submitted_at": self.submitted_at,
            "fingerprint": self.fingerprint,
            "placement": self.placement,
            "inputs": dict(self.inputs),
            "scope": dict(self.scope),
            "data": dict(self.data),
            "preemptions": self.preemptions,
            **({"code": self.code.to_record()} if code else {}),
        }

    @classmethod
    def from_json(cls, raw: Any) -> JobRecord | None:
        """The record in ``raw``, or None if it is not one (never trusts its shape)."""
        if not isinstance(raw, dict):
            return None
        fields = [raw.get(k) for k in ("backend", "job_id", "build_id", "submitted_at")]
        data, scope = raw.get("data", {}), raw.get("scope", {})
        if not all(isinstance(f, str) and f for f in fields) or not _strings(data):
            return None
        if not _strings(scope):  # where the job runs, garbled: unreadable, never "anywhere"
            return None
        fingerprint, placement = raw.get("fingerprint", ""), raw.get("placement", "")
        code, preempted = raw.get("code"), raw.get("preemptions", 0)
        if not isinstance(preempted, int) or isinstance(preempted, bool) or preempted < 0:
            preempted = 0
        backend, job_id, build_id, submitted_at = (str(f) for f in fields)
        return cls(
            backend, job_id, build_id, submitted_at, dict(data),
            fingerprint if isinstance(fingerprint, str) else "",
            unknown_digest(_NO_JOB_CODE) if code is None else CodeDigest.from_record(code),
            _inputs(raw.get("inputs")),
            placement if isinstance(placement, str) else "",
            dict(scope), min(preempted, 1 << 30),
        )  # fmt: skip


def _strings(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _inputs(value: Any) -> dict[str, str]:
    """A stored ``inputs`` map (dependency -> build id); anything malformed is "not recorded"."""
    return dict(value) if _strings(value) else {}


@dataclass(frozen=True)
class UnreadableJob:
    """A ``job.json`` that is there but cannot be read (torn, hand-edited, planted): the job it
    named may still run and write the step's output, so it is never read as "no job"."""

    path: str
    why: str
    job_id: str | None = None
    """A Marin job id found in its bytes, if any: a lead to the job."""

    def refusal(self, step_id: str) -> RemoteJobError:
        """The error that stops the step's build before anything is cleared or submitted."""
        named = f"; its bytes name job {self.job_id}" if self.job_id else ""
        job = self.job_id or "marin-<20 hex digits>"
        return RemoteJobError(
            f"{self.path} cannot be read ({self.why}){named}: a job it recorded may still be "
            "running and writing the step's output, so nothing was cleared or submitted",
            f"stop that job first (a local job: find its process with `pgrep -af {job}` and "
            f"end its group with `kill -- -<pid>`; a Ray job: `ray job stop {job}`), then "
            f"delete {self.path} and run again",
            step_id,
        )


def load_job(location: Location, output_path: str) -> JobRecord | UnreadableJob | None:
    """The step's job record; None when there is none; ``UnreadableJob`` when the file is there
    but is not a job record (logged once here)."""
    path = location.path(job_path(output_path))
    try:
        raw = location.read_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        return UnreadableJob(path, "a folder, not a file")
    try:
        found = JobRecord.from_json(parse_json(raw.decode()))
        why = "not a job record"
    except (ValueError, UnicodeDecodeError) as exc:
        found, why = None, f"not JSON: {exc}"
    if found is not None:
        return found
    lead = JOB_ID.search(raw.decode(errors="replace"))
    log.warning("unreadable job record %s (%s)", path, why)
    return UnreadableJob(path, why, lead.group(0) if lead else None)


def read_job(location: Location, output_path: str) -> JobRecord | None:
    """The step's job record, or None (absent, or unreadable: see ``load_job``, which callers
    that may clear or submit must ask instead)."""
    found = load_job(location, output_path)
    return found if isinstance(found, JobRecord) else None


def create_job(
    location: Location, output_path: str, record: JobRecord, step_id: str = ""
) -> JobRecord:
    """Write ``record`` unless a job record is there already; return the one that is there.

    Raises:
        RemoteJobError: a file is there that is not a job record (``UnreadableJob.refusal``).
    """
    path = location.path(job_path(output_path))
    data = _job_bytes(record, output_path)
    found: JobRecord | UnreadableJob | None = None
    for _ in range(2):  # a record removed between the two looks: one more try
        if _create(location, path, data):
            return record
        found = load_job(location, output_path)
        if found is not None:
            break
    if isinstance(found, JobRecord):
        return found
    raise (found or UnreadableJob(path, "it comes and goes")).refusal(step_id or output_path)


def replace_job(location: Location, output_path: str, record: JobRecord) -> None:
    """Overwrite the record (the lease holder, adding what ``submit`` returned)."""
    data = _job_bytes(record, output_path)
    path = location.path(job_path(output_path))
    if location.is_local:
        write_file_atomically(path, data)
    else:
        location.put_file(path, data)


def _job_bytes(record: JobRecord, output_path: str) -> bytes:
    """``job.json``'s bytes: the record, naming the output it is of (``marin gc`` proves a
    crashed build's leftovers are that step's by it, as by a lease)."""
    return json.dumps({**record.to_json(), OWNER_FIELD: output_path}).encode()


def names_output(raw: bytes, output_path: str) -> bool:
    """Whether a lease's or ``job.json``'s bytes name ``output_path`` (``OWNER_FIELD``)."""
    data = json_object(raw)
    return data is not None and data.get(OWNER_FIELD) == output_path


def names_adoption(raw: bytes) -> bool:
    """Whether a lease's bytes say an adopted step's attempt took it (``ADOPTION``): killed
    holding it, that attempt still never wrote the output path."""
    data = json_object(raw)
    return data is not None and isinstance(data.get(ADOPTION), str)


def job_names_output(location: Location, output_path: str) -> bool:
    """Whether the step's ``job.json`` is there and names ``output_path``."""
    try:
        raw = location.read_file(location.path(job_path(output_path)))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return False
    return names_output(raw, output_path)


def delete_job(location: Location, output_path: str) -> None:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        location.rm_file(location.path(job_path(output_path)))


def _create(location: Location, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` if nothing is there; whether this call created it."""
    if location.is_local:
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        location.check_no_links(folder)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".job.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.link(tmp, path)  # atomic, and fails if the name exists: readers see all or none
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    if location.is_memory:
        if path in location.fs.store:
            return False
        location.put_file(path, data)
        return True
    try:
        with_retries(lambda: location.fs.pipe_file(path, data, mode="create"), f"create {path}")
    except FileExistsError:
        return False
    return True


# --- attempt.json: a resumable step's latest attempt --------------------------------------------


def json_object(raw: bytes) -> dict[str, Any] | None:
    """A step-folder file's JSON object, or None for anything else (never raises)."""
    try:
        data = parse_json(raw.decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Attempt:
    """One attempt of a resumable step, as ``attempt.json`` keeps it, with the recipe it ran
    for: its partial output is resumed only by an attempt of that same recipe."""

    number: int
    fingerprint: str
    code: CodeDigest
    started_at: str
    holder: str
    resumed: bool = False
    """It started from an earlier attempt's partial output."""
    job: JobRecord | None = None
    """A remote step's job that runs this attempt (fenced before a later attempt resumes)."""
    inputs: dict[str, str] = field(default_factory=dict)
    """Each dependency's step id -> the build this attempt read (empty: not recorded)."""
    placement: str = ""
    """The output path (below the prefix) it wrote ("": not recorded)."""
    payload: str | None = None
    """The canonical config its fingerprint hashes: what a later attempt of another config
    compares field by field. None when absent, or when it does not hash to ``fingerprint``."""
    ranks: int = 0
    """The world size its job ran with (1: no gang; 0: not recorded). Placement, not
    identity: a later attempt of another world size still resumes, and says so."""
    first_started_at: str = ""
    """When attempt 1 of the attempts this one resumes began ("": this is the first, or not
    recorded): what a resumed build's note says the earlier attempts took."""

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "number": self.number,
            "fingerprint": self.fingerprint,
            "code": self.code.to_record(),
            "started_at": self.started_at,
            "holder": self.holder,
            "resumed": self.resumed,
            "inputs": dict(self.inputs),
            "placement": self.placement,
        }
        if self.job is not None:
            body["job"] = self.job.to_json()
        if self.payload is not None:
            body["payload"] = self.payload
        if self.ranks:
            body["ranks"] = self.ranks
        if self.first_started_at:
            body["first_started_at"] = self.first_started_at
        return (json.dumps(body, sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes) -> Attempt | None:
        """The attempt, or None for anything malformed (never raises)."""
        data = json_object(raw)
        if data is None or attempt_flaw(data):
            return None
        number, fingerprint = data["number"], data["fingerprint"]
        started, holder = data["started_at"], data["holder"]
        placement, ranks = data.get("placement"), data.get("ranks")
        if type(ranks) is not int or not 1 <= ranks <= 1 << 30:
            ranks = 0  # not recorded, or not a world size: unknown, never a guess
        first = data.get("first_started_at", "")
        return cls(
            number, fingerprint, CodeDigest.from_record(data.get("code")), started, holder,
            data.get("resumed") is True, JobRecord.from_json(data.get("job")),
            _inputs(data.get("inputs")), placement if isinstance(placement, str) else "",
            _payload_of(data.get("payload"), fingerprint), ranks,
            first[:64] if isinstance(first, str) else "",
        )  # fmt: skip

    def age(self, now: float | None = None) -> str:
        """``2h ago``, ``5m ago``; ``at <started_at>`` when the time does not parse."""
        try:
            then = datetime.fromisoformat(self.started_at)
            if then.tzinfo is None:
                then = then.replace(tzinfo=UTC)
        except ValueError:
            return f"at {self.started_at[:40]!r}"
        seconds = max(0.0, (time.time() if now is None else now) - then.timestamp())
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds >= size:
                return f"{int(seconds // size)}{unit} ago"
        return f"{int(seconds)}s ago"


def attempt_flaw(data: dict[str, Any] | None) -> str:
    """Why ``attempt.json``'s parsed ``data`` is no attempt ("": it is one): what a torn,
    hand-edited or planted file lacks, as ``marin plan`` and the run's log name it."""
    if data is None:
        return "not a JSON object: torn, or edited by hand"
    number = data.get("number")
    if type(number) is not int or number < 1:
        return "its number is missing or not a whole number above 0"
    for key in ("fingerprint", "started_at", "holder"):
        if not isinstance(data.get(key), str):
            return f"its {key} is missing or not a string"
    return ""


@dataclass(frozen=True)
class UnreadableAttempt:
    """An ``attempt.json`` that is there but is no attempt (``why``): the recipe of the partial
    output beside it is unknown, so that output is cleared, never resumed on a guess."""

    why: str


CHECKPOINTS_WITHOUT_ATTEMPT = UnreadableAttempt("no attempt.json beside its checkpoint folder")
"""What ``marin plan`` reads for a resumable step with no record and no ``attempt.json`` but a
``checkpoints/`` folder: what is there is cleared by its first build (red team r19-5)."""


def _payload_of(payload: Any, fingerprint: str) -> str | None:
    """``payload`` when it is the one ``fingerprint`` hashes (the file is untrusted: a planted
    payload would name fields that never changed), else None."""
    if not isinstance(payload, str):
        return None
    try:
        digest = hashlib.sha256(payload.encode()).hexdigest()
    except UnicodeEncodeError:  # a lone surrogate from JSON
        return None
    return payload if digest == fingerprint else None


def load_attempt(location: Location, output_path: str) -> Attempt | UnreadableAttempt | None:
    """The step's ``attempt.json``: the attempt, ``UnreadableAttempt`` when it is there but
    malformed (torn, hand-edited, wrong types), or None when absent."""
    try:
        raw = location.read_file(location.path(attempt_path(output_path)))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    found = Attempt.parse(raw)
    if found is not None:
        return found
    return UnreadableAttempt(attempt_flaw(json_object(raw)) or "malformed")


def read_attempt_record(location: Location, output_path: str) -> Attempt | None:
    """The step's ``attempt.json``, or None when absent or malformed."""
    found = load_attempt(location, output_path)
    return found if isinstance(found, Attempt) else None


def write_attempt(location: Location, output_path: str, attempt: Attempt) -> None:
    """Write the step's ``attempt.json`` atomically (before ``fn`` runs, and when its job is
    known)."""
    write_atomic(location, location.path(attempt_path(output_path)), attempt.to_json())


def remove_attempt(location: Location, output_path: str) -> None:
    """Remove the step's ``attempt.json`` (after the commit), if it is there."""
    with contextlib.suppress(FileNotFoundError):
        location.rm_file(location.path(attempt_path(output_path)))


# --- cancel.json: ``marin cancel``'s intent, for the driver that holds the lease ----------------


@dataclass(frozen=True)
class CancelMark:
    """``marin cancel`` of a build: the driver holding the lease reads it before it submits a
    job and stops the build. It names the lease it was made for (``lease``: the holder's
    token, stable for one build), so a mark left from an earlier build never stops a later one
    (another lease, another token). Made while no driver held the lease (an Airflow task
    deferred on its job), it names no lease, only the job: it stops only a build that waits
    for that very job (``stops``), never a new one."""

    lease: str
    """The token of the lease whose build is cancelled ("": none was held)."""
    job_id: str = ""
    """The job ``job.json`` named when the mark was made ("" : none)."""
    at: str = ""
    by: str = ""
    """Who cancelled (``MARIN_USER``): shown, never trusted."""

    def stops(self, lease: str, awaited_job: str) -> bool:
        """Whether this mark cancels the build holding the lease token ``lease`` that waits
        for the job ``awaited_job`` ("": none): made for that lease, or naming that job."""
        return bool(self.lease and self.lease == lease) or bool(
            self.job_id and self.job_id == awaited_job
        )

    def to_json(self) -> bytes:
        body = {"lease": self.lease, "job_id": self.job_id, "at": self.at, "by": self.by}
        return (json.dumps(body, sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes) -> CancelMark | None:
        """The mark, or None for anything malformed (never raises): a torn or planted file
        is no mark, never a cancel of an unnamed build."""
        data = json_object(raw)
        if data is None:
            return None
        lease, job_id = data.get("lease"), data.get("job_id", "")
        at, by = data.get("at", ""), data.get("by", "")
        if not isinstance(job_id, str) or (job_id and not JOB_ID.fullmatch(job_id)):
            return None
        if not (isinstance(lease, str) and re.fullmatch(r"[0-9a-f]{8,64}|", lease)):
            return None  # a lease token is a hex id: anything else names no build
        if not (lease or job_id):
            return None  # names neither a lease nor a job: no build
        text = [v[:80] if isinstance(v, str) else "" for v in (at, by)]
        return cls(lease, job_id, *text)


def cancel_path(output_path: str) -> str:
    """``<output>.marin/cancel.json``: ``marin cancel``'s mark for the live driver."""
    return _in_folder(output_path, CANCEL_FILE)


def write_cancel_mark(location: Location, output_path: str, mark: CancelMark) -> None:
    """Record ``marin cancel``'s intent for the build ``mark`` names (``CancelMark.stops``)."""
    write_atomic(location, location.path(cancel_path(output_path)), mark.to_json())


def read_cancel_mark(location: Location, output_path: str) -> CancelMark | None:
    """The step's cancel mark; None when absent or malformed (logged: a planted or torn file
    cancels nothing). On local disk only a regular file is read (``has_file``: ``lstat``):
    a link, a FIFO or a folder under its name is no mark `marin cancel` writes, and never
    followed or opened.

    Raises:
        SymlinkError: a folder on the way to the step folder is a symbolic link (local disk).
        StorageError: storage kept failing.
    """
    path = location.path(cancel_path(output_path))
    if location.is_local and not location.has_file(path):
        if os.path.lexists(path):
            log.warning("ignoring %s: not a regular file, so not a cancel mark", path)
        return None
    try:
        raw = location.read_file(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except StorageError as exc:  # local: made a link or a FIFO since the look
        if not location.is_local:
            raise
        log.warning("ignoring %s: %s", path, exc.what)
        return None
    mark = CancelMark.parse(raw[:4096])
    if mark is None:
        log.warning("ignoring %s: not a cancel mark `marin cancel` writes", path)
    return mark


def remove_cancel_mark(location: Location, output_path: str) -> None:
    """Remove the step's cancel mark, if it is there (honoured, or stale)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
        location.rm_file(location.path(cancel_path(output_path)))


# --- registered.json: ``marin register``'s freeze mark ------------------------------------------


_MARK_IDS_KEPT = 256
"""How many ids a mark names at most (a planted mark never costs more reads than this)."""


@dataclass(frozen=True)
class RegisteredMark:
    """``marin register`` froze the build ``build_id`` of this step: it writes the mark, under
    the step's lease, before each manifest it creates, naming every id registered for that
    build. A build commit asks it before replacing a committed build in place
    (``builder/clearing.py``); a mark naming another build, or whose ids' manifests do not name
    this build (a registration that crashed before its manifest), freezes nothing."""

    build_id: str
    ids: tuple[str, ...]
    """The registered ids (``ns/name/tag``, checked by the registry when read)."""

    def to_json(self) -> bytes:
        body = {"build_id": self.build_id, "ids": list(self.ids)}
        return (json.dumps(body, sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes) -> RegisteredMark | None:
        """The mark, or None for anything malformed (never raises)."""
        data = json_object(raw)
        if data is None:
            return None
        build_id, ids = data.get("build_id"), data.get("ids")
        if not isinstance(build_id, str) or not build_id or not isinstance(ids, list):
            return None
        named = tuple(dict.fromkeys(i for i in ids if isinstance(i, str) and len(i) <= 400))
        return cls(build_id, named[:_MARK_IDS_KEPT])

    def adding(self, build_id: str, reg_id: str) -> RegisteredMark:
        """This mark with ``reg_id`` added for ``build_id`` (a mark of another build is stale:
        it is replaced)."""
        kept = self.ids if self.build_id == build_id else ()
        return RegisteredMark(build_id, tuple(dict.fromkeys((*kept, reg_id))))


def registered_path(output_path: str) -> str:
    """``<output>.marin/registered.json``: the build ``marin register`` froze."""
    return _in_folder(output_path, REGISTERED_FILE)


@dataclass(frozen=True)
class UnreadableMark:
    """A ``registered.json`` that is there but is no mark: torn, ``{}``, fields of the wrong
    type, a folder or a FIFO. It may have frozen a registered build, so it never reads as "not
    registered" (``registry.frozen``)."""

    path: str
    why: str


def load_registered_mark(
    location: Location, output_path: str
) -> RegisteredMark | UnreadableMark | None:
    """The step's freeze mark; ``UnreadableMark`` when the file is there but is not one; None
    when it is absent.

    Raises:
        SymlinkError: ``registered.json`` or a folder on the way to it is a symbolic link
            (local disk).
        StorageError: storage kept failing.
    """
    path = location.path(registered_path(output_path))
    try:
        raw = location.read_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (NotRegularFileError, IsADirectoryError):
        return UnreadableMark(path, "not a regular file")
    mark = RegisteredMark.parse(raw[: 1 << 16])
    return mark if mark is not None else UnreadableMark(path, "not a mark marin register writes")


def read_registered_mark(location: Location, output_path: str) -> RegisteredMark | None:
    """The step's freeze mark; None when absent or unreadable (logged): what ``marin
    register`` extends, replacing an unreadable one.

    Raises:
        SymlinkError: ``registered.json`` or a folder on the way to it is a symbolic link
            (local disk).
        StorageError: storage kept failing.
    """
    mark = load_registered_mark(location, output_path)
    if isinstance(mark, UnreadableMark):
        log.warning("ignoring %s: %s", mark.path, mark.why)
        return None
    return mark


def write_registered_mark(location: Location, output_path: str, mark: RegisteredMark) -> None:
    """Write the step's freeze mark atomically (``marin register``, under the step's lease).

    Raises:
        SymlinkError: a folder on the way to the file is a symbolic link (local disk).
        StorageError: storage kept failing.
    """
    write_atomic(location, location.path(registered_path(output_path)), mark.to_json())


# --- adopted.json: an adoption's step, whose output path Marin never wrote -----------------------


def adopted_mark_path(output_path: str) -> str:
    """``<output>.marin/adopted.json``: written by an adoption before its record."""
    return _in_folder(output_path, ADOPTED_FILE)


def write_adoption_mark(location: Location, output_path: str, source: str) -> None:
    """Say, beside the output path, that the step adopts ``source``: whatever lies there
    (that data, adopted in place, or data put there since) is not Marin's, and a build never
    clears it, even when the adoption's record is torn or deleted (``refuse_clearing_adopted``).

    Raises:
        SymlinkError: a folder on the way to the file is a symbolic link (local disk).
        StorageError: storage kept failing.
    """
    body = (json.dumps({ADOPTION: source}, sort_keys=True) + "\n").encode()
    write_atomic(location, location.path(adopted_mark_path(output_path)), body)


def has_adoption_mark(location: Location, output_path: str) -> bool:
    """Whether ``adopted.json`` is beside the output. Its presence is the mark, whatever it
    holds: a planted or torn one only makes a build refuse to clear (never delete)."""
    return location.has_file(location.path(adopted_mark_path(output_path)))


def remove_adoption_mark(location: Location, output_path: str) -> None:
    """Remove the mark (a build that may clear the output path: the data it marked is gone)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
        location.rm_file(location.path(adopted_mark_path(output_path)))
