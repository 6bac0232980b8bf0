"""The machine's speed at plain Python: the yardstick ``--quick`` scales its time bounds by.

A quick run (CI) is judged against the committed full run, which was made on some other machine,
and machines here differ severalfold in how fast they run the same Python: the code that lowered
a 10,000-step graph in 20 us/step on the machine of one committed run took 55-60 us/step on a
later one, with the same interpreter. A fixed bound fails CI on such a machine whatever the code.

So both runs time the same reference loop, and ``--quick`` multiplies each time bound by how much
slower this machine ran it than the machine of the committed run (never by less than one: parts
of a row, a disk's or a thread wake-up's, need not speed up with Python). The loop is stdlib
work of the kinds a build and lowering do (small dicts and objects, string formatting, canonical
JSON, hashing, sorting, calls) and contains none of Marin's code, so a regression in Marin cannot
slow the yardstick and hide itself.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

REPS = 5
"""Repetitions of the loop (each section measures it, so a few); the median is the reference."""
ITEMS = 2000
"""Records one pass of the loop makes: well under 0.1 s here."""


@dataclass(frozen=True)
class _Item:
    name: str
    version: str
    deps: tuple[str, ...]


def _record(item: _Item, index: int) -> dict[str, Any]:
    return {
        "name": item.name,
        "version": item.version,
        "deps": list(item.deps),
        "config": {"index": index, "rate": index / 7, "tags": ["a", "b", item.version]},
        "output": f"memory://prefix/{item.name}/{item.version}",
    }


def reference_pass(items: int = ITEMS) -> str:
    """One pass: make ``items`` small objects, encode each as canonical JSON, hash it, read it
    back, and order them; returns a digest so that no work can be skipped."""
    made: list[_Item] = []
    for i in range(items):
        deps = tuple(made[j].name for j in range(max(0, i - 3), i))
        made.append(_Item(f"step-{i:05d}", f"v{i % 7}", deps))
    digest = hashlib.sha256()
    by_name: dict[str, dict[str, Any]] = {}
    for i, item in enumerate(made):
        text = json.dumps(_record(item, i), sort_keys=True, separators=(",", ":"))
        digest.update(hashlib.sha256(text.encode()).digest())
        by_name[item.name] = json.loads(text)
    ordered = sorted(by_name.values(), key=lambda r: (r["version"], r["name"]))
    seen = {dep for record in ordered for dep in record["deps"]}
    digest.update(f"{len(seen)}:{ordered[0]['name']}".encode())
    return digest.hexdigest()


def worker(reps: int = REPS) -> dict[str, Any]:
    """Milliseconds per pass, median of ``reps`` (after one untimed pass), and every pass."""
    reference_pass()
    runs = []
    for _ in range(reps):
        start = time.perf_counter()
        reference_pass()
        runs.append((time.perf_counter() - start) * 1e3)
    return {"ms": statistics.median(runs), "runs": runs}


def slowdown(now_ms: float | None, committed_ms: float | None) -> float:
    """How many times a time bound grows on this machine: this run's reference over the
    committed run's, never below one; one when either run has no reference."""
    if not now_ms or not committed_ms:
        return 1.0
    return max(1.0, now_ms / committed_ms)
