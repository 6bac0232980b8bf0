"""Disk full, malformed stored JSON, hostile names and settings (issue 11, items 4, 10, 13), and
every field of every stored file (issue 18, item 1)."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import unicodedata
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from marin import catalog
from marin.execution import atomic_file
from marin.execution.builder.clearing import output_left_by_marin
from marin.execution.builder.commit import build_step
from marin.execution.builder.output_tree import OutputDigest
from marin.execution.builder.request import BuildRequest
from marin.execution.digest.code import code_digest
from marin.execution.errors import (
    ArtifactTypeMismatchError,
    ConfigError,
    DriftError,
    InvalidStepError,
    MarinError,
    StepFailedError,
)
from marin.execution.lazy import OUT, apply, resolve
from marin.execution.pipeline.graph import Graph
from marin.execution.pipeline.provenance import collect_provenance, now_iso
from marin.execution.plan.options import RunOptions
from marin.execution.plan.read import plan_run
from marin.execution.store import records
from marin.execution.store.lease import TTL_ENV, Lease, LeaseInfo, ttl_from_env
from marin.execution.store.lease import holder as lease_holder
from marin.execution.store.location import open_prefix
from marin.execution.store.records import (
    ArtifactRecord,
    lease_path,
    metadata_dir,
    read_record,
    read_status,
    record_path,
    status_path,
)
from marin.plan_view import plan_json, plan_table


def write_value(value: str, out_path: str) -> str:
    with fsspec.open(out_path, "w") as f:
        f.write(value)
    return value


# -- item 4: a full disk -------------------------------------------------------------------------


class DiskFull:
    """Wraps the real create and write of metadata files' temporary files: a write into a
    matching temporary file writes part of its data, then fails with ENOSPC, as a full disk
    does."""

    def __init__(self, create: Any, write: Any) -> None:
        self.real_create = create
        self.real_write = write
        self.fail_record = True
        self.full_while_leftover = False
        self.injected = 0
        self._failing: set[int] = set()

    def create(self, path: str) -> int:
        folder = os.path.dirname(path)
        leftovers = os.path.isdir(folder) and any(
            records.TMP_MARK in name for name in os.listdir(folder)
        )
        if self.full_while_leftover and leftovers and "status.json" in path:
            self.injected += 1
            raise OSError(errno.ENOSPC, "No space left on device", path)
        fd: int = self.real_create(path)
        if self.fail_record and os.path.basename(path).startswith("record.json" + records.TMP_MARK):
            self._failing.add(fd)
        return fd

    def write(self, fd: int, data: Any) -> int:
        if fd not in self._failing:
            return int(self.real_write(fd, data))
        self._failing.discard(fd)
        self.real_write(fd, bytes(data[: len(data) // 2]))
        self.injected += 1
        raise OSError(errno.ENOSPC, "No space left on device")


def _full_disk(monkeypatch: pytest.MonkeyPatch) -> DiskFull:
    """A ``DiskFull`` in the path of every atomic metadata write (the temporary file's create,
    and its writes)."""
    real = atomic_file._create
    disk = DiskFull(lambda path: real(path, True), os.write)
    monkeypatch.setattr(atomic_file, "_create", lambda tmp, make_parents: disk.create(tmp))
    monkeypatch.setattr(os, "write", disk.write)
    return disk


def test_disk_full_during_the_record_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _full_disk(monkeypatch)
    prefix = str(tmp_path / "prefix")
    step = apply("big", write_value, version="v0", value="x" * 1000, out_path=OUT)
    with pytest.raises(MarinError):
        resolve(step, prefix=prefix)
    assert disk.injected == 1
    folder = Path(prefix) / metadata_dir("big/v0")
    assert [n for n in os.listdir(folder) if records.TMP_MARK in n] == []
    disk.fail_record = False
    assert resolve(step, prefix=prefix).record is not None


def test_a_leftover_that_fills_the_disk_is_cleared_before_the_first_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash mid-write left a big ``record.json.tmp-*``; the disk is full until it goes.
    Before the fix, the RUNNING status write failed first, on every run."""
    prefix = str(tmp_path / "prefix")
    step = apply("big", write_value, version="v0", value="x", out_path=OUT)
    folder = Path(prefix) / metadata_dir("big/v0")
    folder.mkdir(parents=True)
    (folder / f"record.json{records.TMP_MARK}0123abcd").write_bytes(b"{" * 4096)
    (folder / "status.json").write_text(json.dumps({"state": "RUNNING", "output_path": "s/v0"}))  # the crashed attempt
    disk = _full_disk(monkeypatch)
    disk.fail_record, disk.full_while_leftover = False, True
    artifact = resolve(step, prefix=prefix)
    assert artifact.record is not None and artifact.record.result == "x"
    assert disk.injected == 0, "a status write ran while the leftover still filled the disk"
    assert [n for n in os.listdir(folder) if records.TMP_MARK in n] == []


def test_a_runner_without_the_lease_never_removes_the_holders_write_in_flight(
    tmp_path: Path,
) -> None:
    """Eight processes raced one step: one wrote ``record.json.tmp-*`` under its lease while
    another, before asking for the lease, looked at the metadata folder and swept it, and the
    holder's rename failed (CI, stop 63). Only the lease holder removes temporaries."""
    prefix = str(tmp_path / "prefix")
    spec = apply("s", write_value, version="v0", value="x", out_path=OUT).lower()
    location = open_prefix(prefix)
    folder = Path(prefix) / metadata_dir("s/v0")
    folder.mkdir(parents=True)
    (Path(prefix) / "s/v0").mkdir()
    in_flight = folder / f"record.json{records.TMP_MARK}0123abcd"
    in_flight.write_text("{}")  # the holder's write, between its create and its rename
    (folder / "status.json").write_text(json.dumps({"state": "RUNNING", "output_path": "s/v0"}))
    assert output_left_by_marin(location, spec)  # the look before the lease
    assert in_flight.exists()
    assert records.metadata_files(location, "s/v0", remove_temporaries=True) == {"status.json"}
    assert not in_flight.exists()  # the holder's own look still clears a crash's leftover


# -- item 10: malformed stored JSON --------------------------------------------------------------


DEEP = b"[" * 200_000 + b"]" * 200_000
DEEP_OPEN = b'{"a":' * 200_000
WRONG_TYPES = [
    {"duration_s": "fast"},
    {"provenance": ["not", "a", "dict"]},
    {"dep_paths": {"a": 1}},
    {"name": 7},
    {"provenance": {"argv": 5}},
    {"duration_s": float("nan")},
    {"finished_at": None},
]


def _good_record(location: Any, prefix: str) -> dict[str, Any]:
    step = apply("s", write_value, version="v0", value="x", out_path=OUT)
    resolve(step, prefix=prefix)
    raw = location.fs.cat_file(location.path(record_path("s/v0")))
    data: dict[str, Any] = json.loads(raw)
    return data


def _assert_nothing_crashes(location: Any, caplog: pytest.LogCaptureFixture) -> None:
    assert read_record(location, "s/v0") is None
    entries = catalog.list_entries(location)
    catalog.ls_table(location, entries)
    catalog.ls_json(location, entries)
    with contextlib.suppress(catalog.NotFoundError):
        catalog.show_record(location, "s/v0")


@pytest.mark.parametrize("bad", [DEEP, DEEP_OPEN], ids=["deep", "deep-unclosed"])
def test_deeply_nested_metadata_is_corrupt_not_a_crash(
    prefix: str, bad: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    location = open_prefix(prefix)
    _good_record(location, prefix)
    for path in (record_path("s/v0"), status_path("s/v0")):
        location.fs.pipe_file(location.path(path), bad)
    caplog.set_level(logging.WARNING, logger="marin")
    _assert_nothing_crashes(location, caplog)
    corrupt = read_status(location, "s/v0")  # fails closed: it may have named a replaced build
    assert corrupt is not None and corrupt["state"] == "FAILED"
    assert LeaseInfo.parse(bad).garbled
    # A corrupt record is "not built"; naming no build, it proves nothing about the data beside
    # it (red team r20-1): refused until that is moved away, then rebuilt, the status rewritten.
    step = apply("s", write_value, version="v0", value="x", out_path=OUT)
    with pytest.raises(StepFailedError, match="already exists and was not written by Marin"):
        resolve(step, prefix=prefix)
    location.remove_tree(location.path("s/v0"))
    assert resolve(step, prefix=prefix).record is not None
    assert (read_status(location, "s/v0") or {}).get("state") == "SUCCESS"


@pytest.mark.parametrize("change", WRONG_TYPES, ids=lambda c: next(iter(c)))
def test_record_with_wrong_field_types_is_corrupt(
    prefix: str, change: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    location = open_prefix(prefix)
    data = {**_good_record(location, prefix), **change}
    location.fs.pipe_file(location.path(record_path("s/v0")), json.dumps(data).encode())
    caplog.set_level(logging.WARNING, logger="marin")
    _assert_nothing_crashes(location, caplog)
    warnings = [r for r in caplog.records if "corrupt record" in r.getMessage()]
    assert len(warnings) == 1, "a corrupt record is reported, once"
    caplog.clear()
    step = apply("s", write_value, version="v0", value="x", out_path=OUT)
    location.fs.pipe_file(location.path(record_path("s/v0")), b"[" * 5000 + b"x")
    with pytest.raises(StepFailedError, match="already exists and was not written by Marin"):
        resolve(step, prefix=prefix)  # a torn record names no build: no proof (r20-1)
    location.remove_tree(location.path("s/v0"))
    assert resolve(step, prefix=prefix).record is not None  # rebuilt
    warnings = [r for r in caplog.records if "corrupt record" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


@pytest.mark.parametrize("expires", ["NaN", "Infinity", "1e300", "-5", '"soon"', "true", "0"])
def test_a_lease_with_an_impossible_expiry_is_taken_over_with_one_warning(
    prefix: str, expires: str, caplog: pytest.LogCaptureFixture
) -> None:
    location = open_prefix(prefix)
    body = f'{{"holder": "x", "token": "t", "expires_at": {expires}}}'.encode()
    location.fs.makedirs(location.path(metadata_dir("s/v0")), exist_ok=True)
    location.fs.pipe_file(location.path(lease_path("s/v0")), body)
    assert LeaseInfo.parse(body).garbled
    caplog.set_level(logging.WARNING, logger="marin")
    spec = apply("s", write_value, version="v0", value="x", out_path=OUT).lower()
    outcome = build_step(BuildRequest(spec, location))  # would wait forever on NaN / 1e300
    assert outcome.action == "built"
    takeovers = [r for r in caplog.records if "taking over" in r.getMessage()]
    assert len(takeovers) == 1 and "garbled" in takeovers[0].getMessage()


_json_scalars = st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20)
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(
        st.binary(max_size=300),
        _json.map(lambda v: json.dumps(v).encode()),
        st.dictionaries(
            st.sampled_from(
                [
                    "schema",
                    "name",
                    "version",
                    "fingerprint",
                    "fingerprint_payload",
                    "config",
                    "dep_paths",
                    "output_path",
                    "result",
                    "provenance",
                    "started_at",
                    "finished_at",
                    "duration_s",
                    "artifact_type",
                    "extra",
                    "state",
                    "holder",
                    "token",
                    "expires_at",
                    "process",
                    "error",
                    "traceback",
                ]
            ),
            _json,
        ).map(lambda d: json.dumps({"schema": records.RECORD_SCHEMA, **d}).encode()),
    )
)
def test_any_bytes_in_record_status_or_lease_never_crash(data: bytes) -> None:  # fmt: skip
    """Whatever bytes the metadata files hold, reading them, ls and show never raise."""
    location = open_prefix("memory://hypothesis-metadata")
    for path in (record_path("s/v0"), status_path("s/v0"), lease_path("s/v0")):
        location.put_file(location.path(path), data)
    record = read_record(location, "s/v0")
    assert record is None or isinstance(record, ArtifactRecord)
    status = read_status(location, "s/v0")
    assert status is None or isinstance(status.get("state"), str)
    info = Lease(location, "s/v0", ttl=30).read()
    assert info is not None and (info.garbled or info.expires_at > 0)
    entries = catalog.list_entries(location, sizes=False)
    catalog.ls_table(location, entries)
    catalog.ls_json(location, entries)
    with contextlib.suppress(catalog.NotFoundError):
        catalog.show_record(location, "s/v0")


# -- issue 18 item 1: every field of every stored file, documents nested in strings included ---

_MACHINE_MARK = "<this machine>"
"""Replaced by this kernel boot's id: a lease's ``process`` is judged only on its own machine."""
_hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.sampled_from(
        [
            10**400,  # a JSON number no float can hold
            -(10**400),
            "0001-01-01T00:00:00+14:00",  # an ISO time with no UTC equivalent
            "9999-12-31T23:59:59-14:00",
            f"{_MACHINE_MARK}/²/1",  # "²".isdigit(), but int("²") fails
            f"{_MACHINE_MARK}/1/1",
        ]
    ),
)
_nested_documents = st.one_of(
    _json.map(json.dumps),  # any JSON document, as a string field's text
    st.integers(1, 5_000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 5_000).map(lambda n: '{"config":' * n),  # deep, and never closed
)
_hostile = st.one_of(_hostile_scalars, _json, _nested_documents)

_RECORD_FIELDS = [*ArtifactRecord.__dataclass_fields__, "schema"]
_PROVENANCE_FIELDS = ["git_commit", "git_dirty", "user", "host", "pid", "argv", "time", "lowered"]
_CODE_FIELDS = ["scheme", "digest", "unknown", "parts"]
_CODE_PART_FIELDS = ["name", "file", "line", "digest", "header", "statements", "constants", "via"]
_OUTPUT_FIELDS = ["digest", "files", "bytes", "unknown", "checksums"]
_NESTED = ("provenance.", "code.", "output.")
"""Nested fields the fuzz reaches one by one (issue 25's digests, besides provenance)."""
_STATUS_FIELDS = ["state", "error", "holder", "started_at", "finished_at", "traceback"]
_LEASE_FIELDS = ["holder", "token", "expires_at", "process", "started_at"]
_FUZZ_STEP = apply("s", write_value, version="v0", value="x", out_path=OUT).lower()
_FUZZ_DRIFTED = apply("s", write_value, version="v0", value="y", out_path=OUT).lower()
_FUZZ_PREFIX = "memory://hypothesis-fields"


def _base_files() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A well-formed record, FAILED status and expired lease of ``s@v0``: the fuzz changes some
    of their fields, so every field is reached behind otherwise valid JSON."""
    record = ArtifactRecord(
        name="s", version="v0", fingerprint=_FUZZ_STEP.fingerprint,
        fingerprint_payload=_FUZZ_STEP.fingerprint_payload, config={"value": "x"}, dep_paths={},
        output_path=f"{_FUZZ_PREFIX}/s/v0", result="x", provenance=collect_provenance(),
        started_at=now_iso(), finished_at=now_iso(), duration_s=0.5, build_id="b" * 32,
        code=code_digest(write_value), output=OutputDigest("tree1:" + "a" * 64, 1, 1),
        input_digests={"d@v0": "tree1:" + "b" * 64}, replaced={"c" * 32: "tree1:" + "c" * 64},
    )  # fmt: skip
    status = {"state": "FAILED", "error": "boom", "holder": "h", "started_at": now_iso(),
              "finished_at": now_iso(), "traceback": "Traceback..."}  # fmt: skip
    lease = {"holder": "h:1:2", "token": "t", "expires_at": 1.0, "process": "p",
             "started_at": now_iso()}  # fmt: skip
    return json.loads(record.to_json()), status, lease


def _changed(base: dict[str, Any], changes: dict[str, Any]) -> bytes:
    doc = json.loads(json.dumps(base))
    for key, value in changes.items():
        if isinstance(value, str):
            value = value.replace(_MACHINE_MARK, lease_holder._MACHINE or "none")
        if key.startswith("code.part."):  # a field of the code digest's first part
            parts = doc.get("code", {}).get("parts") if isinstance(doc.get("code"), dict) else None
            if isinstance(parts, list) and parts and isinstance(parts[0], dict):
                parts[0][key.rsplit(".", 1)[1]] = value
        elif key.startswith(_NESTED):
            outer, inner = key.split(".", 1)
            if isinstance(doc.get(outer), dict):  # else a draw replaced it whole
                doc[outer][inner] = value
        else:
            doc[key] = value
    return json.dumps(doc).encode()


def _every_reader_survives(
    record: dict[str, Any], status: dict[str, Any], lease: dict[str, Any]
) -> None:
    """Whatever the fields hold, reading, planning (all drift policies, forced or not), ``ls``
    and ``show`` never raise anything but a ``DriftError`` under ``on_drift="error"``, or the
    artifact-type refusal, which ``--force`` gets past."""
    location = open_prefix(_FUZZ_PREFIX)
    base_record, base_status, base_lease = _base_files()
    files = {
        record_path("s/v0"): _changed(base_record, record),
        status_path("s/v0"): _changed(base_status, status),
        lease_path("s/v0"): _changed(base_lease, lease),
    }
    for path, data in files.items():
        location.put_file(location.path(path), data)
    found = records.load_record(location, "s/v0")
    assert found is None or isinstance(found, (ArtifactRecord, records.ForeignRecord))
    attempt = records.read_attempt(location, "s/v0")
    assert attempt is None or isinstance(attempt.get("state"), str)
    info = Lease(location, "s/v0", ttl=30).read()
    assert info is not None
    info.describe()
    assert isinstance(info.expired, bool) and isinstance(info.holder_dead, bool)
    for spec in (_FUZZ_STEP, _FUZZ_DRIFTED):  # the drifted one explains its drift
        for on_drift, force in (("warn", ()), ("error", ()), ("rebuild", ("s",))):
            try:
                plan = plan_run(
                    Graph.of([spec]), location, RunOptions(on_drift=on_drift, force=force)
                )
            except DriftError:
                assert on_drift == "error"
                continue
            except ArtifactTypeMismatchError as exc:
                # A refusal with a fix (bump the version, or --force), not a crash: a forced
                # plan never gets here.
                assert not force and "--force" in exc.fix
                continue
            decision = plan.of(spec)
            assert decision.record is None or decision.record.step_id == "s@v0"
            plan_table(plan, location)
            plan_json(plan, location)
    entries = catalog.list_entries(location, sizes=False)
    catalog.ls_table(location, entries)
    catalog.ls_json(location, entries)
    with contextlib.suppress(catalog.NotFoundError):
        catalog.show_record(location, "s/v0")


_fields_fuzz = given(
    record=st.dictionaries(
        st.sampled_from(
            _RECORD_FIELDS
            + [f"provenance.{k}" for k in _PROVENANCE_FIELDS]
            + [f"code.{k}" for k in _CODE_FIELDS]
            + [f"code.part.{k}" for k in _CODE_PART_FIELDS]
            + [f"output.{k}" for k in _OUTPUT_FIELDS]
        ),
        _hostile,
        max_size=3,
    ),
    status=st.dictionaries(st.sampled_from(_STATUS_FIELDS), _hostile, max_size=2),
    lease=st.dictionaries(st.sampled_from(_LEASE_FIELDS), _hostile, max_size=2),
)
# Each crashed a command before issue 18 (found by this fuzz or by the red-team pass).
_found = [
    example(record={"fingerprint_payload": "[]"}, status={}, lease={}),
    example(record={"fingerprint_payload": "null"}, status={}, lease={}),
    example(record={"fingerprint_payload": '{"config":' * 100_000}, status={}, lease={}),
    example(record={"duration_s": 10**400}, status={}, lease={}),
    example(record={"provenance.argv": None}, status={}, lease={}),  # found by the random run
    example(record={"finished_at": "0001-01-01T00:00:00+14:00"}, status={}, lease={}),
    example(record={}, status={}, lease={"expires_at": 10**400}),
    example(record={}, status={}, lease={"process": f"{_MACHINE_MARK}/²/1"}),
    example(record={"artifact_type": ""}, status={}, lease={}),  # found by the random run
    # Issue 25's fields, each behind an otherwise valid record: unknown, never a crash.
    example(record={"code.digest": "zz"}, status={}, lease={}),
    example(record={"code.part.line": True}, status={}, lease={}),
    example(record={"code.part.statements": [None]}, status={}, lease={}),
    example(record={"code.scheme": ["ast1"]}, status={}, lease={}),
    example(record={"output.files": True}, status={}, lease={}),
    example(record={"output.digest": "tree1:" + "A" * 64}, status={}, lease={}),
    example(record={"input_digests": {"d@v0": 5}}, status={}, lease={}),
    example(record={"replaced": []}, status={}, lease={}),
]


def _pinned(test: Any) -> Any:
    for pin in _found:
        test = pin(test)
    return test


@_pinned
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@_fields_fuzz
def test_every_stored_field_never_crashes_a_reader_fixed_seed(
    record: dict[str, Any], status: dict[str, Any], lease: dict[str, Any]
) -> None:
    """The same examples on every run (CI); the random twin below explores new ones."""
    _every_reader_survives(record, status, lease)


@_pinned
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@_fields_fuzz
def test_every_stored_field_never_crashes_a_reader_random(
    record: dict[str, Any], status: dict[str, Any], lease: dict[str, Any]
) -> None:
    _every_reader_survives(record, status, lease)


# -- item 13: names and settings -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "a\u200bb",  # zero-width space
        "evil\u202etxt",  # right-to-left override
        "x\u2066y",  # left-to-right isolate
        "c1\u0085",  # C1 control (next line)
        "c1\u009b",  # C1 control (CSI)
        "priv\ue000",  # private use
        "sep\u2028",  # line separator
        "bom\ufeff",  # zero-width no-break space
    ],
)
def test_invisible_and_format_characters_are_rejected(name: str) -> None:
    with pytest.raises(InvalidStepError, match="invisible|whitespace"):
        apply(name, write_value, version="v0", value="x", out_path=OUT)
    with pytest.raises(InvalidStepError):
        apply("ok", write_value, version=name, value="x", out_path=OUT)


def test_names_not_in_nfc_are_rejected() -> None:
    decomposed = unicodedata.normalize("NFD", "café")
    assert decomposed != "café"
    with pytest.raises(InvalidStepError, match="NFC"):
        apply(decomposed, write_value, version="v0", value="x", out_path=OUT)
    apply("café", write_value, version="v0", value="x", out_path=OUT)  # NFC is fine


def test_a_path_segment_over_255_bytes_is_rejected_at_apply() -> None:
    with pytest.raises(InvalidStepError, match="255 bytes"):
        apply("a/" + "é" * 128, write_value, version="v0", value="x", out_path=OUT)  # 256 bytes
    apply("a/" + "é" * 127, write_value, version="v0", value="x", out_path=OUT)  # 254: fine
    with pytest.raises(InvalidStepError, match="bytes"):
        apply("a", write_value, version="v" * 250, value="x", out_path=OUT)  # + ".marin" > 255


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "1e300", ""])
def test_lease_ttl_setting_is_checked(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TTL_ENV, value)
    if value == "":
        assert ttl_from_env() == 60.0
        return
    with pytest.raises(ConfigError, match=TTL_ENV):
        ttl_from_env()
    with pytest.raises(ConfigError, match=TTL_ENV):
        Lease(open_prefix("memory://ttl-check"), "s/v0")
    monkeypatch.setenv(TTL_ENV, "2.5")
    assert Lease(open_prefix("memory://ttl-check"), "s/v0").ttl == 2.5
