"""``memory://``'s folder index (``store/memory_folders.py``): whether a folder exists is one
lookup, and it answers exactly as a scan of every key would, whoever writes the store."""

from __future__ import annotations

import pickle
import random
import threading
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from marin.execution.errors import StepFailedError
from marin.execution.lazy import OUT, apply, resolve
from marin.execution.store.location import Location, open_prefix
from marin.execution.store.memory_folders import IndexedStore

KEYS = ["/a/b/c", "/a/b/d", "/a/e", "/a/b", "/x", "/a/b/c/z", "a//b/", "q", "/a/b.marin/f"]
FOLDERS = ["", "/", "/a", "/a/", "/a/b", "/a/b/c", "/x", "a", "a/", "/q", "/a/e", "/a/b.marin"]


def scanned(store: dict[str, object], folder: str) -> bool:
    return any(key.startswith(folder.rstrip("/") + "/") for key in store)


def test_every_change_of_the_keys_keeps_the_index_exact() -> None:
    store, plain = IndexedStore(), {}
    rnd = random.Random(1)  # fixed: every run checks the same 4,000 changes
    for i in range(4000):
        key, op = rnd.choice(KEYS), rnd.random()
        if op < 0.45:
            store[key] = plain[key] = i
        elif op < 0.65:
            assert store.pop(key, None) == plain.pop(key, None)
        elif op < 0.75 and key in plain:
            del store[key], plain[key]
        elif op < 0.8:
            assert store.setdefault(key, i) == plain.setdefault(key, i)
        elif op < 0.85:
            store.update({key: i}, **{"k": i})
            plain.update({key: i}, **{"k": i})
        elif op < 0.88:
            store |= {key: i}
            plain |= {key: i}
        elif op < 0.9:
            store.clear()
            plain.clear()
        elif op < 0.95 and plain:
            popped, _ = store.popitem()
            del plain[popped]
        assert dict(store) == plain
        for folder in FOLDERS:
            assert store.has_folder(folder) == scanned(plain, folder), (folder, plain)
    copied = pickle.loads(pickle.dumps(store))
    assert dict(copied) == plain and copied._below == store._below


def test_a_folder_written_through_fsspec_by_another_writer_is_seen() -> None:
    location = open_prefix(f"memory://folders-{uuid.uuid4().hex}")
    assert isinstance(location.fs.store, IndexedStore)
    other = fsspec.filesystem("memory")  # another driver of this process, through fsspec
    folder = location.path("team/data.marin")
    assert not location.exists(folder)
    other.pipe_file(f"{folder}/anything.txt", b"planted")
    assert location.exists(folder) and location.exists(location.path("team"))
    other.rm_file(f"{folder}/anything.txt")
    assert not location.exists(folder) and not location.exists(location.path("team"))


def test_a_store_of_its_own_is_indexed_and_a_replaced_one_still_answers() -> None:
    fs = MemoryFileSystem(global_store=False, skip_instance_cache=True)
    fs.pipe_file("/own/a.marin/f", b"1")
    location = Location(url="memory://own", fs=fs, root="/own")
    assert isinstance(fs.store, IndexedStore) and location.exists("/own/a.marin")
    fs.store = {"/own/b.marin/f": b"2"}  # replaced behind its back: a scan answers
    assert location.exists("/own/b.marin") and not location.exists("/own/a.marin")


def test_concurrent_writers_never_read_a_written_folder_as_absent() -> None:
    location = open_prefix(f"memory://folders-{uuid.uuid4().hex}")
    other = fsspec.filesystem("memory")
    errors: list[str] = []

    def writer(n: int) -> None:
        for i in range(300):
            folder = location.path(f"w{n}/s{i}.marin")
            other.pipe_file(f"{folder}/record.json", b"{}")
            if not location.exists(folder):
                errors.append(f"{folder} absent after its write")
            other.rm_file(f"{folder}/record.json")
            if location.exists(folder):
                errors.append(f"{folder} present after its delete")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert not location.exists(location.root)


def test_a_step_inside_another_drivers_step_is_refused_on_memory() -> None:
    prefix = f"memory://folders-{uuid.uuid4().hex}"
    location = open_prefix(prefix)
    fsspec.filesystem("memory").pipe_file(location.path("team.marin/record.json"), b"{}")
    step = apply("team/data", lambda out_path: None, version="v0", out_path=OUT)
    with pytest.raises(StepFailedError, match="lies inside another step's output"):
        resolve(step, prefix=prefix)
