"""Section ``calls``: the storage calls one build of a no-op step makes (the budget)."""

from __future__ import annotations

from harness import Harness

CALL_REASONS = {
    "open for writing": "the lease, created with O_EXCL (atomic, fails if another runner holds "
    "it; on a first build after its folders, which the link check saw missing), the lease guard "
    "(flock) at commit, the record's temporary file",
    "open for reading": "the lease read back at commit (proof of ownership)",
    "os.rename": "the record (the commit point), written to a temporary file and renamed into "
    "place",
    "os.remove": "the lease, released with the commit under the same lock",
    "os.mkdir": "the step's metadata folder and its parent (the output's parent), on its first "
    "build",
    "os.listdir": "the metadata folder after taking the lease: an earlier record or status, and "
    "temporary files a crashed write left",
    "os.scandir": "the metadata folder after taking the lease: an earlier record or status, "
    "temporary files a crashed write left, and (from the entry types, at no extra call) any "
    "symbolic link, which is refused",
    "fcntl.flock": "lock and unlock the lease guard at commit (which also releases the lease)",
    "cat_file": "the lease read back at commit (proof of ownership)",
    "rm_file": "the lease, released with the commit",
    "put_file": "the lease (create-if-absent) and the record (the commit point)",
    "has_file": "the lease's create-if-absent check, and an earlier record or status after "
    "taking the lease (an O(1) check instead of fsspec's scan of the whole store)",
    "pipe_file": "a conditional create (the lease)",
}


def bench(h: Harness) -> None:
    """The storage calls one build of a silent no-op step makes: the documented budget."""
    r = h.worker("calls", 120)
    if not r:
        return
    for backend in ("local", "memory"):
        for name, count in r[backend].items():
            h.add(
                "calls", f"{backend}: {name}", count, "calls/step", note=CALL_REASONS.get(name, "")
            )


WORKERS: dict[str, str] = {
    "calls": "commit_cost:calls_worker",
}
