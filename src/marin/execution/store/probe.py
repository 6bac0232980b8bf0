"""Fail fast on storage that cannot be reached: one bounded probe of the prefix before planning.

Without it, ``marin plan --prefix gs://bucket/x`` on a machine without network spent minutes in
the storage libraries' own retries, printing their tracebacks, before a clean error. The probe
asks for the prefix once (``info``: a missing prefix is fine, it is only not built yet) on a
thread of its own and waits at most ``MARIN_STORAGE_PROBE_TIMEOUT`` seconds (0 turns it off);
the error then names the endpoint and the credentials that were tried. A file system that
connects when it is made (``ftp://``) is made within the same bound (``open_reachable``). Local
disk and ``memory://`` are never probed.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from marin.execution.errors import MarinError, StorageError, one_line
from marin.execution.store.location import Location, open_prefix, resolve_prefix

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
    """Raise ``StorageError`` unless the prefix's storage answers within ``timeout`` seconds.

    Raises:
        StorageError: it did not answer in time, or failed (naming the endpoint and the
            credentials tried); or ``$MARIN_STORAGE_PROBE_TIMEOUT`` is not a number.
    """
    if location.is_local or location.is_memory:
        return
    timeout = probe_timeout() if timeout is None else timeout
    if timeout == 0:
        return
    _bounded(lambda: _answer(location), timeout, location.url, lambda: describe_access(location))


def open_reachable(prefix: str | None = None, timeout: float | None = None) -> Location:
    """``open_prefix`` and ``probe_prefix`` as one bounded step: a file system that connects
    when it is made (``ftp://``, ``sftp://``) is made on the probe's thread, so a server that
    accepts a connection and never answers is the same one-line error after ``timeout``.

    Raises:
        StorageError: what ``open_prefix`` raises (the prefix refused as text before any
            wait), or what ``probe_prefix`` raises.
    """
    url = resolve_prefix(prefix)  # refused as text at once, never after a wait
    timeout = probe_timeout() if timeout is None else timeout
    if timeout == 0 or "://" not in url or url.startswith("memory://"):
        location = open_prefix(prefix)
        probe_prefix(location, timeout)
        return location

    made: list[Location] = []

    def open_and_ask() -> Location:
        made.append(open_prefix(prefix))
        _answer(made[0])
        return made[0]

    def tried() -> str:  # the endpoint and credentials, once the file system is made
        protocol = url.split("://", 1)[0]
        return describe_access(made[0]) if made else f"the {protocol}:// file system"

    return _bounded(open_and_ask, timeout, url, tried)


def _answer(location: Location) -> None:
    """One question to the storage: the prefix's ``info`` (missing is fine: nothing built)."""
    with contextlib.suppress(FileNotFoundError):  # reachable: nothing is built there yet
        location.fs.info(location.root)


T = TypeVar("T")


def _bounded(work: Callable[[], T], timeout: float, url: str, tried: Callable[[], str]) -> T:
    """``work()`` on a thread of its own, waited for at most ``timeout`` seconds; a failure
    other than Marin's own error is a ``StorageError`` naming ``url`` and what was ``tried``."""
    outcome: list[T] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def attempt() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # reported below, on the caller's thread
            failure.append(exc)
        finally:
            done.set()

    # A daemon thread: a probe stuck in a library's retries must not keep the process alive.
    threading.Thread(target=attempt, name="marin-storage-probe", daemon=True).start()
    fix = (
        "check the network, the endpoint and the credentials (-v shows the storage "
        f"library's log); {PROBE_TIMEOUT_ENV}=SECONDS waits longer, 0 skips this check"
    )
    if not done.wait(timeout):
        raise StorageError(
            f"storage for {url} did not answer within {timeout:g}s (tried {tried()})", fix
        )
    if failure:
        exc = failure[0]
        if isinstance(exc, MarinError):
            raise exc
        if isinstance(exc, PermissionError):
            fix = "check the credentials' permissions on this bucket and path"
        raise StorageError(
            f"storage for {url} cannot be reached: {one_line(exc)} (tried {tried()})", fix
        ) from exc
    return outcome[0]
