"""Step names and versions are path segments, so they are checked before they touch storage.

A name may contain ``/`` (``tokenized/wiki``); each segment must be safe on every fsspec backend
and must not climb out of the prefix or collide with the metadata beside an output.
"""

from __future__ import annotations

import re

from marin.execution.errors import InvalidStepError

METADATA_SUFFIX = ".marin"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_UNSAFE_CHARS = re.compile(r"[\s\x00-\x1f\x7f\\]")


def _check_segments(value: str, field: str, step: str, allow_slash: bool) -> None:
    fix = "use a path-like string such as 'tokenized/wiki' (letters, digits, '-', '_', '.')"
    if not value:
        raise InvalidStepError(f"{field} is empty", fix, step)
    if _UNSAFE_CHARS.search(value):
        raise InvalidStepError(
            f"{field} {value!r} contains whitespace, a backslash or a control character", fix, step
        )
    if _SCHEME.match(value) or "://" in value:
        raise InvalidStepError(
            f"{field} {value!r} looks like a URL",
            "give a relative name; set the prefix instead",
            step,
        )
    if value.startswith("/"):
        raise InvalidStepError(f"{field} {value!r} starts with '/'", fix, step)
    segments = value.split("/")
    if not allow_slash and len(segments) > 1:
        raise InvalidStepError(f"{field} {value!r} contains '/'", "use '.' or '-' instead", step)
    for segment in segments:
        if segment in ("", ".", ".."):
            raise InvalidStepError(
                f"{field} {value!r} has an empty, '.' or '..' segment", fix, step
            )
        if segment.endswith(METADATA_SUFFIX):
            raise InvalidStepError(
                f"{field} {value!r} has a segment ending in {METADATA_SUFFIX!r}",
                "that suffix is reserved for Marin's metadata; rename the segment",
                step,
            )


def validate_name(name: object) -> str:
    if not isinstance(name, str):
        raise InvalidStepError(f"name {name!r} is not a string", "pass name='some/name'")
    _check_segments(name, "name", name or "<empty>", allow_slash=True)
    return name


def validate_version(version: object, name: str) -> str:
    if not isinstance(version, str):
        raise InvalidStepError(
            f"version {version!r} is not a string", "pass version='v0' (any string)", name
        )
    _check_segments(version, "version", name, allow_slash=False)
    return version


def is_mutable_version(version: str) -> bool:
    """``dev`` and ``*-dev`` versions are works in progress: they rebuild on every run."""
    return version == "dev" or version.endswith("-dev")
