"""(f) Injected latency and errors on a real file system: retries, clear failures, no false
"built"."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import pytest

from marin.execution.errors import StepFailedError, StorageError
from marin.execution.lazy import OUT, apply, run
from marin.execution.store.lease import lease_store
from marin.execution.store.location import open_prefix
from marin.execution.store.records import lease_path, read_record, read_status
from tests.reliability.faulty_fs import FAULTS

STATUS_OR_RECORD = r"\.marin/(status|record)\.json$"


@pytest.fixture
def faulty(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A ``faulty://`` prefix and the plain local path of the same folder."""
    FAULTS.clear()
    local = str(tmp_path / "prefix")
    yield f"faulty://{local}", local
    FAULTS.clear()


def writer(calls: list[str]) -> Any:
    lock = threading.Lock()

    def fn(label: str, out_path: str) -> str:
        with lock:
            calls.append(label)
        with fsspec.open(out_path, "w") as f:
            f.write(label)
        return label

    return fn


def pipeline(calls: list[str]) -> list[Any]:
    fn = writer(calls)
    a = apply("f/a", fn, version="v0", label="a", out_path=OUT)
    b = apply("f/b", fn, version="v0", label="b", out_path=OUT)
    c = apply(
        "f/c", lambda deps, out_path: fn("c", out_path), version="v0", deps=[a, b], out_path=OUT
    )
    return [a, b, c]


def test_wrapper_uses_the_generic_lease_store(faulty: tuple[str, str]) -> None:
    assert lease_store(open_prefix(faulty[0])).kind == "generic"


def test_transient_errors_on_status_and_record_io_are_retried(
    faulty: tuple[str, str], caplog: Any
) -> None:
    prefix, local = faulty
    FAULTS.add("cat_file pipe_file", STATUS_OR_RECORD, times=2)  # per rule, across all steps
    FAULTS.add("pipe_file", r"record\.json$", times=3, latency=0.01)
    FAULTS.add("cat_file", r"lease\.json$", times=1)
    calls: list[str] = []
    with caplog.at_level("WARNING", logger="marin"):
        run(*pipeline(calls), prefix=prefix, max_concurrent=2)
    assert sorted(calls) == ["a", "b", "c"]
    assert sum(FAULTS.injected.values()) >= 5, FAULTS.injected
    assert "retrying" in caplog.text
    location = open_prefix(local)
    for path in ("f/a/v0", "f/b/v0", "f/c/v0"):
        assert read_record(location, path) is not None
        assert (read_status(location, path) or {}).get("state") == "SUCCESS"


def test_persistent_record_write_error_fails_the_step_clearly(faulty: tuple[str, str]) -> None:
    prefix, local = faulty
    FAULTS.add("pipe_file", r"f/b/v0\.marin/record\.json$", times=None)
    calls: list[str] = []
    with pytest.raises(StepFailedError) as info:
        run(*pipeline(calls), prefix=prefix, max_concurrent=1)
    message = str(info.value)
    assert "(step f/b@v0)" in message and "storage kept failing" in message, message
    assert isinstance(info.value.__cause__, StorageError)
    location = open_prefix(local)
    assert read_record(location, "f/b/v0") is None, "a failed commit must not count as built"
    assert (read_status(location, "f/b/v0") or {}).get("state") == "FAILED"
    assert not location.fs.exists(location.path(lease_path("f/b/v0"))), "lease not released"
    assert read_record(location, "f/c/v0") is None and "c" not in calls
    # The fault clears; the next run builds what is missing and nothing else.
    built_before = {n for n in "abc" if read_record(location, f"f/{n}/v0") is not None}
    FAULTS.clear()
    again: list[str] = []
    run(*pipeline(again), prefix=prefix)
    assert sorted(again) == sorted(set("abc") - built_before) and "b" in again


def test_persistent_read_error_is_an_error_not_a_rebuild(faulty: tuple[str, str]) -> None:
    prefix, _ = faulty
    calls: list[str] = []
    run(*pipeline(calls), prefix=prefix)
    FAULTS.add("cat_file", r"f/a/v0\.marin/record\.json$", times=None)
    with pytest.raises(StorageError, match=r"could not read .*f/a/v0\.marin/record\.json"):
        run(*pipeline(calls), prefix=prefix)
    assert sorted(calls) == ["a", "b", "c"], "an unreadable record must not trigger a rebuild"


def test_latency_everywhere_keeps_racing_runners_exactly_once(faulty: tuple[str, str]) -> None:
    prefix, _ = faulty
    FAULTS.add("cat_file pipe_file exists rm rm_file open ls info", r".", times=0, latency=0.005)
    calls: list[str] = []
    handles = pipeline(calls)
    start = threading.Barrier(3)

    def racer(_: int) -> Any:
        start.wait(timeout=60)  # the three runners start together
        return run(*handles, prefix=prefix)

    with ThreadPoolExecutor(3) as pool:
        # .result() re-raises a runner's exception: each of the three must succeed.
        results = [f.result(timeout=300) for f in [pool.submit(racer, i) for i in range(3)]]
    # The generic store has no atomic create, but pipe_file(mode="create") on the wrapped local
    # file system still is one: exactly once.
    assert sorted(calls) == ["a", "b", "c"]
    views = [
        [(a.url, a.record.fingerprint if a.record else None, a.result) for a in r] for r in results
    ]
    assert len(views) == 3 and views[0] == views[1] == views[2], "the runners disagree"
    location = open_prefix(prefix)
    for step in ("a", "b", "c"):
        assert read_record(location, f"f/{step}/v0") is not None, f"f/{step} not built"
