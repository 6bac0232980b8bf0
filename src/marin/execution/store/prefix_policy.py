"""Which prefixes a worker may write to: ``MARIN_ALLOWED_PREFIXES``.

An engine parameter (Airflow's ``prefix`` param, the Prefect flow's ``prefix`` parameter) is chosen
by whoever triggers a run, and a prefix is where builds write and where failed attempts are
cleared. On a shared worker, set ``MARIN_ALLOWED_PREFIXES`` to the roots runs may use; a run whose
prefix is outside every root then fails in ``open_prefix``, before it touches storage. Unset, any
prefix is allowed (the single-user default).

Matching is textual and on whole path segments: root ``/data/team`` allows ``/data/team`` and
``/data/team/x`` but not ``/data/team2``. Nothing is resolved on disk, so a symlink inside a root
is trusted as the root's owner made it. A prefix with a ``.`` or ``..`` segment is refused rather
than normalised (``/data/team/link/..`` is not ``/data/team`` on disk). URL schemes and buckets are
compared exactly: ``gs://b/x`` does not allow ``gcs://b/x`` nor ``s3://b/x``.
"""

from __future__ import annotations

import os
import re

from marin.execution.errors import StorageError

ALLOWED_ENV = "MARIN_ALLOWED_PREFIXES"
_FIX = (
    f"use a prefix under one of the roots in {ALLOWED_ENV} on this worker, or ask the worker's "
    f"owner to add a root"
)


def _split(value: str) -> list[str]:
    """Roots are separated by commas or ``os.pathsep`` (``:`` on POSIX, but not the one in
    ``scheme://``)."""
    if os.pathsep == ":":
        parts = re.split(r",|:(?!//)", value)
    else:
        parts = re.split(rf",|{re.escape(os.pathsep)}", value)
    return [part.strip() for part in parts if part.strip()]


def _segments(url: str) -> tuple[str, list[str]]:
    """``(scheme, path segments)``; local paths (and ``file://``) have the scheme ``file``."""
    if "://" in url:
        scheme, _, rest = url.partition("://")
    else:
        scheme, rest = "file", url
    if scheme == "file":
        rest = os.path.abspath(os.path.expanduser(rest)) if rest else rest
        if os.sep != "/":
            rest = rest.replace(os.sep, "/")
    return scheme, [segment for segment in rest.split("/") if segment]


def _has_dot_segment(text: str) -> bool:
    path = text.partition("://")[2] if "://" in text else text
    return any(segment in (".", "..") for segment in re.split(r"[/\\]", path))


def allowed_roots() -> list[str] | None:
    """The configured roots, or None when the variable is unset (every prefix allowed)."""
    value = os.environ.get(ALLOWED_ENV)
    if value is None or not value.strip():
        return None
    roots = _split(value)
    for root in roots:
        if _has_dot_segment(root):
            raise StorageError(
                f"{ALLOWED_ENV} root {root!r} has a '.' or '..' segment",
                f"list absolute roots without '.' or '..' in {ALLOWED_ENV}",
            )
    return roots


def check_prefix(url: str, given: str | None = None) -> str:
    """Return ``url`` if it lies under an allowed root; raise ``StorageError`` otherwise.

    ``url`` is the resolved prefix (``resolve_prefix``); ``given`` is what the caller passed, if
    anything, so that a ``..`` that resolving would have folded away is still refused.
    """
    roots = allowed_roots()
    if roots is None:
        return url
    shown = given if given else url
    if _has_dot_segment(url) or (given and _has_dot_segment(given)):
        raise StorageError(
            f"prefix {shown!r} has a '.' or '..' segment, which {ALLOWED_ENV} does not allow",
            "give the prefix as a plain path under an allowed root",
        )
    scheme, segments = _segments(url)
    for root in roots:
        root_scheme, root_segments = _segments(root)
        if root_scheme == scheme and segments[: len(root_segments)] == root_segments:
            return url
    raise StorageError(
        f"prefix {shown!r} is outside the allowed roots ({', '.join(roots)})",
        _FIX,
    )
