"""An output digest as a value: what a record stores and what early cutoff compares.

Computing one (walking an output tree on disk or in a store) is ``output_digest()``'s; this
module holds only the value, its validation when read back from a record, and the comparisons,
so that the records and the decision can use it without importing storage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SCHEME = "tree3"
_CHECKSUMS = re.compile(r"^[a-z0-9+]{0,40}$")
_HEX64 = re.compile(r"[0-9a-f]{64}")
"""The 64 hex digits after ``tree3:`` (``fullmatch``: nothing more, no trailing newline)."""


@dataclass(frozen=True, slots=True)
class OutputDigest:
    """The digest of one output tree; ``digest`` is None when it cannot be known (``unknown``)."""

    digest: str | None
    files: int = 0
    bytes: int = 0
    unknown: str | None = None
    checksums: str = ""
    """How the files were summarised: ``sha256`` (content hashed), ``etag``, ``md5``,
    ``crc32c`` (the store's), joined by ``+`` when mixed; shown, never compared."""

    def to_record(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # no asdict deep copy

    @classmethod
    def from_record(cls, data: Any) -> OutputDigest:
        """A stored digest, validated: anything malformed loads as unknown, never raises."""
        if data is None:
            return cls(None, unknown="the record has no output digest (written before them)")
        if not isinstance(data, dict):
            return cls(None, unknown="the stored output digest is unreadable")
        digest, files, size = data.get("digest"), data.get("files"), data.get("bytes")
        unknown, checksums = data.get("unknown"), data.get("checksums", "")
        valid = (
            (digest is None or is_output_digest(digest))
            and type(files) is int
            and files >= 0
            and type(size) is int
            and size >= 0
            and (unknown is None or (isinstance(unknown, str) and len(unknown) <= 1000))
            and isinstance(checksums, str)
            and _CHECKSUMS.match(checksums) is not None
        )
        if not valid:
            return cls(None, unknown="the stored output digest is unreadable")
        assert isinstance(files, int) and isinstance(size, int)
        return cls(digest, files, size, unknown if digest is None else None, checksums)


def is_output_digest(value: Any) -> bool:
    """Whether ``value`` is a well-formed stored output digest (``tree1:`` and 64 hex digits)."""
    if not isinstance(value, str) or not value.startswith(SCHEME + ":"):
        return False
    return _HEX64.fullmatch(value, len(SCHEME) + 1) is not None


def same_output(consumed: OutputDigest | None, rebuilt: OutputDigest | None) -> bool:
    """Whether a rebuild produced exactly what a dependent consumed: both known and equal."""
    return (
        consumed is not None
        and rebuilt is not None
        and consumed.digest is not None
        and consumed.digest == rebuilt.digest
    )


def same_digest(consumed: str | None, rebuilt: OutputDigest) -> bool:
    """Whether a rebuild's output has the digest a dependent consumed (both known)."""
    return consumed is not None and consumed == rebuilt.digest
