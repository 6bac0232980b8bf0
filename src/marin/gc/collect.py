"""What ``marin gc`` keeps, as a pure function of what the walk found and of its roots.

Kept: the roots (``roots.py``: what the targets' plans serve, other users' builds, the newest N
versions, recent builds); every build a kept record was made from, by build id, transitively
through records' ``inputs``; every build an adopted step's source (the plan's, or a kept
record's) lies in or holds, under the prefix. Everything else Marin wrote is collected. A kept
record's input is the exact build it names (kept wherever it is stored); and every slot a kept
record read an input from is kept too, whatever it holds now (that build, a newer one, an
unfinished rebuild's status, a corrupt status): it is what keeps a stale reader stale, and
without it the reader would read as made from a pruned intermediate, and be served. When that
slot no longer holds the build read, its data is gone already, and that is said.
"""

from __future__ import annotations

import bisect
import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass

from marin.execution.errors import OptionError
from marin.execution.names import METADATA_SUFFIX
from marin.execution.store.placement import spellings
from marin.execution.store.records import UNKNOWN_BUILD, replaced_build
from marin.execution.store.registry_lineage import input_paths
from marin.gc.walk import Slot

_AGE = re.compile(r"\s*(\d+)\s*([smhdw])\s*")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> datetime.timedelta:
    """``--older-than``: ``30d``, ``12h``, ``90m``, ``2w``, ``45s``.

    Raises:
        OptionError: ``text`` is not a number and a unit, or is an age longer than a
            ``timedelta`` holds.
    """
    match = _AGE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise OptionError(
            f"--older-than {text!r} is not an age",
            "give a number and a unit: 30d, 12h, 90m, 2w or 45s",
        )
    try:
        return datetime.timedelta(seconds=int(match[1]) * _UNITS[match[2]])
    except OverflowError:
        raise age_too_large(text) from None


def age_too_large(age: object) -> OptionError:
    """An ``--older-than`` age that reaches back before the year 1."""
    return OptionError(
        f"--older-than {age!r} reaches back before the year 1",
        "give an age in years, not millennia, e.g. --older-than 3650d",
    )


def check_keep_versions(value: object) -> int | None:
    """``--keep-versions``: None (off) or an integer of at least 0.

    Raises:
        OptionError: ``value`` is neither None nor a whole number of 0 or more.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionError(
            f"keep_versions {value!r} is not a whole number of versions",
            "give 0 or more, e.g. --keep-versions 2 (or leave it out)",
        )
    return value


@dataclass(frozen=True)
class Decision:
    """The keep/collect split of a prefix's slots."""

    kept: dict[str, str]
    """Output path -> why it is kept."""
    collect: list[Slot]
    """What is not kept, in deletion order (dependents before what they were built from)."""
    gone: list[str]
    """Inputs of kept builds that are no longer stored: one sentence each."""


class _Holders:
    """The slots an adopted step's source (a URL) lies in, is, or holds, under the prefix:
    deleting any of them would delete data that step serves.

    A source and the prefix are compared in every spelling that names the same place
    (``spellings``: ``raw//v1`` is ``raw/v1``; on local disk, a link's real path too), so a
    source is never taken for "elsewhere" because it is spelled otherwise. One whose place
    cannot be known (a ``..`` in a URL) holds every slot: nothing is deleted on a guess."""

    def __init__(self, slots: list[Slot], prefix_url: str) -> None:
        self.bases = {b.rstrip("/") + "/" for b in spellings(prefix_url) if b.strip("/")}
        self.by_path = {s.output_path: s for s in slots}
        self.paths = sorted(self.by_path)

    def __call__(self, source: str) -> list[Slot]:
        found: dict[str, Slot] = {}
        for spelling in spellings(source):
            if "/../" in spelling + "/":
                return list(self.by_path.values())  # cannot be placed: keep everything
            for base in self.bases:
                if (spelling + "/").startswith(base):
                    found.update((s.output_path, s) for s in self._at(spelling[len(base) :]))
        return list(found.values())

    def _at(self, relative: str) -> list[Slot]:
        """The slots ``relative`` (below the prefix) lies in, is, or holds."""
        parts = [p for p in relative.split("/") if p]
        found = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
        # In a build's metadata folder (its kept checkpoints): that build's, deleted with it.
        found += [p.removesuffix(METADATA_SUFFIX) for p in found if p.endswith(METADATA_SUFFIX)]
        inside = "/".join(parts) + "/" if parts else ""
        at = bisect.bisect_left(self.paths, inside)
        while at < len(self.paths) and self.paths[at].startswith(inside):
            found.append(self.paths[at])
            at += 1
        return [self.by_path[p] for p in found if p in self.by_path]


def _add_inputs(
    slots: list[Slot], kept: dict[str, str], holders: _Holders, prefix_url: str
) -> list[str]:
    """Keep every build a kept record was made from or adopts, and every slot it read an input
    from (``_read_from``), transitively; say which of the builds it was made from are gone."""
    by_step: dict[str, list[Slot]] = {}
    for slot in slots:
        if slot.record is not None:
            by_step.setdefault(slot.record.step_id, []).append(slot)
    by_path = {s.output_path: s for s in slots}
    gone: list[str] = []
    todo = list(kept)
    only_read_from: set[str] = set()  # kept only as a slot read from: a closer reason wins

    def keep(found: Slot, why: str, read_from: bool = False) -> None:
        """Keep ``found``, walked once for its own inputs, for ``why``. A slot first kept only
        because a build read from it takes a closer reason found later (a build was made from
        it, or adopts it); no reason replaces a closer one."""
        path = found.output_path
        if path in kept and (path not in only_read_from or read_from):
            return
        if path not in kept:
            todo.append(path)
        kept[path] = why
        (only_read_from.add if read_from else only_read_from.discard)(path)

    while todo:
        slot = by_path[todo.pop()]
        record = slot.record
        if record is None:
            continue
        for found in holders(record.source) if record.source is not None else []:
            keep(found, f"{record.step_id} adopts it (its source)")
        for dep in sorted(set(record.dep_paths) | set(record.inputs)):
            build = record.inputs.get(dep)
            # Pre-lineage records name no build: keep whatever that step has stored.
            match = [s for s in by_step.get(dep, []) if build is None or s.record.build_id == build]  # type: ignore[union-attr]
            for found in match:
                keep(found, f"{record.step_id} was built from it")
            read_from = _read_from(by_path, slot.output_path, record.dep_paths, dep, prefix_url)
            for found in read_from:
                keep(found, _READ_FROM.format(record.step_id, build or "unknown"), True)
            if not match and build is not None:
                gone.extend(_gone(record.step_id, dep, build, read_from))
    return sorted(set(gone))


_READ_FROM = (
    "{} read build {} from here: whatever it holds now (a newer build, an unfinished rebuild's "
    "status) keeps that reader stale; without it the reader would look current"
)


def _read_from(
    by_path: Mapping[str, Slot],
    reader: str,
    dep_paths: Mapping[str, str],
    dep: str,
    prefix_url: str,
) -> list[Slot]:
    """Every slot the kept build at ``reader`` may have read its input ``dep`` from, whatever
    it holds now: the path its record names (``dep_paths``), the step's own path in the
    reader's user folder and in the shared folder (``input_paths``, where the plan looks), and
    the slot the recorded URL ends with (the prefix spelled another way). Deleting one would
    make the reader read as made from a merely missing (pruned) intermediate, and be served
    (``identity._lineage``): none is deleted while the reader is kept."""
    dep_url = dep_paths.get(dep, "")
    paths = input_paths(reader, dep, dep_url, prefix_url)
    parts = dep_url.split("/")
    suffixes = ("/".join(parts[start:]) for start in range(len(parts)))  # the longest first
    paths += [p for p in suffixes if p in by_path][:1]  # its own slot, not a shorter one's
    return [by_path[p] for p in dict.fromkeys(paths) if p in by_path]


def _gone(step_id: str, dep: str, build: str, read_from: list[Slot]) -> list[str]:
    """The note that a kept record's input build is no longer stored (none when an unfinished
    rebuild's status there names that build, or may: a corrupt one; the status says so)."""
    named = (build, UNKNOWN_BUILD)
    if any(s.record is None and replaced_build(s.status) in named for s in read_from):
        return []
    if any(s.record is not None for s in read_from):
        now = "another build, kept: it keeps that reader stale"
    elif read_from:
        now = "an unfinished build's status or leftovers, kept: they keep that reader stale"
    else:
        now = "nothing"
    return [
        f"{step_id} was built from {dep} build {build}, which is no longer stored (its path "
        f"holds {now}): that data is gone already"
    ]


def decide(
    slots: list[Slot],
    roots: Mapping[str, str],
    sources: Mapping[str, str] | None = None,
    prefix_url: str = "",
) -> Decision:
    """Split ``slots`` into kept and collected. ``roots``: output path -> why it is kept for
    its own sake (``roots.py``); ``sources``: the URL of each source the plan adopts -> why.
    Kept too: every build a kept record was made from, and every build under ``prefix_url``
    that an adopted source (a kept record's, or one of ``sources``) lies in, is, or holds."""
    kept = {s.output_path: roots[s.output_path] for s in slots if s.output_path in roots}
    holders = _Holders(slots, prefix_url)
    for source, why in (sources or {}).items():
        for slot in holders(source):
            kept.setdefault(slot.output_path, why)
    gone = _add_inputs(slots, kept, holders, prefix_url)
    collect = [s for s in slots if s.output_path not in kept]
    return Decision(kept, _deletion_order(collect), gone)


def _deletion_order(collect: list[Slot]) -> list[Slot]:
    """Dependents before the builds they were made from (by step id), else by path: a crash
    midway never leaves a collected step's reader standing on nothing."""
    ids: Mapping[str, Slot] = {s.step_id: s for s in collect}
    readers: dict[str, int] = {s.step_id: 0 for s in collect}
    for slot in collect:
        for dep in slot.record.inputs if slot.record is not None else {}:
            if dep in readers:
                readers[dep] += 1
    order: list[Slot] = []
    ready = sorted((sid for sid, n in readers.items() if n == 0), reverse=True)
    while ready:
        sid = ready.pop()
        order.append(ids[sid])
        slot = ids[sid]
        for dep in sorted(slot.record.inputs if slot.record is not None else {}, reverse=True):
            if dep in readers:
                readers[dep] -= 1
                if readers[dep] == 0:
                    ready.append(dep)
    placed = {s.output_path for s in order}
    return order + sorted(
        (s for s in collect if s.output_path not in placed), key=lambda s: s.output_path
    )
