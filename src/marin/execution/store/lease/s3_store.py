"""Leases on ``s3://`` (s3fs): conditional ``PutObject``/``DeleteObject`` with ``If-None-Match``
and ``If-Match``."""

from __future__ import annotations

from typing import Any

from fsspec.asyn import sync

from marin.execution.store.lease.store import ConditionalObjectStore
from marin.execution.store.location import with_retries


class _PreconditionFailed(Exception):
    """A conditional request lost its race (HTTP 412); never retried."""


def _precondition_failed(exc: OSError) -> bool:
    cause = exc.__cause__
    code = getattr(cause, "response", {}).get("Error", {}).get("Code") if cause else None
    return code in ("PreconditionFailed", "412") or "pre-condition" in str(exc).lower()


class S3LeaseStore(ConditionalObjectStore):
    """s3fs: ``If-None-Match: *`` to create, ``If-Match: <ETag>`` to replace and delete."""

    kind = "s3"

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        bucket, key = self._key(path)

        def call() -> Any:
            try:
                return self.fs.call_s3(method, Bucket=bucket, Key=key, **kwargs)
            except FileExistsError:
                raise _PreconditionFailed() from None
            except OSError as exc:
                if _precondition_failed(exc):
                    raise _PreconditionFailed() from None
                raise

        return with_retries(call, f"{method} {path}")

    def create(self, path: str, data: bytes) -> bool:
        try:
            self._call("put_object", path, Body=data, IfNoneMatch="*")
            return True
        except _PreconditionFailed:
            pass
        # A retried PUT whose first attempt landed also fails: the lease is ours if it holds our
        # bytes.
        found = self.read(path)
        return found is not None and found[0] == data

    def read(self, path: str) -> tuple[bytes, Any] | None:
        bucket, key = self._key(path)

        async def get() -> tuple[bytes, str]:
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            body = response["Body"]
            try:
                return await body.read(), response["ETag"]
            finally:
                body.close()

        try:
            raw, etag = with_retries(lambda: sync(self.fs.loop, get), f"read {path}")
        except (FileNotFoundError, NotADirectoryError):
            return None
        return raw, etag

    def _conditional(self, method: str, path: str, version: Any, data: bytes | None) -> bool:
        kwargs: dict[str, Any] = {"IfMatch": version}
        if data is not None:
            kwargs["Body"] = data
        try:
            self._call(method, path, **kwargs)
            return True
        except FileNotFoundError:
            return False
        except _PreconditionFailed:
            if data is None:
                return False
            found = self.read(path)  # a retried PUT whose first attempt landed
            return found is not None and found[0] == data

    def replace(self, path: str, data: bytes, version: Any) -> bool:
        return self._conditional("put_object", path, version, data)

    def delete(self, path: str, version: Any) -> bool:
        return self._conditional("delete_object", path, version, None)
