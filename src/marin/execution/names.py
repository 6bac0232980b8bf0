"""Step names and versions are path segments, so they are checked before they touch storage.

This docstring is the one statement of the grammar (``docs/reliability.md`` links here). A name
is one or more segments joined by ``/`` (``tokenized/wiki``); a version is a single segment.
Each segment:

- is not empty, ``.`` or ``..``, and does not end in ``.marin`` (reserved for metadata);
- is at most 255 bytes in UTF-8 (the limit of one path component on common file systems);
- has no whitespace, backslash, or glob character (``*``, ``?``, ``[``, ``]``): fsspec expands
  those on ``memory://``, ``s3://`` and ``gs://``, so a name like ``**`` or ``grid[0]`` once
  matched other steps' outputs (storage also treats every path literally: this is defence in
  depth);
- has no control, format, private-use, surrogate or unassigned character, nor a line or
  paragraph separator (Unicode categories ``C*``, ``Zl``, ``Zp``): zero-width spaces and bidi
  overrides make two different names look alike;
- is in Unicode NFC form, so ``café`` typed two ways can't become two steps.

The whole name must not look like a URL (``gs://...``, ``c:``) or start with ``/``. Anything
else (letters of any script, digits, ``-``, ``_``, ``.``, ``=``, ``,``, ``@``...) is allowed.
"""

from __future__ import annotations

import re
import unicodedata

from marin.execution.errors import InvalidStepError

METADATA_SUFFIX = ".marin"
MAX_SEGMENT_BYTES = 255
GLOB_CHARS = "*?[]"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_UNSAFE_CHARS = re.compile(r"[\s\x00-\x1f\x7f\\]")
_NAME_FIX = "use a path-like string such as 'tokenized/wiki' (letters, digits, '-', '_', '.')"
# A version is one segment: the name's example, with its '/', would be wrong advice there.
_VERSION_FIX = "use one path segment such as 'v2' (letters, digits, '-', '_', '.'; no '/')"


def _fix(field: str) -> str:
    return _VERSION_FIX if field == "version" else _NAME_FIX


def _invisible(value: str) -> str | None:
    """The first character that is a control, format or otherwise invisible code point."""
    for char in value:
        category = unicodedata.category(char)
        if category[0] == "C" or category in ("Zl", "Zp"):
            return char
    return None


def _check_characters(value: str, field: str, step: str) -> None:
    if _UNSAFE_CHARS.search(value):
        raise InvalidStepError(
            f"{field} {value!r} contains whitespace, a backslash or a control character",
            _fix(field),
            step,
        )
    glob = next((c for c in value if c in GLOB_CHARS), None)
    if glob is not None:
        raise InvalidStepError(
            f"{field} {value!r} contains the glob character {glob!r}",
            "storage would read it as a pattern; use '-', '_', '.' or '=' instead "
            "(e.g. 'grid-0' for 'grid[0]')",
            step,
        )
    hidden = _invisible(value)
    if hidden is not None:
        raise InvalidStepError(
            f"{field} {value!r} contains the invisible or control character "
            f"U+{ord(hidden):04X} ({unicodedata.name(hidden, 'unnamed')})",
            "remove it: names must read the same as they print",
            step,
        )
    if unicodedata.normalize("NFC", value) != value:
        raise InvalidStepError(
            f"{field} {value!r} is not in Unicode NFC form",
            "normalise it first: unicodedata.normalize('NFC', name)",
            step,
        )


def _check_segments(value: str, field: str, step: str, allow_slash: bool) -> None:
    if not value:
        raise InvalidStepError(f"{field} is empty", _fix(field), step)
    _check_characters(value, field, step)
    if _SCHEME.match(value) or "://" in value:
        raise InvalidStepError(
            f"{field} {value!r} looks like a URL",
            "give a relative name; set the prefix instead",
            step,
        )
    if value.startswith("/"):
        raise InvalidStepError(f"{field} {value!r} starts with '/'", _fix(field), step)
    segments = value.split("/")
    if not allow_slash and len(segments) > 1:
        raise InvalidStepError(f"{field} {value!r} contains '/'", "use '.' or '-' instead", step)
    for segment in segments:
        if segment in ("", ".", ".."):
            raise InvalidStepError(
                f"{field} {value!r} has an empty, '.' or '..' segment", _fix(field), step
            )
        if segment.endswith(METADATA_SUFFIX):
            raise InvalidStepError(
                f"{field} {value!r} has a segment ending in {METADATA_SUFFIX!r}",
                "that suffix is reserved for Marin's metadata; rename the segment",
                step,
            )
        size = len(segment.encode("utf-8"))
        # The metadata folder adds ".marin" to the version segment: keep room for it.
        limit = MAX_SEGMENT_BYTES - (0 if allow_slash else len(METADATA_SUFFIX))
        if size > limit:
            raise InvalidStepError(
                f"{field} has a path segment of {size} bytes ({segment[:40]!r}...), over the "
                f"limit of {limit}",
                "shorten it: one path segment must fit in 255 bytes on every file system",
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
