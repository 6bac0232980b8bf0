"""Leases on ``gs://`` (gcsfs): uploads and deletes conditional on the object's generation."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from marin.execution.store.lease.store import ConditionalObjectStore
from marin.execution.store.location import with_retries


class GCSLeaseStore(ConditionalObjectStore):
    """gcsfs: every write and delete carries a generation precondition (``ifGenerationMatch``).

    ``0`` creates only if absent; the generation read with the content replaces or deletes only
    that version, so two runners taking over one expired lease can't both win (GCS answers the
    loser with HTTP 412, which gcsfs raises as ``FileExistsError``).
    """

    kind = "gcs"
    _BOUNDARY = "==marin-lease=="

    def _upload(self, path: str, data: bytes, generation: str) -> bool:
        """A one-request multipart upload that succeeds only if the object is at ``generation``."""
        bucket, key = self._key(path)
        boundary = self._BOUNDARY
        body = (
            (
                f"--{boundary}\nContent-Type: application/json; charset=UTF-8\n\n"
                f"{json.dumps({'name': key})}\n--{boundary}\n"
                "Content-Type: application/octet-stream\n\n"
            ).encode()
            + data
            + f"\n--{boundary}--".encode()
        )
        try:
            with_retries(
                lambda: self.fs.call(
                    "POST",
                    f"{self.fs._location}/upload/storage/v1/b/{{}}/o",
                    bucket,
                    uploadType="multipart",
                    ifGenerationMatch=generation,
                    headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
                    data=body,
                    json_out=True,
                ),
                f"write {path}",
            )
            return True
        except FileExistsError:
            # 412: someone else's version is there now. A retried request whose first attempt
            # landed also gets 412: the write is ours if the object holds our bytes.
            found = self.read(path)
            return found is not None and found[0] == data

    def create(self, path: str, data: bytes) -> bool:
        return self._upload(path, data, "0")

    def read(self, path: str) -> tuple[bytes, Any] | None:
        bucket, key = self._key(path)
        try:
            headers, raw = with_retries(
                lambda: self.fs.call("GET", "b/{}/o/{}", bucket, key, alt="media"), f"read {path}"
            )
        except (FileNotFoundError, NotADirectoryError):
            return None
        generation = headers.get("X-Goog-Generation")
        if not generation:
            # No generation, no compare-and-swap: a version nobody can match is the safe answer.
            return raw, "-1"
        return raw, str(generation)

    def replace(self, path: str, data: bytes, version: Any) -> bool:
        return self._upload(path, data, str(version))

    def delete(self, path: str, version: Any) -> bool:
        bucket, key = self._key(path)
        try:
            with_retries(
                lambda: self.fs.call(
                    "DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(version)
                ),
                f"delete {path}",
            )
        except (FileNotFoundError, FileExistsError):
            return False
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)
        return True
