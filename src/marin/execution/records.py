"""The record and status files beside an output.

For an output at ``<prefix>/<name>/<version>`` the metadata lives in the sibling folder
``<prefix>/<name>/<version>.marin/``: ``record.json`` (the commit point), ``status.json``,
``lease.json`` and ``log.txt``. Keeping it beside rather than inside the output lets ``fn`` write
a single file at its output path, and lets a rebuild clear the output without touching the lease.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from marin.execution import faults
from marin.execution.names import METADATA_SUFFIX
from marin.execution.storage import Location, durable, open_local, with_retries

log = logging.getLogger("marin")

RECORD_SCHEMA = 1
RUNNING, SUCCESS, FAILED = "RUNNING", "SUCCESS", "FAILED"


def metadata_dir(output_path: str) -> str:
    return output_path + METADATA_SUFFIX


def record_path(output_path: str) -> str:
    return f"{metadata_dir(output_path)}/record.json"


def status_path(output_path: str) -> str:
    return f"{metadata_dir(output_path)}/status.json"


def lease_path(output_path: str) -> str:
    return f"{metadata_dir(output_path)}/lease.json"


def log_path(output_path: str) -> str:
    return f"{metadata_dir(output_path)}/log.txt"


@dataclass(frozen=True)
class ArtifactRecord:
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

    @property
    def step_id(self) -> str:
        return f"{self.name}@{self.version}"

    def to_json(self, indent: int | None = None) -> str:
        """Sorted-key JSON; compact by default, because ``indent`` makes ``json`` fall back to its
        pure-Python encoder, which was the largest single cost of a commit. ``marin show --json``
        pretty-prints."""
        # A shallow field dict: the values are already plain JSON data (asdict deep-copies them).
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return json.dumps(fields, sort_keys=True, indent=indent, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ArtifactRecord:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
            raise ValueError(f"not a schema-{RECORD_SCHEMA} record")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def read_record(location: Location, output_path: str) -> ArtifactRecord | None:
    """The committed record, or None. A corrupt record counts as not built, with a warning."""
    path = location.path(record_path(output_path))
    try:
        raw = with_retries(lambda: location.fs.cat_file(path), f"read {path}")
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return ArtifactRecord.from_json(raw.decode())
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        log.warning("corrupt record %s (%s): treating %s as not built", path, exc, output_path)
        return None


TMP_MARK = ".tmp-"


def write_atomic(
    location: Location, path: str, data: bytes, *, crash_step: str = "", durable: bool = False
) -> None:
    """Write so that readers see the old content or the new, never a prefix of it.

    Object stores and ``memory://`` make a single put atomic. On local disk a crash mid-write
    would leave a truncated file, so we write a temporary sibling and rename it into place (a
    crash leaves only the temporary file, which the next build of the step clears).
    ``crash_step`` names the step for the ``record-write`` / ``record-torn`` fault hooks.
    ``durable`` fsyncs the file (durable mode, ``MARIN_DURABLE=1``, for records).
    """
    fs = location.fs
    if crash_step and faults.should_crash("record-torn", crash_step):
        fs.pipe_file(path, data[: len(data) // 2])  # what a non-atomic store could leave
        faults.crash_now()
    if location.is_local:
        tmp = f"{path}{TMP_MARK}{uuid.uuid4().hex}"
        with open_local(tmp, "wb") as f:
            if crash_step and faults.should_crash("record-write", crash_step):
                f.write(data[: len(data) // 2])
                f.flush()
                faults.crash_now()
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    else:
        if crash_step and faults.should_crash("record-write", crash_step):
            faults.crash_now()  # a single PUT is all or nothing: the crash leaves no record
        location.put_file(path, data)


def write_record(location: Location, record: ArtifactRecord, output_path: str) -> None:
    write_atomic(
        location,
        location.path(record_path(output_path)),
        record.to_json().encode(),
        crash_step=record.step_id,
        durable=durable(),
    )


def clear_metadata_debris(location: Location, output_path: str) -> None:
    """Remove temporary record files a crashed local write left beside the output."""
    if not location.is_local:
        return  # object stores and memory:// write records in one put: no temporary files
    folder = location.path(metadata_dir(output_path))
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        if name.startswith("record.json" + TMP_MARK):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))


def delete_record(location: Location, output_path: str) -> bool:
    """Remove the record; True if there was one (its output is then an earlier build's)."""
    path = location.path(record_path(output_path))
    try:
        with_retries(lambda: location.fs.rm_file(path), f"delete {path}")
    except FileNotFoundError:
        return False
    return True


def _read_json(location: Location, path: str) -> dict[str, Any] | None:
    try:
        raw = with_retries(lambda: location.fs.cat_file(path), f"read {path}")
        data = json.loads(raw.decode())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_status_file(location: Location, output_path: str) -> dict[str, Any] | None:
    """The status file alone: written only when an attempt fails (``FAILED``), or by older
    versions (``RUNNING``/``SUCCESS``)."""
    return _read_json(location, location.path(status_path(output_path)))


def read_status(location: Location, output_path: str) -> dict[str, Any] | None:
    """The step's state, for readers (``plan``, ``ls``, ``show``); None if nothing was tried.

    A build writes no status of its own when all goes well, to keep the commit path short: its
    lease *is* its RUNNING status (held while it builds, left behind if it crashed), a failure
    writes a ``FAILED`` status file, and the record is the ``SUCCESS``. So: a lease means
    ``RUNNING``; else the status file; else a record means ``SUCCESS``. An unreadable lease
    protects nothing and says nothing, as in ``Lease``.
    """
    lease = _read_json(location, location.path(lease_path(output_path)))
    if lease is not None and isinstance(lease.get("holder"), str):
        return {
            "state": RUNNING,
            "holder": lease["holder"],
            "started_at": lease.get("started_at"),
            "lease_expires_at": lease.get("expires_at"),
        }
    status = read_status_file(location, output_path)
    if status is not None:
        return status
    record = read_record(location, output_path)
    if record is None:
        return None
    return {"state": SUCCESS, "started_at": record.started_at, "finished_at": record.finished_at}


def clear_status(location: Location, output_path: str) -> bool:
    """At the start of an attempt: drop an earlier attempt's status file; True if there was one.

    While this attempt runs its lease says RUNNING; if it fails it writes a new FAILED status;
    if it commits, the record says SUCCESS; so an old status could only contradict it. On local
    disk a failed unlink is cheaper than finding out first; elsewhere one read tells.
    """
    path = location.path(status_path(output_path))
    if not location.is_local and read_status_file(location, output_path) is None:
        return False
    try:
        if location.is_local:
            os.unlink(path)
        else:
            with_retries(lambda: location.fs.rm_file(path), f"delete {path}")
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def write_status(location: Location, output_path: str, state: str, **details: Any) -> None:
    body = {"state": state, **details}
    write_atomic(
        location,
        location.path(status_path(output_path)),
        (json.dumps(body, sort_keys=True) + "\n").encode(),
    )
