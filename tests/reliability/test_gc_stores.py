"""``marin gc`` on every backend (local disk, ``memory://``, moto's S3, fake-gcs-server), and the
bound on its listing: list calls proportional to folders, never to files (issue 47)."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from typing import Any

from marin.execution.lazy import run
from marin.execution.store.location import Location, open_prefix
from marin.execution.store.records import ArtifactRecord, read_record, record_path
from marin.gc import collect_garbage
from marin.gc.walk import list_prefix
from tests.gc.pipelines import other, pipeline, scratch, step
from tests.gc.test_gc import check_gc


def test_gc_keeps_the_targets_inputs_on_every_backend(store_prefix: str, monkeypatch: Any) -> None:
    run(pipeline(), prefix=store_prefix)
    run(scratch(), prefix=store_prefix)
    run([step("scratch", "v2", step("raw", "v1"))], prefix=store_prefix)
    monkeypatch.setenv("MARIN_TEST_GC_TOK", "v2")  # the pipeline moved on upstream of train
    location = open_prefix(store_prefix)
    report = check_gc(pipeline(), location)
    assert sorted(c.step for c in report.collected) == ["gc/scratch@v1", "gc/scratch@v2"]
    assert {k.step for k in report.kept} == {"gc/raw@v1", "gc/tok@v1", "gc/train@v1"}
    assert read_record(location, "gc/tok/v1") is not None
    assert report.not_marins == []


def _counting_s3(calls: Counter[str]) -> Any:
    import s3fs

    class CountingS3(s3fs.S3FileSystem):  # type: ignore[misc]
        """The real s3fs, counting the requests it sends by API method."""

        cachable = False  # never share an instance (or its listing cache) with other tests

        async def _call_s3(self, method: str, *args: Any, **kwargs: Any) -> Any:
            calls[method] += 1
            return await super()._call_s3(method, *args, **kwargs)

    return CountingS3()


def _plant_steps(
    location: Location, record: ArtifactRecord, names: int, per_name: int, files: int
) -> None:
    """``names * per_name`` built steps of ``files`` files each, written in one batch."""
    batch: dict[str, bytes] = {}
    for n in range(names):
        for v in range(per_name):
            out = f"gc/n{n}/v{v}"
            clone = dataclasses.replace(
                record, name=f"gc/n{n}", version=f"v{v}", output_path=out, build_id=uuid.uuid4().hex
            )
            batch[location.path(record_path(out))] = clone.to_json().encode()
            for f in range(files):
                batch[location.path(f"{out}/part-{f:04d}")] = b"x" * 10
    location.fs.pipe(batch)


def test_s3_listing_costs_list_calls_per_folder_not_per_file(s3_server: Any) -> None:
    url = f"s3://marin-tests/{uuid.uuid4().hex[:10]}"
    run(other(), prefix=url)
    seed = read_record(open_prefix(url), "gc/other/v1")
    assert seed is not None
    calls: Counter[str] = Counter()
    fs = _counting_s3(calls)
    location = Location(url=url, fs=fs, root=url[len("s3://") :])
    names, per_name, files = 2, 8, 20  # 16 steps, 336 files: a per-file cost would show
    _plant_steps(location, seed, names, per_name, files)
    steps = names * per_name
    folders = 2 + names + 1  # the prefix, gc/, gc/n*/, gc/other/
    calls.clear()
    listing = list_prefix(location)
    assert len(listing.slots) == steps + 1
    assert calls["list_objects_v2"] <= folders  # one delimiter listing per folder

    calls.clear()
    report = collect_garbage(other(), location, dry_run=True)
    assert len(report.collected) == steps
    assert report.total_bytes > steps * files * 10
    # The walk, then measuring each collected step's output and metadata folder: one listing
    # each (a step of up to 1,000 files), whatever the files per step.
    assert calls["list_objects_v2"] <= folders + 2 * steps

    calls.clear()
    report = collect_garbage(other(), location)
    assert len(report.collected) == steps and report.ok
    # The same measuring, one listing of each output and of each metadata folder, and the
    # registry listed again under each step's lease before it goes (a build registered while
    # gc runs is kept): per step, never per file.
    assert calls["list_objects_v2"] <= folders + 6 * steps
    assert [s.output_path for s in list_prefix(location).slots] == ["gc/other/v1"]
