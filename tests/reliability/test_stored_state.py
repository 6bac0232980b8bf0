"""Stored state that is corrupt, symlinked or foreign (issue 18, items 1 to 4).

Each test builds real steps, then alters what storage holds the way the red-team pass did, and
runs the real CLI (local disk) or the same ``StepRunner`` the CLI runs (``memory://`` and the
S3 emulator, through the ``store_prefix`` fixture).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marin import catalog
from marin.execution.builder.commit import build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.errors import ForeignRecordError, MarinError, SymlinkError
from marin.execution.plan.decide import Policy, Stored, decide
from marin.execution.plan.options import RunOptions
from marin.execution.plan.read import read_stored_step
from marin.execution.step_runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import lease_path, metadata_dir, read_record, record_path
from marin.execution.vocabulary import Action, StoredStatus
from tests.reliability import stored_state_pipelines as pipelines
from tests.reliability.conftest import REPO

PIPELINES = "tests/reliability/stored_state_pipelines.py"


def marin(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def assert_clean_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


# -- item 1: a record whose fingerprint payload is not an object ---------------------------------

PAYLOADS = {
    "list": "[]",
    "number": "1",
    "null": "null",
    "deep-in-string": '{"config":' * 100_000,
    "deep-closed": "[" * 5000 + "]" * 5000,
}


def _corrupt_payload(location: Any, payload: str) -> None:
    """The record made unreadable, its data moved away as the refusal of data beside an
    unreadable record says (``tests/test_plan_refusals.py``, red team r22-3)."""
    path = location.path(record_path("s/v0"))
    data = json.loads(location.fs.cat_file(path))
    location.fs.pipe_file(path, json.dumps({**data, "fingerprint_payload": payload}).encode())
    location.remove_tree(location.path("s/v0"))


CLI_PAYLOADS = {k: v for k, v in PAYLOADS.items() if k != "deep-closed"}


@pytest.mark.parametrize("payload", CLI_PAYLOADS.values(), ids=CLI_PAYLOADS.keys())
def test_a_payload_that_is_no_object_is_a_corrupt_record_for_plan_and_every_run(
    tmp_path: Path, payload: str
) -> None:
    """Before: ``AttributeError: 'list' object has no attribute 'get'`` / ``RecursionError``
    from every command, until a person deleted the record."""
    prefix = str(tmp_path / "p")
    assert marin("run", f"{PIPELINES}:s", "--prefix", prefix, "--no-progress").returncode == 0
    location = open_prefix(prefix)
    record_file = location.path(record_path("s/v0"))
    # The changed config makes the plan explain the drift: the code path that parsed the payload.
    target = f"{PIPELINES}:s_changed"
    for command in (["plan"], ["run"], ["run", "--force", "s"], ["run", "--on-drift", "rebuild"]):
        _corrupt_payload(location, payload)
        args = [*command, target, "--prefix", prefix]
        result = marin(*args, *(["--no-progress"] if command[0] == "run" else []))
        assert result.returncode == 0, (command, result.stderr[-2000:])
        assert "Traceback" not in result.stderr
        assert f"corrupt record {record_file}" in result.stderr, command
        if command[0] == "run":  # rebuilt, with no one deleting anything
            rebuilt = read_record(location, "s/v0")
            assert rebuilt is not None and rebuilt.result == "s-changed"


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_a_payload_that_is_no_object_is_rebuilt_on_every_store(
    store_prefix: str, payload: str
) -> None:
    location = open_prefix(store_prefix)
    StepRunner(prefix=store_prefix).run([pipelines.s.lower()])
    changed = pipelines.s_changed.lower()
    for on_drift, force in (("warn", ()), ("error", ()), ("rebuild", ()), ("warn", ("s",))):
        _corrupt_payload(location, payload)
        plan, _ = StepRunner(RunOptions(on_drift=on_drift, force=force), prefix=store_prefix).plan(
            [changed]
        )
        assert plan.of(changed).action == Action.BUILD and plan.of(changed).record is None
        StepRunner(RunOptions(on_drift=on_drift, force=force), prefix=store_prefix).run([changed])
        rebuilt = read_record(location, "s/v0")
        assert rebuilt is not None and rebuilt.result == "s-changed"


# -- item 4: a record of another step --------------------------------------------------------------


def _copy_record(location: Any, source: str, target: str) -> bytes:
    raw: bytes = location.fs.cat_file(location.path(record_path(source)))
    location.fs.makedirs(location.path(metadata_dir(target)), exist_ok=True)
    location.fs.pipe_file(location.path(record_path(target)), raw)
    return raw


def test_another_steps_record_is_never_served_nor_replaced_by_the_cli(tmp_path: Path) -> None:
    """Before: ``other@v0``'s record copied into ``s/v0.marin/`` was served for ``s@v0``
    ("config changed without a version bump") while ``s/v0`` did not exist."""
    prefix = str(tmp_path / "p")
    assert marin("run", f"{PIPELINES}:other", "--prefix", prefix, "--no-progress").returncode == 0
    location = open_prefix(prefix)
    copied = _copy_record(location, "other/v0", "s/v0")
    record_file = location.path(record_path("s/v0"))

    plan = marin("plan", f"{PIPELINES}:s_and_t", "--prefix", prefix, "--json")
    assert plan.returncode == 0, plan.stderr
    steps = {s["step"]: s for s in json.loads(plan.stdout)["steps"]}
    assert steps["s@v0"]["status"] == "foreign" and steps["s@v0"]["action"] == "build"
    assert "record belongs to other@v0" in steps["s@v0"]["reason"]
    assert steps["s@v0"]["stored_fingerprint"] is None  # nothing of other@v0 is reported as s's
    table = marin("plan", f"{PIPELINES}:s", "--prefix", prefix)
    assert "foreign" in table.stdout and "record belongs to other@v0" in table.stdout

    for extra in ([], ["--force", "s"], ["--on-drift", "rebuild"]):
        run = marin("run", f"{PIPELINES}:s_and_t", "--prefix", prefix, "--no-progress",
                    "--keep-going", *extra)  # fmt: skip
        assert_clean_error(run, 1, f"{record_file} is not the record of s@v0", "move")
        assert location.fs.cat_file(record_file) == copied  # never replaced, never deleted
        assert not os.path.lexists(location.path("s/v0"))
        assert not os.path.lexists(location.path(lease_path("s/v0")))  # nothing written
        assert read_record(location, "t/v0") is not None  # the other steps went on

    show = marin("show", "s@v0", "--prefix", prefix)
    assert show.returncode == 1 and "record belongs to other@v0" in show.stdout
    assert "other@v0  (" not in show.stdout  # not printed as s@v0's record
    listing = marin("ls", "--prefix", prefix)
    assert "not built: s@v0 (FOREIGN: record belongs to other@v0" in listing.stdout


def test_another_steps_record_is_refused_on_every_store(store_prefix: str) -> None:
    location = open_prefix(store_prefix)
    StepRunner(prefix=store_prefix).run([pipelines.other.lower()])
    copied = _copy_record(location, "other/v0", "s/v0")
    s, t = pipelines.s.lower(), pipelines.independent.lower()

    plan, _ = StepRunner(prefix=store_prefix).plan([s, t])
    decision = plan.of(s)
    assert (decision.status, decision.action, decision.record) == (
        StoredStatus.FOREIGN,
        Action.BUILD,
        None,
    )
    assert decision.refusal is not None
    # Not needed (a dependent is served from its own record): pruned, still not served.
    assert (
        decide(s, read_stored_step(s, location), [], Policy(), needed=False).action == Action.PRUNE
    )

    for force in ((), ("s",)):
        with pytest.raises(MarinError) as failed:  # the run's failure, caused by the refusal
            StepRunner(RunOptions(force=force, keep_going=True), prefix=store_prefix).run([s, t])
        assert isinstance(failed.value.__cause__, ForeignRecordError)
        assert location.fs.cat_file(location.path(record_path("s/v0"))) == copied
        assert read_record(location, "t/v0") is not None
    # The same refusal when the record appears after the plan, while waiting for the lease.
    location.fs.rm_file(location.path(record_path("s/v0")))
    planned = decide(s, Stored(), [], Policy(), needed=True)
    _copy_record(location, "other/v0", "s/v0")
    with pytest.raises(ForeignRecordError, match="record belongs to other@v0"):
        build_step(BuildRequest(s, location, decision=planned, upstream=[]))
    assert location.fs.cat_file(location.path(record_path("s/v0"))) == copied


def test_a_record_naming_another_output_is_foreign(tmp_path: Path) -> None:
    """Same name and version, but written for another prefix's layout (``x/s/v0``)."""
    prefix = str(tmp_path / "p")
    location = open_prefix(prefix)
    StepRunner(prefix=prefix).run([pipelines.s.lower()])
    path = location.path(record_path("s/v0"))
    data = json.loads(location.fs.cat_file(path))
    location.fs.pipe_file(path, json.dumps({**data, "output_path": "/else/x/v0"}).encode())
    plan, _ = StepRunner(prefix=prefix).plan([pipelines.s.lower()])
    decision = plan.of(pipelines.s.lower())
    assert (
        decision.status == StoredStatus.FOREIGN
        and "written for the output /else/x/v0" in decision.reason
    )
    # A prefix moved as a whole keeps its records: only the part below the prefix is compared.
    moved = str(tmp_path / "moved")
    os.rename(prefix, moved)
    location = open_prefix(moved)
    data["output_path"] = os.path.join(prefix, "s/v0")  # the old prefix's spelling
    location.fs.pipe_file(location.path(record_path("s/v0")), json.dumps(data).encode())
    plan, _ = StepRunner(prefix=moved).plan([pipelines.s.lower()])
    assert plan.of(pipelines.s.lower()).status == "built"


# -- items 2 and 3: symbolic links below the prefix (local disk) -----------------------------------


def _tree(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def test_a_linked_metadata_folder_is_refused_and_what_it_points_to_survives(
    tmp_path: Path,
) -> None:
    """Before: ``run --force`` deleted the linked folder's log, status and lease and overwrote
    its record."""
    prefix, elsewhere = tmp_path / "p", tmp_path / "elsewhere"
    assert marin("run", f"{PIPELINES}:s", "--prefix", str(prefix), "--no-progress").returncode == 0
    meta = prefix / "s" / "v0.marin"
    elsewhere.mkdir()
    (elsewhere / "record.json").write_bytes((meta / "record.json").read_bytes())
    for name in ("log.txt", "status.json", "lease.json"):
        (elsewhere / name).write_text(f"someone else's {name}")
    for f in meta.iterdir():
        f.unlink()
    meta.rmdir()
    meta.symlink_to(elsewhere)
    before = _tree(elsewhere)
    for command in (["plan"], ["run", "--no-progress"], ["run", "--no-progress", "--force", "s"]):
        result = marin(*command, f"{PIPELINES}:s", "--prefix", str(prefix))
        assert_clean_error(result, 2, f"{meta} is a symbolic link", "replace the link")
        assert _tree(elsewhere) == before
    # build_step itself refuses too (a runner that got its decision elsewhere), before the
    # lease: the lease is never created in the folder the link points to.
    location, spec = open_prefix(str(prefix)), pipelines.s.lower()
    forced = decide(spec, Stored(), [], Policy(force=frozenset({"s@v0"})), needed=True)
    with pytest.raises(SymlinkError, match="is a symbolic link"):
        build_step(BuildRequest(spec, location, decision=forced, upstream=[]))
    assert _tree(elsewhere) == before


@pytest.mark.parametrize("name", ["record.json", "status.json", "lease.json", "log.txt"])
def test_a_linked_metadata_file_is_never_read_written_or_deleted(tmp_path: Path, name: str) -> None:
    prefix, outside = tmp_path / "p", tmp_path / "outside.json"
    location, spec = open_prefix(str(prefix)), pipelines.s.lower()
    StepRunner(prefix=str(prefix)).run([spec])
    meta = prefix / "s" / "v0.marin"
    original = (meta / "record.json").read_bytes()  # a record that would read as built
    outside.write_bytes(original)
    (meta / name).unlink(missing_ok=True)
    (meta / name).symlink_to(outside)
    if name == "record.json":  # the plan reads the record (and a status only without one)
        with pytest.raises(SymlinkError, match=f"{name} is a symbolic link"):
            StepRunner(prefix=str(prefix)).plan([spec])
    elif name != "log.txt":  # show reads the attempt too
        with pytest.raises(SymlinkError, match=f"{name} is a symbolic link"):
            catalog.show_record(location, "s/v0")
    forced = decide(spec, Stored(), [], Policy(force=frozenset({"s@v0"})), needed=True)
    with pytest.raises(SymlinkError, match=f"{name} is a symbolic link"):
        build_step(BuildRequest(spec, location, decision=forced, upstream=[]))
    assert outside.read_bytes() == original
    assert (meta / name).is_symlink()


def test_a_linked_name_folder_never_serves_or_clears_another_prefix(tmp_path: Path) -> None:
    """Before: with ``A/s`` a link to ``B/other``, a run on A served B's ``other@v0`` as
    ``s@v0``, ``marin show s@v0`` printed ``other@v0``, and ``--force`` overwrote B's artifact."""
    a, b = tmp_path / "A", tmp_path / "B"
    assert marin("run", f"{PIPELINES}:other", "--prefix", str(b), "--no-progress").returncode == 0
    before = _tree(b)
    a.mkdir()
    (a / "s").symlink_to(b / "other")
    for command in (
        ["run", f"{PIPELINES}:s", "--no-progress"],
        ["run", f"{PIPELINES}:s", "--no-progress", "--force", "s"],
        ["plan", f"{PIPELINES}:s"],
        ["show", "s@v0"],
    ):
        result = marin(*command, "--prefix", str(a))
        assert_clean_error(result, 2, f"{a / 's'} is a symbolic link")
        assert "other@v0" not in result.stdout
        assert _tree(b) == before
    # The prefix itself may be a link (users point it at a bigger disk): that is the fix the
    # error suggests, and it reads B's own step as B's.
    (tmp_path / "B-link").symlink_to(b)
    show = marin("show", "other@v0", "--prefix", str(tmp_path / "B-link"))
    assert show.returncode == 0 and show.stdout.startswith("other@v0")


@pytest.mark.parametrize(
    ("name", "read_by_plan"),
    [
        ("record.json", True),  # read by every plan (and a run plans first)
        ("status.json", True),  # read by a plan, without a record
        ("attempt.json", False),  # cleared by a build, listed before
        ("lease.json", False),  # taken by a build (a plan reads it only without a status)
        ("log.txt", False),  # written by a build
    ],
)
def test_a_metadata_file_that_is_a_folder_is_refused_alike_by_plan_and_run(
    tmp_path: Path, name: str, read_by_plan: bool
) -> None:
    """Red team r17-6: a folder at a step folder's file (a FIFO or a link there was refused
    already): ``marin plan`` showed a plain build, and every run failed with a raw
    ``IsADirectoryError``. A folder is refused as a FIFO is, naming the file and the fix: where
    a plan reads the file, both stop (exit 2); else the plan names the refusal a run raises
    before writing anything (exit 1)."""
    prefix = tmp_path / "p"
    args = (f"{PIPELINES}:failing", "--prefix", str(prefix))
    failed = marin("run", *args, "--no-progress", env={"MARIN_TEST_FAIL": "1"})
    assert failed.returncode == 1 and "failed on purpose" in failed.stderr, failed.stderr
    meta = prefix / "f" / "v0.marin"
    (meta / name).unlink(missing_ok=True)
    (meta / name).mkdir()
    before = _tree(prefix)
    what = f"{meta / name} is not a regular file"
    fix = "remove it: Marin's metadata files are plain files it writes itself"
    plan = marin("plan", *args, env={"COLUMNS": "2000"})
    as_json = marin("plan", *args, "--json")
    ran = marin("run", *args, "--no-progress")
    if read_by_plan:
        for result in (plan, as_json, ran):
            assert_clean_error(result, 2, f"error: {what}: {fix}")
    else:
        assert plan.returncode == 0 and f"a run refuses it: {what}: {fix}" in plan.stdout
        refusal = json.loads(as_json.stdout)["steps"][0]["refusal"]
        assert (refusal["error"], refusal["what"], refusal["fix"]) == (
            "NotRegularFileError",
            what,
            fix,
        )
        assert_clean_error(ran, 1, f"error: {what} (step f@v0): {fix}")
    assert "IsADirectoryError" not in plan.stderr + ran.stderr
    assert _tree(prefix) == before and (meta / name).is_dir()  # nothing written or cleared
