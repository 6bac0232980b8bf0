"""Fail fast on storage that cannot be reached: one bounded probe of the prefix before planning.

Without it, ``marin plan --prefix gs://bucket/x`` on a machine without network spent minutes in
the storage libraries' own retries, printing their tracebacks, before a clean error. The probe
asks for the prefix once (``info``: a missing prefix is fine, it is only not built yet) on a
thread of its own and waits at most ``MARIN_STORAGE_PROBE_TIMEOUT`` seconds (0 turns it off);
the error then names the endpoint and the credentials that were tried. Local disk and
``memory://`` are never probed.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from marin.execution.errors import StorageError, one_line
from marin.execution.store.location import Location

PROBE_TIMEOUT_ENV = "MARIN_STORAGE_PROBE_TIMEOUT"
DEFAULT_PROBE_TIMEOUT_S = 15.0


def probe_timeout() -> float:
    """Seconds to wait for the probe (``$MARIN_STORAGE_PROBE_TIMEOUT``; 0: no probe)."""
    text = os.environ.get(PROBE_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_PROBE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise StorageError(
            f"{PROBE_TIMEOUT_ENV}={text!r} is not a number of seconds",
            f"set it to seconds such as 15, or 0 to skip the probe (default "
            f"{DEFAULT_PROBE_TIMEOUT_S:g})",
        )
    return value


def _env(*names: str) -> str | None:
    return next((f"${n}" for n in names if os.environ.get(n)), None)


def describe_access(location: Location) -> str:
    """Which endpoint and credentials the file system uses, as far as it says (never a secret)."""
    fs: Any = location.fs
    protocol = location.url.split("://", 1)[0]
    if protocol in ("s3", "s3a"):
        client = getattr(fs, "client_kwargs", None) or {}
        endpoint = (
            client.get("endpoint_url")
            or getattr(fs, "endpoint_url", None)
            or os.environ.get("FSSPEC_S3_ENDPOINT_URL")
            or os.environ.get("AWS_ENDPOINT_URL")
            or "the AWS default endpoint"
        )
        if getattr(fs, "anon", False):
            creds = "anonymous access"
        elif getattr(fs, "key", None):
            creds = "the key passed to s3fs"
        else:
            creds = (
                _env("AWS_ACCESS_KEY_ID", "FSSPEC_S3_KEY", "AWS_PROFILE")
                or "the AWS default credential chain (~/.aws, instance metadata)"
            )
            if creds.startswith("$"):
                creds = f"credentials from {creds}"
        return f"endpoint {endpoint}, {creds}"
    if protocol in ("gs", "gcs"):
        endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
        method = getattr(getattr(fs, "credentials", None), "method", None)
        source = _env("GOOGLE_APPLICATION_CREDENTIALS")
        creds = f"credentials from {source}" if source else f"credentials: {method or 'default'}"
        return f"endpoint {endpoint}, {creds}"
    return f"the {protocol}:// file system ({type(fs).__name__})"


def probe_prefix(location: Location, timeout: float | None = None) -> None:
    """Raise ``StorageError`` unless the prefix's storage answers within ``timeout`` seconds."""
    if location.is_local or location.is_memory:
        return
    timeout = probe_timeout() if timeout is None else timeout
    if timeout == 0:
        return
    failure: list[BaseException] = []
    done = threading.Event()

    def attempt() -> None:
        try:
            location.fs.info(location.root)
        except FileNotFoundError:
            pass  # reachable: nothing is built there yet
        except BaseException as exc:  # reported below, on the caller's thread
            failure.append(exc)
        finally:
            done.set()

    # A daemon thread: a probe stuck in a library's retries must not keep the process alive.
    threading.Thread(target=attempt, name="marin-storage-probe", daemon=True).start()
    tried = describe_access(location)
    fix = (
        "check the network, the endpoint and the credentials (-v shows the storage "
        f"library's log); {PROBE_TIMEOUT_ENV}=SECONDS waits longer, 0 skips this check"
    )
    if not done.wait(timeout):
        raise StorageError(
            f"storage for {location.url} did not answer within {timeout:g}s (tried {tried})", fix
        )
    if failure:
        exc = failure[0]
        if isinstance(exc, PermissionError):
            fix = "check the credentials' permissions on this bucket and path"
        raise StorageError(
            f"storage for {location.url} cannot be reached: {one_line(exc)} (tried {tried})", fix
        ) from exc
