"""Where a URL an adoption names (a record's ``source``) lies under a prefix, in every spelling
that names the same place: ``raw//v1`` is ``raw/v1``; on local disk, a link's real path too.
``marin gc`` keeps the builds an adopted source lies in, ``marin register`` freezes them, and an
adoption records the builds it adopts (``adopted_builds``): rebuilding one makes it stale."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from marin.execution.errors import MarinError
from marin.execution.names import validate_name

if TYPE_CHECKING:
    from marin.execution.store.location import Location
    from marin.execution.store.records import ArtifactRecord


def spellings(url: str) -> set[str]:
    """``url`` with doubled slashes and ``.`` segments collapsed, and on local disk (a path or
    ``file://``) its real path too (links resolved, ``..`` applied)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    lead = "/" if rest.startswith("/") else ""
    path = lead + "/".join(p for p in rest.split("/") if p not in ("", "."))
    found = {f"{scheme}://{path}" if sep else path}
    if not sep or scheme in _LOCAL_SCHEMES:
        real = os.path.realpath(path)
        found.add(f"file://{real}" if sep else real)
        if sep:  # a local URL names the bare path too (a prefix is mostly given as one)
            found |= {path, real}
    return found


_LOCAL_SCHEMES = ("file", "local")


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


def overlaps_output(location: Location, output_path: str, source_url: str) -> bool:
    """Whether an adoption's data at ``source_url`` is its own output path (adopted in place),
    or holds it or lies inside it: clearing that output path would delete adopted data."""
    out = output_path.strip("/")
    return any(
        rel == out or rel.startswith(out + "/") or out.startswith(rel + "/")
        for rel in relative_under(source_url, location.url)
    )


def adopted_builds(
    location: Location, output_path: str, source_url: str
) -> dict[str, ArtifactRecord]:
    """The builds under the prefix (output path -> record) that the data an adoption at
    ``output_path`` reads from ``source_url`` lies in (the source, or a folder above it) or
    holds (found by listing the source: asked when an adoption commits and when one is
    registered, never while planning). Never the adoption's own output (adopted in place)."""
    from marin.execution.store.records import read_record

    found: dict[str, ArtifactRecord] = {}
    for rel in relative_under(source_url, location.url):
        found.update(_lying_in(location, output_path, rel))
        for path in _held_builds(location, rel):
            stored = read_record(location, path) if path != output_path else None
            if stored is not None and stored.build_id:
                found[path] = stored
    return found


def _held_builds(location: Location, relative: str) -> list[str]:
    """The output paths of builds whose record lies under ``relative`` (one literal listing)."""
    return [path for path, built in _step_folders(location, relative).items() if built]


def _step_folders(location: Location, relative: str) -> dict[str, bool]:
    """The output paths under ``relative`` with a metadata folder beside them -> whether it
    holds a record (one literal listing)."""
    from marin.execution.names import METADATA_SUFFIX
    from marin.execution.store.step_folder import RECORD_FILE

    base = location.path(relative)
    found: dict[str, bool] = {}
    for file in location.list_tree(base):
        folder, _, name = file[len(base) :].rpartition("/")
        if file.startswith(base + "/") and folder.endswith(METADATA_SUFFIX):
            path = relative + folder[: -len(METADATA_SUFFIX)]
            found[path] = found.get(path, False) or name == RECORD_FILE
    return found


def unbuilt_step_folders(location: Location, output_path: str, source_url: str) -> dict[str, bool]:
    """The output paths the data an adoption at ``output_path`` reads from ``source_url`` lies
    in or holds whose metadata folder holds no record (output path -> whether a runner builds
    it now: a live lease): that step's next build, or the one under way, clears what lies
    there. An adoption's folder (its mark, or its lease) is none: no build clears it. Asked
    when an adoption commits."""
    from marin.execution.names import METADATA_SUFFIX
    from marin.execution.store.lease import read_lease
    from marin.execution.store.step_folder import has_adoption_mark, names_adoption, record_path

    found: dict[str, bool] = {}
    for rel in relative_under(source_url, location.url):
        parts = rel.split("/")
        above = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
        candidates = [p for p in above if location.exists(location.path(p + METADATA_SUFFIX))]
        candidates += [p for p, built in _step_folders(location, rel).items() if not built]
        for path in candidates:
            if path == output_path or path in found:
                continue
            try:
                path = validate_name(path)
            except MarinError:
                continue
            if location.has_file(location.path(record_path(path))) or has_adoption_mark(
                location, path
            ):
                continue  # a build; or an adoption's folder, whose mark no build clears
            info = read_lease(location, path)
            if info is not None and names_adoption(info.raw):
                continue  # an adoption under way: it never writes there
            found[path] = info is not None and info.live
    return found


def adopted_inputs(builds: dict[str, ArtifactRecord]) -> dict[str, str]:
    """``adopted_builds`` as an adoption's record names them in ``inputs`` (step id -> build,
    for lineage: two builds of one step, two pins say, are one entry there)."""
    return {record.step_id: record.build_id for record in builds.values()}


ADOPTED = "adopted"
"""The key of an adoption record's ``extra``: each build it adopts, output path -> build id."""


def recorded_adoption(record: ArtifactRecord) -> dict[str, str]:
    """The builds the adoption ``record`` adopted (output path -> build id), as stored (untrusted:
    anything malformed is none, which a plan then finds stale if its source lies in a build)."""
    found = record.extra.get(ADOPTED)
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        return {}
    return dict(found)


def adopted_now(location: Location, output_path: str, record: ArtifactRecord) -> dict[str, str]:
    """The builds the adoption ``record`` (at ``output_path``) adopts now, output path ->
    build id, as cheaply as a plan must: each build it recorded, read again where it lies
    (absent when it is gone), and the build its source lies in. A rebuild of any of them
    changes the answer, so the adoption is stale (``decide``)."""
    from marin.execution.store.records import read_record

    now: dict[str, str] = {}
    for path in recorded_adoption(record):
        try:
            path = validate_name(path)  # relative and literal: never a URL from the record
        except MarinError:
            continue
        stored = read_record(location, path) if path != output_path else None
        if stored is not None and stored.build_id:
            now[path] = stored.build_id
    source = record.source
    for rel in relative_under(source, location.url) if source is not None else []:
        now.update({p: r.build_id for p, r in _lying_in(location, output_path, rel).items()})
    return now


def _lying_in(location: Location, output_path: str, relative: str) -> dict[str, ArtifactRecord]:
    """The build ``relative`` (below the prefix) is, or lies in: the nearest folder at or
    above it with a record beside it, other than ``output_path``; empty when none."""
    from marin.execution.store.records import read_record

    parts = relative.split("/")
    for end in range(len(parts), 0, -1):
        try:
            path = validate_name("/".join(parts[:end]))
        except MarinError:
            continue
        stored = read_record(location, path) if path != output_path else None
        if stored is not None and stored.build_id:
            return {path: stored}
    return {}
