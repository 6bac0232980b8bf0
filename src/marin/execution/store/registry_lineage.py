"""The builds a registration keeps alive: the registered build and every build its record was
made from, transitively through each record's ``inputs``, as stored under the prefix.

``marin register`` holds the lease of every one of them while it writes the manifest, and
``marin gc`` deletes a step only under that step's lease, after reading the registry again (and
each new manifest's lineage). So for each input either gc's re-read comes after the manifest
(it sees the manifest and keeps the input), or gc deleted the input before the registration
took its lease (the registration finds it gone and writes nothing). Leases are taken in path
order, so two registrations sharing inputs never wait on each other in a cycle.
"""

from __future__ import annotations

from marin.execution.errors import MarinError
from marin.execution.names import validate_name
from marin.execution.store.location import Location
from marin.execution.store.records import USERS_FOLDER, ArtifactRecord, load_record

Lineage = dict[str, str]
"""Output path (relative to the prefix) -> the build id stored there."""


class LineageGone(Exception):
    """A build the registered one was made from is no longer stored under the prefix."""

    def __init__(self, made: str, step: str, build: str) -> None:
        super().__init__(f"{made} was made from {step} build {build}, which is no longer stored")
        self.step = step


def lineage(location: Location, output_path: str, record: ArtifactRecord) -> Lineage:
    """``record`` (stored at ``output_path``) and every build it was made from that is stored
    under the prefix, found by build id. An input its reader read from outside the prefix (an
    absolute pin) is not this prefix's gc's to delete, and is left out.

    Raises:
        LineageGone: an input read from under the prefix no longer holds the build a record
            names.
        StorageError: storage kept failing.
    """
    found: Lineage = {output_path: record.build_id}
    todo = [(output_path, record)]
    while todo:
        path, made = todo.pop()
        for dep, build in sorted(made.inputs.items()):
            candidates = input_paths(path, dep, made.dep_paths.get(dep, ""), location.url)
            if any(found.get(p) == build for p in candidates):
                continue  # met already through another reader
            stored = next(
                ((p, r) for p in candidates
                 if (r := _record(location, p, dep)) is not None and r.build_id == build),
                None,
            )  # fmt: skip
            if stored is not None:
                found[stored[0]] = build
                todo.append(stored)
            elif _under(made.dep_paths.get(dep, ""), location.url):
                raise LineageGone(made.step_id, dep, build)
    return found


def _record(location: Location, output_path: str, step_id: str) -> ArtifactRecord | None:
    record = load_record(location, output_path)
    return record if isinstance(record, ArtifactRecord) and record.step_id == step_id else None


def _under(url: str, prefix_url: str) -> bool:
    """Whether a reader read its input from under the prefix (else an input not found here is
    stored elsewhere: an absolute pin, or an adopted source, not this prefix's gc's)."""
    return not url or url.startswith(prefix_url.rstrip("/") + "/")


def input_paths(reader: str, dep: str, dep_url: str, prefix_url: str) -> list[str]:
    """Where the build of ``dep`` read by the step at ``reader`` may be stored under the prefix
    (relative, literal paths only: never a URL from the record): the path the reader's record
    names (a pin under the prefix), the reader's user folder, the shared folder."""
    name, _, version = dep.rpartition("@")
    own = f"{name}/{version}"
    paths: list[str] = []
    base = prefix_url.rstrip("/") + "/"
    if dep_url.startswith(base):
        paths.append(dep_url[len(base) :])
    parts = reader.split("/")
    if len(parts) > 2 and parts[0] == USERS_FOLDER:
        paths.append(f"{USERS_FOLDER}/{parts[1]}/{own}")
    paths.append(own)
    valid: list[str] = []
    for path in dict.fromkeys(paths):
        try:
            valid.append(validate_name(path))
        except MarinError:
            continue
    return valid
