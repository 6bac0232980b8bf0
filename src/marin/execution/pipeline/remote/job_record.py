"""``<version>.marin/job.json``: the one job of a remote step's build, written before it is
submitted, so that whoever holds the lease next reattaches to it instead of submitting again.

Written with a conditional create (``O_EXCL`` plus a hard link on local disk, so a reader never
sees half a file; ``pipe_file(mode="create")`` elsewhere: ``If-None-Match: *`` on S3,
``ifGenerationMatch=0`` on GCS): of two drivers racing past a lease, one write wins and the
other learns the winner's job. Only the lease holder deletes it (a job that failed, stopped or
vanished; or a record being rebuilt). What is read here is untrusted: a malformed file reads as
"no job" for the record's purposes only after it is reported.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any

from marin.execution.atomic_file import write_file_atomically
from marin.execution.pipeline.remote.protocol import JobHandle
from marin.execution.store.location import Location, with_retries
from marin.execution.store.records import metadata_dir

log = logging.getLogger("marin")

JOB_FILE = "job.json"
JOB_ID = re.compile(r"marin-[0-9a-f]{20}")
"""The ids Marin gives jobs (a backend's idempotency key); a record naming another is not
Marin's, and is never followed to a folder or a cluster."""


def job_path(output_path: str) -> str:
    return f"{metadata_dir(output_path)}/{JOB_FILE}"


@dataclass(frozen=True)
class JobRecord:
    """Which job builds (or built) a step: plain data, shown by ``marin plan`` and ``show``."""

    backend: str
    job_id: str
    build_id: str
    submitted_at: str
    data: dict[str, str]
    fingerprint: str = ""
    """The config the job runs: a job of another one is never reattached ("" if unknown)."""

    @property
    def handle(self) -> JobHandle:
        return JobHandle(self.backend, self.job_id, dict(self.data))

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "job_id": self.job_id,
            "build_id": self.build_id,
            "submitted_at": self.submitted_at,
            "data": dict(self.data),
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_json(cls, raw: Any) -> JobRecord | None:
        """The record in ``raw``, or None if it is not one (never trusts its shape)."""
        if not isinstance(raw, dict):
            return None
        fields = [raw.get(k) for k in ("backend", "job_id", "build_id", "submitted_at")]
        data = raw.get("data", {})
        if not all(isinstance(f, str) and f for f in fields) or not isinstance(data, dict):
            return None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            return None
        fingerprint = raw.get("fingerprint", "")
        backend, job_id, build_id, submitted_at = (str(f) for f in fields)
        return cls(
            backend, job_id, build_id, submitted_at, dict(data),
            fingerprint if isinstance(fingerprint, str) else "",
        )  # fmt: skip


def read_job(location: Location, output_path: str) -> JobRecord | None:
    """The step's job record, or None (absent, or not a job record: logged)."""
    path = location.path(job_path(output_path))
    try:
        raw = json.loads(location.read_file(path))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError as exc:
        log.warning("ignoring %s: not JSON (%s)", path, exc)
        return None
    found = JobRecord.from_json(raw)
    if found is None:
        log.warning("ignoring %s: not a job record", path)
    return found


def create_job(location: Location, output_path: str, record: JobRecord) -> JobRecord:
    """Write ``record`` unless a job record is there already; return the one that is there."""
    path = location.path(job_path(output_path))
    data = json.dumps(record.to_json(), sort_keys=True).encode()
    if _create(location, path, data):
        return record
    found = read_job(location, output_path)
    if found is None:
        raise FileExistsError(f"{path} exists but is not a job record; delete it by hand")
    return found


def replace_job(location: Location, output_path: str, record: JobRecord) -> None:
    """Overwrite the record (the lease holder, adding what ``submit`` returned)."""
    data = json.dumps(record.to_json(), sort_keys=True).encode()
    path = location.path(job_path(output_path))
    if location.is_local:
        write_file_atomically(path, data)
    else:
        location.put_file(path, data)


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
