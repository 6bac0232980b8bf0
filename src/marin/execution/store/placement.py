"""Where a URL an adoption names (a record's ``source``) lies under a prefix, in every spelling
that names the same place: ``raw//v1`` is ``raw/v1``; on local disk, a link's real path too.
``marin gc`` keeps the builds an adopted source lies in, and ``marin register`` freezes them."""

from __future__ import annotations

import os


def spellings(url: str) -> set[str]:
    """``url`` with doubled slashes and ``.`` segments collapsed, and on local disk (a path or
    ``file://``) its real path too (links resolved, ``..`` applied)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    lead = "/" if rest.startswith("/") else ""
    path = lead + "/".join(p for p in rest.split("/") if p not in ("", "."))
    found = {f"{scheme}://{path}" if sep else path}
    if not sep or scheme == "file":
        real = os.path.realpath(path)
        found.add(f"file://{real}" if sep else real)
    return found


def relative_under(url: str, prefix_url: str) -> list[str]:
    """The paths below the prefix (relative, sorted) that ``url`` names in any spelling; empty
    when it lies elsewhere, is the prefix itself, or cannot be placed (a ``..`` in a URL)."""
    bases = {b.rstrip("/") + "/" for b in spellings(prefix_url) if b.strip("/")}
    found: set[str] = set()
    for spelling in spellings(url):
        if "/../" in spelling + "/":
            continue
        for base in bases:
            if spelling.startswith(base) and spelling[len(base) :].strip("/"):
                found.add(spelling[len(base) :].strip("/"))
    return sorted(found)
