"""Step names and versions are path segments, so they are checked before they touch storage.

This docstring is the one statement of the grammar (``docs/reliability.md`` links here). A name
is one or more segments joined by ``/`` (``tokenized/wiki``); a version is a single segment
(``v1``, ``2024-06-01``: no ``/``). The rule behind every check: a step id names exactly one
location, on every backend fsspec reaches and on every common file system, and looks like what
it is. Each segment:

- is not empty, ``.`` or ``..``, and does not end in ``.marin`` in any letter case (reserved for
  metadata: on a case-insensitive disk ``v1.MARIN`` is the metadata folder of ``v1``);
- does not end in ``.`` (Windows and SMB drop a trailing dot, so ``v1.`` is ``v1`` there);
- is not a Windows device name (``CON``, ``PRN``, ``AUX``, ``NUL``, ``COM0``-``COM9``,
  ``LPT0``-``LPT9``, ``CONIN$``, ``CONOUT$``, in any case, also before an extension:
  ``con.txt``), which names a device there, not a file;
- is at most 255 bytes in UTF-8 (the limit of one path component on common file systems);
- has no whitespace, backslash, or glob character (``*``, ``?``, ``[``, ``]``): fsspec expands
  those on ``memory://``, ``s3://`` and ``gs://``, so a name like ``**`` or ``grid[0]`` once
  matched other steps' outputs (storage also treats every path literally: this is defence in
  depth);
- has no ``:``: fsspec reads ``::`` in any URL as a chain of file systems (``P/model/0::``
  opens ``P/model/0``, another step's output), and on Windows ``a:b`` is the data stream ``b``
  of the file ``a``. Windows also refuses ``<``, ``>``, ``"`` and ``|`` in file names, but a
  build there fails loudly instead of landing in another step's folder, so they are allowed;
- has no character that looks like a path separator, a glob character or ``:``: full-width
  forms (solidus U+FF0F, reverse solidus U+FF3C, colon U+FF1A..., whatever NFKC maps onto one)
  and the slashes and colons of mathematics and typography (division slash U+2215, fraction
  slash U+2044, big solidus U+29F8, set minus U+2216, ratio U+2236, modifier letter colon
  U+A789...): ``team`` U+FF0F ``exp`` would print as ``team/exp``;
- has no control, format, private-use, surrogate or unassigned character, nor a line or
  paragraph separator (Unicode categories ``C*``, ``Zl``, ``Zp``): zero-width spaces and bidi
  overrides make two different names look alike;
- is in Unicode NFC form, so ``café`` typed two ways can't become two steps.

The whole name must not look like a URL (``gs://...``) or start with ``/``. Anything else
(letters of any script, digits, ``-``, ``_``, ``.`` inside a segment, ``=``, ``,``, ``@``...) is
allowed, but for ``@`` in a version: a step's id is ``name@version``, read at its last ``@``.
Case is kept, but two steps of one graph whose paths differ only in case (``Data@v1`` and
``data@v1``) are refused by ``lower()`` (``graph.check_disjoint_outputs``): on macOS and
Windows disks they are one folder. The prefix, which is not a name, is checked in
``storage.resolve_prefix``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from marin.execution.errors import InvalidStepError

METADATA_SUFFIX = ".marin"
MAX_SEGMENT_BYTES = 255
GLOB_CHARS = "*?[]"
# Characters that print like '/', '\' or ':' without NFKC mapping them onto one (U+A789 is what
# some tools write for a ':' on Windows).
LOOKALIKE_CHARS = frozenset(
    "\u2044\u2215\u2216\u2236\u2571\u2572\u29f5\u29f6\u29f8\u29f9\u1735\ua789"
)
# A non-ASCII character whose NFKC form holds one of these is a look-alike (U+FF0F is '/').
_RESERVED_AFTER_NFKC = frozenset("/\\:" + GLOB_CHARS)
DEVICE_NAMES = frozenset(
    ["con", "prn", "aux", "nul", "conin$", "conout$"]
    + [f"{kind}{n}" for kind in ("com", "lpt") for n in [*"0123456789", "¹", "²", "³"]]
)
_UNSAFE_CHARS = re.compile(r"[\s\x00-\x1f\x7f\\]")
_EXAMPLE = {"name": "tokenized/wiki", "version": "v1"}
_ADVICE = {
    "name": "use a path-like name: letters, digits, - _ . and = in segments joined by /",
    "version": "use a single segment: letters, digits, - _ . and =, no /",
}
_Problem = tuple[str, str, Callable[[str], str]]
"""What is wrong, how to fix it, and a function that fixes it (used to suggest a valid value)."""


def _invisible(value: str) -> str | None:
    """The first character that is a control, format or otherwise invisible code point."""
    for char in value:
        category = unicodedata.category(char)
        if category[0] == "C" or category in ("Zl", "Zp"):
            return char
    return None


def _lookalike(value: str) -> str | None:
    """The first character that prints as (or normalises to) a separator or reserved char."""
    for char in value:
        if char in LOOKALIKE_CHARS or (
            not char.isascii()
            and _RESERVED_AFTER_NFKC.intersection(unicodedata.normalize("NFKC", char))
        ):
            return char
    return None


def _each_segment(fix: Callable[[str], str]) -> Callable[[str], str]:
    return lambda value: "/".join(fix(segment) for segment in value.split("/"))


def _character_problem(value: str, field: str) -> _Problem | None:
    if _UNSAFE_CHARS.search(value):
        return (
            f"{field} {value!r} contains whitespace, a backslash or a control character",
            _ADVICE[field],
            lambda v: _UNSAFE_CHARS.sub("-", v),
        )
    glob = next((c for c in value if c in GLOB_CHARS), None)
    if glob is not None:
        return (
            f"{field} {value!r} contains the glob character {glob!r}",
            "storage would read it as a pattern; use - _ . or = instead",
            lambda v: "".join("-" if c in GLOB_CHARS else c for c in v),
        )
    if value.isascii():  # _UNSAFE_CHARS caught ASCII's controls; ASCII is NFC: skip the scans
        return None
    hidden = _invisible(value)
    if hidden is not None:
        return (
            f"{field} {value!r} contains the invisible or control character "
            f"U+{ord(hidden):04X} ({unicodedata.name(hidden, 'unnamed')})",
            "remove it: names must read the same as they print",
            lambda v: "".join(c for c in v if _invisible(c) is None),
        )
    if unicodedata.normalize("NFC", value) != value:
        return (
            f"{field} {value!r} is not in Unicode NFC form",
            "normalise it first with unicodedata.normalize('NFC', ...)",
            lambda v: unicodedata.normalize("NFC", v),
        )
    return None


def _portability_problem(value: str, field: str) -> _Problem | None:
    """Characters that mean something else to fsspec or Windows, or look like a separator."""
    if ":" in value:
        return (
            f"{field} {value!r} contains ':' (fsspec reads '::' as a chain of file systems, "
            "Windows a ':' as a data stream: either opens another step's path)",
            "use - _ . or = instead",
            lambda v: v.replace(":", "-"),
        )
    lookalike = None if value.isascii() else _lookalike(value)
    if lookalike is not None:
        return (
            f"{field} {value!r} contains U+{ord(lookalike):04X} "
            f"({unicodedata.name(lookalike, 'unnamed')}), which looks like a path separator "
            "or a reserved character",
            "use - or _ instead" + (", or / to nest a name" if field == "name" else ""),
            lambda v: "".join("-" if _lookalike(c) else c for c in v),
        )
    return None


def _shorten(segment: str, limit: int) -> str:
    return segment.encode("utf-8")[:limit].decode("utf-8", "ignore")


def _segment_problem(segment: str, value: str, field: str, limit: int) -> _Problem | None:
    if segment in ("", ".", ".."):
        return (
            f"{field} {value!r} has an empty, '.' or '..' segment",
            _ADVICE[field],
            lambda v: "/".join(s for s in v.split("/") if s not in ("", ".", "..")),
        )
    if segment.casefold().endswith(METADATA_SUFFIX):
        return (
            f"{field} {value!r} has a segment ending in {segment[-len(METADATA_SUFFIX) :]!r}",
            "that suffix is reserved (in any letter case) for Marin's metadata; rename the segment",
            _each_segment(
                lambda s: (
                    s[: -len(METADATA_SUFFIX)] + "-marin"
                    if s.casefold().endswith(METADATA_SUFFIX)
                    else s
                )
            ),
        )
    if segment.endswith("."):
        return (
            f"{field} {value!r} has a segment ending in '.' ({segment!r})",
            "Windows drops a trailing dot, which makes it another path; end it with a letter "
            "or digit",
            _each_segment(lambda s: s.rstrip(".")),
        )
    if segment.split(".", 1)[0].casefold() in DEVICE_NAMES:
        return (
            f"{field} {value!r} has the segment {segment!r}, a reserved device name on Windows",
            "rename the segment",
            _each_segment(
                lambda s: (
                    s.replace(".", "_.", 1) + ("" if "." in s else "_")
                    if s.split(".", 1)[0].casefold() in DEVICE_NAMES
                    else s
                )
            ),
        )
    size = len(segment.encode("utf-8"))
    if size > limit:
        return (
            f"{field} has a path segment of {size} bytes ({segment[:40]!r}...), over the "
            f"limit of {limit}",
            "shorten it: one path segment must fit in 255 bytes on every file system",
            _each_segment(lambda s: _shorten(s, limit)),
        )
    return None


def _problem(value: str, field: str) -> _Problem | None:
    """The first thing wrong with ``value`` as a name or a version, or None."""
    if not value:
        return (f"{field} is empty", _ADVICE[field], lambda v: _EXAMPLE[field])
    found = _character_problem(value, field)
    if found is not None:
        return found
    if "://" in value:
        return (
            f"{field} {value!r} looks like a URL",
            "give a relative name; set the prefix instead",
            lambda v: v.split("://", 1)[1],
        )
    if value.startswith("/"):
        return (f"{field} {value!r} starts with '/'", _ADVICE[field], lambda v: v.lstrip("/"))
    found = _portability_problem(value, field)  # ':' included: 'c:' and 'lr:0.1' end here
    if found is not None:
        return found
    segments = value.split("/")
    if field == "version" and "@" in value:
        return (
            f"{field} {value!r} contains '@'",
            "a step's id is name@version, so an '@' in the version would give two steps one id "
            "(a@b with version v1, a with version b@v1); use - or . instead",
            lambda v: v.replace("@", "-"),
        )
    if field == "version" and len(segments) > 1:
        return (
            f"{field} {value!r} contains '/'",
            "use . or - instead",
            lambda v: v.replace("/", "-"),
        )
    # The metadata folder adds ".marin" to the version segment: keep room for it.
    limit = MAX_SEGMENT_BYTES - (len(METADATA_SUFFIX) if field == "version" else 0)
    for segment in segments:
        found = _segment_problem(segment, value, field, limit)
        if found is not None:
            return found
    return None


def suggest_valid(value: str, field: str) -> str:
    """A valid value close to ``value``: each problem's own fix applied until none is left."""
    for _ in range(12):  # each fix removes one kind of problem; there are fewer kinds than this
        found = _problem(value, field)
        if found is None:
            return value
        value = found[2](value)
    return _EXAMPLE[field]


def _check(value: str, field: str, step: str) -> None:
    found = _problem(value, field)
    if found is not None:
        what, advice, _ = found
        raise InvalidStepError(what, f"{advice} (e.g. {suggest_valid(value, field)!r})", step)


def validate_name(name: object) -> str:
    if not isinstance(name, str):
        raise InvalidStepError(f"name {name!r} is not a string", "pass name='some/name' (a string)")
    _check(name, "name", name or "<empty>")
    return name


def validate_version(version: object, name: str) -> str:
    if not isinstance(version, str):
        raise InvalidStepError(
            f"version {version!r} is not a string", "pass version='v0' (a string)", name
        )
    _check(version, "version", name)
    return version


def is_mutable_version(version: str) -> bool:
    """``dev`` and ``*-dev`` versions are works in progress: they rebuild on every run."""
    return version == "dev" or version.endswith("-dev")
