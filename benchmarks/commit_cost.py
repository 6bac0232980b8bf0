"""Where the per-step commit time goes: ``build_step`` with one cost removed at a time.

Each variant monkeypatches one part of the build path *in this process only* (nothing is changed
on disk), builds the same ``n`` no-op steps one after another (no scheduler, no threads), and
reports the median time per step. ``baseline - variant`` is what that part costs, so it is what a
change in ``build.py``/``lease.py``/``records.py`` removing or cheapening it would save.

    .venv/bin/python benchmarks/commit_cost.py [--n 500] [--reps 3]
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import fresh_prefix, lowered

import marin.execution.builder.commit as build
from marin.execution.builder.request import BuildRequest
from marin.execution.plan.decide import Policy, Stored, decide
from marin.execution.step_spec import StepSpec
from marin.execution.store.location import _FIRST_READ, open_prefix


class _NoHeartbeat:
    """A heartbeat that starts no thread (what one shared renewal thread would cost per step)."""

    def __init__(self, lease: Any) -> None:
        self.lost = threading.Event()

    def __enter__(self) -> _NoHeartbeat:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _NoLease:
    def __init__(self, location: Any, output_path: str, ttl: float | None = None) -> None:
        self.holder = "bench"
        self.token = "bench"
        self.ttl = 60.0
        self.took_over = False

    def commit(self, write: Callable[[], Any], *, release: bool = False) -> bool:
        write()
        return True

    def try_acquire(self) -> None:
        return None

    def renew(self) -> bool:
        return True

    def release(self) -> None:
        return None


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def _fast_memory_fs() -> Iterator[None]:
    """``memory://`` with O(1) ``info``: an index of directories instead of a scan of all keys.

    fsspec's ``MemoryFileSystem.info`` scans every stored key to decide whether a path is a
    directory, and every write checks each parent with ``isfile`` -> ``info``; so each write
    costs O(files stored) and a build of N steps costs O(N^2).
    """
    from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

    dirs: set[str] = set()
    original_commit = MemoryFile.commit

    def commit(self: Any) -> None:
        original_commit(self)
        parent = self.path.rsplit("/", 1)[0]
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rsplit("/", 1)[0]

    def info(self: Any, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        if path in self.store:
            f = self.store[path]
            return {"name": path, "size": f.size, "type": "file", "created": None}
        if path in dirs or path in self.pseudo_dirs:
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    with _patched(MemoryFile, "commit", commit), _patched(MemoryFileSystem, "info", info):
        yield


@contextlib.contextmanager
def _both(*managers: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield


def _no_fsync() -> contextlib.AbstractContextManager[None]:
    return _patched(os, "fsync", lambda fd: None)


@contextlib.contextmanager
def _no_capture(stream: Any, label: str | None = None) -> Iterator[None]:
    yield


def _planned(spec: Any) -> Any:
    """What a runner's plan hands ``build_step`` for a step with no record: build it."""
    return decide(spec, Stored(), [], Policy(), needed=True)


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "baseline": contextlib.nullcontext,
    "no heartbeat thread": lambda: _patched(build, "Heartbeat", _NoHeartbeat),
    "no lease at all": lambda: _both(
        _patched(build, "Lease", _NoLease), _patched(build, "Heartbeat", _NoHeartbeat)
    ),
    "no fsync": _no_fsync,
    "no output check": lambda: _patched(build, "output_left_by_marin", lambda *a, **k: False),
    "no earlier-attempt check": lambda: _patched(build, "metadata_files", lambda *a, **k: set()),
    "no output capture": lambda: _patched(build, "capture_step_output", _no_capture),
    "O(1) memory:// info": _fast_memory_fs,
}


SYSCALLS_ALONE = "the same file-system calls alone"


def _syscalls_alone(root: str, steps: int, inputs: Sequence[int] = ()) -> float:
    """Seconds for ``steps`` no-op builds' file-system calls on local disk, without build_step.

    The calls are those ``count_calls`` traces for one build, in the same order, with bodies of
    about the same size, made straight from ``os`` in a loop: the floor that no Python-side
    change to ``build.py`` can go below while the build keeps those calls. ``inputs``: each
    step's number of dependencies (none when not given), whose records a build reads twice, at
    its start and right before its commit (an open, one read and a close each).
    """
    import fcntl

    lease_body, record_body = b"L" * 200, b"R" * 1500
    create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    read_flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC

    def read_inputs(i: int) -> None:
        if i == 0 or i >= len(inputs):
            return
        for _ in range(inputs[i]):
            fd = os.open(f"{root}/s{i - 1}/v0.marin/record.json", read_flags)
            os.read(fd, _FIRST_READ)
            os.close(fd)

    t0 = time.perf_counter()
    for i in range(steps):
        step = f"{root}/s{i}"
        meta, lease = f"{step}/v0.marin", f"{step}/v0.marin/lease.json"
        with contextlib.suppress(FileNotFoundError):
            os.lstat(f"{step}.marin")  # not inside another step's output (no `s{i}.marin`)
        read_inputs(i)  # the inputs at the start
        with contextlib.suppress(FileNotFoundError):
            os.lstat(step)  # the output check before the lease: no step folder, so no output
        try:
            os.lstat(step)  # the lease's: no symbolic link on the way (Location.check_no_links)
        except FileNotFoundError:  # first build: the metadata folder does not exist yet
            os.mkdir(step)  # made here, so known real: no lstat of either folder later
            os.mkdir(meta)
        fd = os.open(lease, create, 0o644)
        os.write(fd, lease_body)
        os.close(fd)
        with os.scandir(meta) as entries:  # an earlier attempt's files, and links among them
            [entry.is_symlink() for entry in entries]
        with contextlib.suppress(FileNotFoundError):
            os.lstat(f"{step}/v0")  # after fn: did it write an output?
        read_inputs(i)  # the inputs again, right before the commit
        guard = os.open(f"{lease}.guard", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
        fcntl.flock(guard, fcntl.LOCK_EX)
        fd = os.open(lease, os.O_RDONLY | os.O_CLOEXEC)  # proof of ownership
        os.read(fd, _FIRST_READ)
        os.close(fd)
        tmp = f"{meta}/record.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        os.write(fd, record_body)
        os.close(fd)
        os.rename(tmp, f"{meta}/record.json")  # the commit point
        os.remove(lease)
        fcntl.flock(guard, fcntl.LOCK_UN)
        os.close(guard)
    return time.perf_counter() - t0


def measure(backend: str, n: int, reps: int) -> dict[str, float]:
    """Median ms per step of ``build_step`` for each variant, plus all of them at once.

    Each repetition runs every variant once, in a fresh random order, so that a machine that
    slows down during the run (other jobs) does not bias one variant against another.
    """
    _, steps, _ = lowered("random", n, seed=11)
    names = [*VARIANTS, "all of the above"]
    if backend == "local":
        names.remove("O(1) memory:// info")
        names.append(SYSCALLS_ALONE)
    else:
        names.remove("no fsync")
    times: dict[str, list[float]] = {name: [] for name in names}
    shuffle = random.Random(7).shuffle
    for rep in range(reps):
        order = list(names)
        shuffle(order)
        for name in order:
            with fresh_prefix(backend, f"commit{rep}") as prefix, contextlib.ExitStack() as stack:
                if name == SYSCALLS_ALONE:
                    times[name].append(_syscalls_alone(prefix, len(steps)))
                    continue
                if name == "all of the above":
                    for other, make in VARIANTS.items():
                        if other != "no lease at all":  # keep the lease, cheapen the rest
                            stack.enter_context(make())
                else:
                    stack.enter_context(VARIANTS[name]())
                location = open_prefix(prefix)
                location.check_writable()
                t0 = time.perf_counter()
                for spec in steps:
                    # As a runner does: the plan already decided to build (no record yet).
                    planned = decide(spec, Stored(), [], Policy(), needed=True)
                    build.build_step(BuildRequest(spec, location, decision=planned, upstream=[]))
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(times[name]) / len(steps) * 1e3 for name in names}


def calls_alone_worker(
    backend: str, n: int, threads: int, kind: str = "random", reps: int = 1
) -> dict[str, Any]:
    """Seconds for the file-system calls of the ``n``-step ``kind`` graph's builds alone (each
    step's own and its inputs' reads), split over ``threads`` threads as a runner's builds are,
    each thread in a folder of its own: the floor of a runner row on the same file system. The
    median of ``reps``, each on a fresh prefix."""
    _, steps, _ = lowered(kind, n)
    shares = [steps[k::threads] for k in range(threads)]
    runs: list[float] = []
    for rep in range(reps):
        with fresh_prefix(backend, f"alone{threads}r{rep}") as prefix:
            roots = [f"{prefix}/t{k}" for k in range(threads)]
            for root in roots:
                os.mkdir(root)
            workers = [
                threading.Thread(target=_syscalls_alone, args=(root, len(share), _inputs(share)))
                for root, share in zip(roots, shares, strict=True)
            ]
            t0 = time.perf_counter()
            for thread in workers:
                thread.start()
            for thread in workers:
                thread.join()
            runs.append(time.perf_counter() - t0)
    return {"n": len(steps), "seconds": statistics.median(runs), "runs": runs}


def _inputs(steps: Sequence[StepSpec]) -> list[int]:
    """Each step's number of distinct dependencies: the records its build reads."""
    return [len({dep.step_id for dep in spec.deps}) for spec in steps]


def calls_worker() -> dict[str, Any]:
    return {"local": count_calls("local"), "memory": count_calls("memory")}


def worker(n_local: int, n_memory: int, reps: int) -> dict[str, Any]:
    return {"local": measure("local", n_local, reps), "memory": measure("memory", n_memory, reps)}


def main() -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    out = {backend: measure(backend, args.n, args.reps) for backend in ("local", "memory")}
    for backend, results in out.items():
        base = results["baseline"]
        print(f"{backend} (n={args.n}, ms/step, median of {args.reps})")
        for name, ms in results.items():
            print(f"  {name:28s} {ms:7.3f}  saves {base - ms:+7.3f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()


# --- which storage calls one build makes (the documented budget) --------------------------------

_LOCAL_EVENTS = {
    "open": "open a file",
    "os.link": "hard-link the lease into place (atomic create-if-absent)",
    "os.remove": "unlink a file",
    "os.rename": "rename a temporary file into place",
    "os.mkdir": "create a folder",
    "os.listdir": "list a folder",
    "os.scandir": "list a folder",
    "fcntl.flock": "lock or unlock the lease guard",
}
_MEMORY_CALLS = ("cat_file", "pipe_file", "rm_file", "exists", "info", "ls", "find", "rm")
_LOCATION_CALLS = ("put_file", "has_file")


def count_calls(backend: str, n: int = 20) -> dict[str, float]:
    """Storage calls per ``build_step`` of a fresh no-op step that prints nothing (the mean
    over ``n`` steps, after a warm-up). Local disk: Python's audit events (``open`` split by
    read/write mode, links, unlinks, renames, mkdirs, listings, flocks; ``stat`` is not an audit
    event). ``memory://``: calls to the file-system object's methods."""
    _, steps, _ = lowered("random", n + 5, seed=13)
    counts: dict[str, int] = {}
    with fresh_prefix(backend, "calls") as prefix:
        location = open_prefix(prefix)
        location.check_writable()
        for spec in steps[:5]:
            build.build_step(BuildRequest(spec, location, decision=_planned(spec), upstream=[]))
        active = False
        if backend == "local":

            def hook(event: str, args: tuple[Any, ...]) -> None:
                if not active or event not in _LOCAL_EVENTS:
                    return
                if event == "open":
                    mode = str(args[1]) if len(args) > 1 and args[1] is not None else "r"
                    writes = any(c in mode for c in "wax+") or (
                        isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR)
                    )
                    event = "open for writing" if writes else "open for reading"
                counts[event] = counts.get(event, 0) + 1

            sys.addaudithook(hook)  # cannot be removed: `active` switches it off
        else:
            fs = location.fs
            for name in _MEMORY_CALLS:
                real = getattr(fs, name)

                def counted(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
                    if active:
                        counts[_name] = counts.get(_name, 0) + 1
                    return _real(*a, **k)

                setattr(fs, name, counted)
            for name in _LOCATION_CALLS:
                real = getattr(location, name)

                def counted_put(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
                    if active:
                        counts[_name] = counts.get(_name, 0) + 1
                    return _real(*a, **k)

                object.__setattr__(location, name, counted_put)  # a frozen dataclass
        active = True
        try:
            for spec in steps[5:]:
                build.build_step(BuildRequest(spec, location, decision=_planned(spec), upstream=[]))
        finally:
            active = False
            if backend != "local":
                for name in _MEMORY_CALLS:
                    delattr(location.fs, name)
    return {name: count / n for name, count in sorted(counts.items())}
