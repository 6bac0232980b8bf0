"""``marin gc`` (issue 47): what it keeps, what it never touches, and its safety under builds and
readers running meanwhile. Real file systems (local disk and ``memory://``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import fsspec
import pexpect
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from marin.cli import main
from marin.execution.lazy import OUT, apply, lower, run
from marin.execution.plan.decide import Action
from marin.execution.store.lease import Lease
from marin.execution.store.location import Location, open_prefix
from marin.execution.store.records import read_record, read_status_file
from marin.gc import collect_garbage
from marin.gc.delete import MARKER
from tests.gc.pipelines import pipeline, scratch, step
from tests.reliability.conftest import child_env
from tests.ux.helpers import marin, spawn_80, strip_ansi

REPO = Path(__file__).resolve().parents[2]
TARGET = "tests/gc/pipelines.py:pipeline"
OTHER = "tests/gc/pipelines.py:other"


def stored_files(location: Location) -> dict[str, bytes]:
    """Every file under the prefix (relative path -> bytes), links listed as links."""
    root = location.root.rstrip("/")
    if location.is_local:
        out: dict[str, bytes] = {}
        for folder, dirs, files in os.walk(root):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root)
                out[rel] = (
                    b"->" + os.readlink(path).encode()
                    if os.path.islink(path)
                    else Path(path).read_bytes()
                )
        return out
    found = location.fs.find(root, withdirs=False)
    return {f[len(root) + 1 :]: location.fs.cat_file(f) for f in found}


def under(path: str, folders: set[str]) -> bool:
    return any(path.startswith((f + "/", f + ".marin/")) or path == f for f in folders)


def check_gc(targets: list[Any], location: Location, **options: Any) -> Any:
    """Run a dry run, then a real one: the same list; only the collected folders changed."""
    before = stored_files(location)
    dry = collect_garbage(targets, location, dry_run=True, **options)
    assert stored_files(location) == before  # a dry run changes nothing
    real = collect_garbage(targets, location, **options)
    assert real.to_json()["collected"] == dry.to_json()["collected"]
    assert real.ok, real.failed
    gone = {c.output_path for c in real.collected}
    after = stored_files(location)
    assert after == {p: b for p, b in before.items() if not under(p, gone)}
    return real


def test_version_bump_upstream_keeps_the_kept_targets_old_inputs(
    prefix: str, monkeypatch: Any
) -> None:
    run(pipeline(), prefix=prefix)
    run(scratch(), prefix=prefix)
    monkeypatch.setenv("MARIN_TEST_GC_TOK", "v2")  # the pipeline moved on: tok@v2, train drifts
    location = open_prefix(prefix)
    report = check_gc(pipeline(), location)
    assert [c.step for c in report.collected] == ["gc/scratch@v1"]
    kept = {k.step: k.why for k in report.kept}
    assert kept["gc/tok@v1"] == "gc/train@v1 was built from it"
    monkeypatch.setenv("MARIN_TEST_GC_TOK", "v1")
    plan_actions = {
        d.spec.step_id: d.action for d in _plan(pipeline(), location).decisions.values()
    }
    assert set(plan_actions.values()) == {Action.SKIP}  # the old result is whole and current


def _plan(handles: Any, location: Location) -> Any:
    from marin.execution.pipeline.graph import Graph
    from marin.execution.plan.options import RunOptions
    from marin.execution.plan.read import plan_run

    return plan_run(Graph.of(lower(handles)), location, RunOptions())


def test_replaced_input_is_said_to_be_gone(prefix: str) -> None:
    run(pipeline(), prefix=prefix)
    raw2 = step("raw", "v1", text="other")  # the same path rebuilt from another config
    run([raw2], prefix=prefix, force=["gc/raw"], on_drift="warn")
    report = collect_garbage(pipeline(), prefix, dry_run=True)
    assert any("gc/tok@v1 was built from gc/raw@v1 build" in note for note in report.gone)


# --- the property: random graphs, version bumps, targets ------------------------------------


@st.composite
def histories(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(2, 6))
    deps = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=2))) if i else [] for i in range(n)]
    bumped = draw(st.sets(st.integers(0, n - 1), max_size=n))
    targets = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=3))
    keep_versions = draw(st.one_of(st.none(), st.integers(0, 2)))
    return {
        "deps": deps,
        "bumped": sorted(bumped),
        "targets": sorted(targets),
        "keep": keep_versions,
    }


def _graph(deps: list[list[int]], bumped: set[int]) -> list[Any]:
    handles: list[Any] = []
    moved: list[bool] = []
    for i, ds in enumerate(deps):
        moved.append(i in bumped or any(moved[d] for d in ds))
        handles.append(step(f"p{i}", "v2" if moved[i] else "v1", *[handles[d] for d in ds]))
    return handles


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(case=histories())
@example(case={"deps": [[], [0], [1]], "bumped": [1], "targets": [2], "keep": None})
def test_gc_on_random_histories_keeps_every_target_built_and_current(case: dict[str, Any]) -> None:
    import uuid

    prefix = f"memory://gc-{uuid.uuid4().hex[:10]}"
    first = _graph(case["deps"], set())
    run(first, prefix=prefix)
    now = _graph(case["deps"], set(case["bumped"]))
    targets = [now[i] for i in case["targets"]]
    run(targets, prefix=prefix)
    location = open_prefix(prefix)
    report = check_gc(targets, location, keep_versions=case["keep"])
    decisions = _plan(targets, location).decisions.values()
    assert all(d.action != Action.BUILD for d in decisions), [d.reason for d in decisions]
    # Every kept record's inputs are still stored, as the exact builds it names.
    for kept in report.kept:
        record = read_record(location, kept.path)
        for dep, build in record.inputs.items():
            name, _, version = dep.rpartition("@")
            assert read_record(location, f"{name}/{version}").build_id == build
    fsspec.filesystem("memory").rm(location.root, recursive=True)


# --- never touch what is not provably Marin's -----------------------------------------------


def test_foreign_folders_links_and_records_are_left_alone(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    run(pipeline(), prefix=str(prefix))
    run(scratch(), prefix=str(prefix))
    outside = tmp_path / "outside"
    (outside / "gc/hidden/v1.marin").mkdir(parents=True)
    (outside / "gc/hidden/v1").mkdir()
    (outside / "gc/hidden/v1/data.txt").write_text("not to be touched")
    record = (prefix / "gc/scratch/v1.marin/record.json").read_bytes()
    (outside / "gc/hidden/v1.marin/record.json").write_bytes(record)
    (prefix / "linked").symlink_to(outside)  # a link to a folder holding a "step": not entered
    (prefix / "gc/copy/v1.marin").mkdir(parents=True)
    (prefix / "gc/copy/v1.marin/record.json").write_bytes(record)  # another step's record
    (prefix / "gc/copy/v1").mkdir()
    (prefix / "gc/plain/v1.marin").mkdir(parents=True)  # a metadata folder with no record
    (prefix / "gc/plain/v1.marin/notes.txt").write_text("mine")
    (prefix / "data").mkdir()
    (prefix / "data/x.bin").write_bytes(b"x")
    (prefix / "gc/sl/v1.marin").mkdir(parents=True)
    (prefix / "gc/sl/v1.marin/status.json").write_text('{"state": "FAILED"}')
    (prefix / "gc/sl/v1").symlink_to(outside / "gc/hidden/v1")  # an output that is a link
    location = open_prefix(str(prefix))
    outside_before = sorted(str(p) for p in outside.rglob("*"))
    report = check_gc(pipeline(), location)
    assert [c.step for c in report.collected] == ["gc/scratch@v1"]
    assert {x.path for x in report.not_marins} == {
        "data",
        "gc/copy/v1",
        "gc/plain/v1",
        "gc/sl/v1",
        "linked",
    }
    assert sorted(str(p) for p in outside.rglob("*")) == outside_before
    assert (outside / "gc/hidden/v1/data.txt").read_text() == "not to be touched"


# --- concurrency: live leases, readers of a collected input, crashes ------------------------


def test_a_candidate_with_a_live_lease_is_skipped(prefix: str) -> None:
    run(pipeline(), prefix=prefix)
    run(scratch(), prefix=prefix)
    location = open_prefix(prefix)
    lease = Lease(location, "gc/scratch/v1")  # a build of it under way (this process lives)
    assert lease.try_acquire() is None
    try:
        for dry_run in (True, False):
            report = collect_garbage(pipeline(), location, dry_run=dry_run)
            assert report.collected == [] and report.ok
            assert [s.step for s in report.skipped] == ["gc/scratch@v1"]
            assert "its lease is live" in report.skipped[0].why
        assert read_record(location, "gc/scratch/v1") is not None
    finally:
        lease.release()
    assert [c.step for c in collect_garbage(pipeline(), location).collected] == ["gc/scratch@v1"]


def _gc_process(
    prefix: str, target: str, crash: str, command: str = "gc"
) -> subprocess.CompletedProcess[str]:
    env = child_env(MARIN_FAULT_CRASH=crash)
    code = "import sys; from marin.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, command, target, "--prefix", prefix],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


STARTED, GO = threading.Event(), threading.Event()


def reader_step(out_path: str, source: str) -> str:
    with fsspec.open(f"{source}/data.txt") as f:
        data = f.read()
    STARTED.set()
    GO.wait(30)  # meanwhile gc deletes the input's record, and dies before its data
    with fsspec.open(f"{out_path}/data.txt", "wb", auto_mkdir=True) as f:
        f.write(data)
    return "read"


def start_reader(prefix: str) -> tuple[threading.Thread, list[BaseException]]:
    """A build of ``gc/reader`` that has read ``gc/raw@v1`` and waits for ``GO``; what it
    raises lands in the list."""
    STARTED.clear()
    GO.clear()
    reader = apply("gc/reader", reader_step, version="v1", out_path=OUT, source=step("raw", "v1"))
    failure: list[BaseException] = []

    def build() -> None:
        try:
            run([reader], prefix=prefix)
        except BaseException as exc:  # the test inspects it
            failure.append(exc)

    thread = threading.Thread(target=build)
    thread.start()
    assert STARTED.wait(30)
    return thread, failure


def test_a_reader_of_a_collected_input_never_commits_and_a_crash_leaves_no_build(
    tmp_path: Path,
) -> None:
    prefix = str(tmp_path / "p")
    run(scratch(), prefix=prefix)  # raw and scratch: neither is needed by `other`
    location = open_prefix(prefix)
    thread, failure = start_reader(prefix)
    crashed = _gc_process(prefix, "tests/gc/pipelines.py:other", "gc-after-record@gc/raw")
    assert crashed.returncode == -9, crashed.stderr
    assert read_record(location, "gc/raw/v1") is None  # the record went first...
    assert (tmp_path / "p/gc/raw/v1/data.txt").exists()  # ...the data is still there
    assert read_status_file(location, "gc/raw/v1")["error"] == MARKER
    GO.set()
    thread.join(30)
    assert failure and "input gc/raw@v1 was deleted by `marin gc`" in str(failure[0])
    assert "another runner" not in str(failure[0])  # issue 53.17: it said "rebuilt by" one
    assert read_record(location, "gc/reader/v1") is None  # never committed
    plan = _plan(scratch(), location)
    assert plan.decisions["gc/raw/v1"].action == Action.BUILD  # reads as not built
    finished = _gc_process(prefix, "tests/gc/pipelines.py:other", "")
    assert finished.returncode == 0, finished.stderr
    assert not (tmp_path / "p/gc/raw").exists()  # the next gc finishes the job


# --- the command ------------------------------------------------------------------------------


def test_cli_json_and_the_api_report_the_same(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    monkeypatch.chdir(REPO)
    prefix = str(tmp_path / "p")
    run(pipeline(), prefix=prefix)
    run(scratch(), prefix=prefix)
    assert main(["gc", TARGET, "--prefix", prefix, "--dry-run", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    api = collect_garbage([TARGET], prefix, dry_run=True).to_json()
    assert printed == api
    assert [c["step"] for c in printed["collected"]] == ["gc/scratch@v1"]
    assert printed["total_bytes"] == printed["collected"][0]["size_bytes"] > 0
    assert main(["gc", TARGET, "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert "deleted gc/scratch@v1" in out and "1 step(s) deleted" in out
    assert not (tmp_path / "p/gc/scratch").exists()


BAR = "━"  # rich's progress bar, drawn on the terminal only


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminal")
def test_a_long_real_run_shows_a_bar_on_a_terminal_and_none_in_a_pipe(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    junk = [f"gc/junk{i:02}@v1" for i in range(20)]  # at least PROGRESS_MIN_STEPS
    run([step(name[3:-3], "v1") for name in junk], prefix=str(prefix))
    piped = tmp_path / "piped"
    shutil.copytree(prefix, piped, symlinks=True)
    child = spawn_80("tests/gc/pipelines.py:other", "--prefix", str(prefix), command="gc")
    child.expect(pexpect.EOF)  # the process ended: all it wrote is in child.before
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    assert BAR in raw and "deleting" in raw, raw  # the bar was drawn
    screen = strip_ansi(raw).replace("\r\n", "\n").replace("\r", "\n")
    deleted = re.findall(r"^deleted (gc/junk\d+@v1) ", screen, re.M)
    assert sorted(deleted) == junk, screen  # each step still printed, above the bar
    last = screen.rstrip().splitlines()[-1]
    assert last.startswith("20 step(s) deleted, freed "), screen  # the summary came last
    assert screen.rindex("deleted gc/junk") < screen.rindex("20 step(s) deleted")
    assert not list(prefix.glob("gc/junk*/v1*")), list(prefix.rglob("*"))  # all deleted
    # Not a terminal (CI, a pipe): the same lines, no bar.
    plain = marin("gc", "tests/gc/pipelines.py:other", "--prefix", str(piped))
    assert plain.returncode == 0, plain.stderr
    assert BAR not in plain.stdout + plain.stderr and "deleting" not in plain.stderr
    assert sorted(re.findall(r"^deleted (gc/junk\d+@v1) ", plain.stdout, re.M)) == junk
    assert plain.stdout.splitlines()[-1].startswith("20 step(s) deleted, freed ")


@pytest.mark.parametrize(
    "argv",
    [
        ["gc"],
        ["gc", TARGET, "--keep-versions", "-1"],
        ["gc", TARGET, "--keep-versions", "two"],
        ["gc", TARGET, "--older-than", "3 fortnights"],
    ],
)
def test_cli_usage_errors_exit_2(argv: list[str], capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


def test_cli_exits_1_naming_what_could_not_be_deleted(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    from tests.reliability.faulty_fs import FAULTS

    monkeypatch.chdir(REPO)
    monkeypatch.setattr("marin.execution.store.location.RETRY_BASE_DELAY", 0.001)
    prefix = f"faulty://{tmp_path}/p"
    run(pipeline(), prefix=prefix)
    run(scratch(), prefix=prefix)
    FAULTS.add("rm_file", r"gc/scratch/v1/data\.txt$", times=None)
    try:
        assert main(["gc", TARGET, "--prefix", prefix]) == 1
    finally:
        FAULTS.clear()
    err = capsys.readouterr().out
    assert "error: could not delete gc/scratch@v1" in err
    location = open_prefix(prefix)
    assert read_record(location, "gc/scratch/v1") is None  # half deleted: reads as not built
    assert main(["gc", TARGET, "--prefix", prefix]) == 0  # and the next run finishes it
    assert not [p for p in (tmp_path / "p/gc/scratch").rglob("*") if p.is_file()]


def test_older_than_and_keep_versions_keep_recent_builds(prefix: str) -> None:
    for version in ("v1", "v2", "v3"):
        run([step("scratch", version, step("raw", "v1"))], prefix=prefix)
    report = collect_garbage(pipeline(), prefix, dry_run=True, older_than="1d")
    assert report.collected == []  # everything was built within the day
    report = collect_garbage(pipeline(), prefix, dry_run=True, keep_versions=1)
    assert sorted(c.step for c in report.collected) == ["gc/scratch@v1", "gc/scratch@v2"]


def test_an_adopted_steps_data_is_never_deleted(tmp_path: Path) -> None:
    from marin.execution.lazy import ArtifactStep

    prefix = tmp_path / "p"
    (prefix / "gc/inplace/v1").mkdir(parents=True)
    (prefix / "gc/inplace/v1/data.txt").write_text("the user's, adopted in place")
    run([ArtifactStep.adopt("gc/inplace", "v1", "gc/inplace/v1")], prefix=str(prefix))
    assert read_record(open_prefix(str(prefix)), "gc/inplace/v1") is not None
    report = collect_garbage(pipeline(), str(prefix))
    assert [(c.step, c.state) for c in report.collected] == [("gc/inplace@v1", "adopted")]
    assert (prefix / "gc/inplace/v1/data.txt").read_text() == "the user's, adopted in place"
    assert not (prefix / "gc/inplace/v1.marin").exists()


def test_gc_keeps_an_adopted_steps_source_under_the_prefix(tmp_path: Path) -> None:
    """Red team r6-4: ``adopt("gc/imported", "v1", "gc/raw/v1")`` keeps serving an old build
    after raw moved to v2; gc deleted ``gc/raw/v1`` under the adopted step it kept, with the
    plan, a pipeline not built yet, and a kept record each naming that source."""
    from marin.execution.lazy import ArtifactStep

    prefix = str(tmp_path / "p")
    run([step("raw", "v1")], prefix=prefix)

    def later() -> list[ArtifactStep]:
        imported = ArtifactStep.adopt("gc/imported", "v1", "gc/raw/v1")
        return [step("train", "v2", step("raw", "v2")), step("old", "v1", imported)]

    report = collect_garbage(later(), prefix, dry_run=True)  # adopted by the plan, not built
    assert "gc/raw/v1" not in [c.output_path for c in report.collected]
    run(later(), prefix=prefix)
    report = collect_garbage(later(), prefix)
    assert report.collected == []
    kept = {k.path: k.why for k in report.kept}
    assert kept["gc/raw/v1"] == "gc/imported@v1 adopts it (its source)"
    assert (tmp_path / "p/gc/raw/v1/data.txt").read_text() == "raw<-"
    # A kept record alone (kept by --keep-versions, not by the plan) keeps its source too.
    report = collect_garbage([], prefix, keep_versions=1, dry_run=True)
    kept = {k.path: k.why for k in report.kept}
    assert kept["gc/raw/v1"] == "gc/imported@v1 adopts it (its source)"
    decisions = _plan(later(), open_prefix(prefix)).decisions.values()
    assert {d.spec.step_id: d.action for d in decisions}["gc/imported@v1"] == Action.SKIP


@pytest.mark.parametrize(
    "spelling",
    [
        "gc/raw//v1",
        "{real}//gc/raw/v1",
        "gc//raw/v1/",
        "{link}/gc/raw/v1",
        "file://{real}/gc/raw/v1",
        "local://{link}/gc/raw//v1",
    ],
)
@pytest.mark.parametrize("via", ["real", "link"])
def test_gc_keeps_an_adopted_source_however_it_is_spelled(
    tmp_path: Path, spelling: str, via: str
) -> None:
    """Red team r7-5: an adopted source spelled ``raw//v1``, or reached through a link to the
    prefix while gc was given the real path (or the reverse), was taken for "elsewhere": gc
    deleted the build the plan still serves. Red team r8-1: so was a ``file://`` URL."""
    from marin.execution.lazy import ArtifactStep

    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    prefix = str(real if via == "real" else link)
    run([step("raw", "v1")], prefix=prefix)
    source = spelling.format(real=real, link=link)
    handles = [step("old", "v1", ArtifactStep.adopt("gc/imported", "v1", source))]
    run(handles, prefix=prefix)
    report = collect_garbage(handles, prefix)
    assert "gc/raw/v1" not in [c.output_path for c in report.collected]
    assert {k.path: k.why for k in report.kept}["gc/raw/v1"] == (
        "gc/imported@v1 adopts it (its source)"
    )
    assert (real / "gc/raw/v1/data.txt").read_text() == "raw<-"


def test_a_rebuild_never_clears_data_adopted_in_place(tmp_path: Path) -> None:
    """Red team r6-5: data adopted in place at ``gc/corpus/v1``, then the same name@version
    made a built step: ``--force`` (and ``--on-drift rebuild``) deleted the user's files. The
    build is refused before anything is touched, and no retry tries again."""
    from marin.execution.errors import AdoptedDataError, is_final
    from marin.execution.lazy import ArtifactStep

    prefix = tmp_path / "p"
    (prefix / "gc/corpus/v1").mkdir(parents=True)
    (prefix / "gc/corpus/v1/data.txt").write_text("PRECIOUS")
    run([ArtifactStep.adopt("gc/corpus", "v1", "gc/corpus/v1")], prefix=str(prefix))
    before = stored_files(open_prefix(str(prefix)))
    built = apply("gc/corpus", write_step_plain, version="v1", out_path=OUT).with_options(retries=2)
    options: list[dict[str, Any]] = [{"force": ["gc/corpus"]}, {"on_drift": "rebuild"}]
    for option in options:
        with pytest.raises(Exception) as raised:
            run([built], prefix=str(prefix), **option)
        error = _cause(raised.value, AdoptedDataError)
        assert error.step == "gc/corpus@v1" and is_final(error)
        assert "source" in error.what and "bump gc/corpus's version" in error.fix
        assert stored_files(open_prefix(str(prefix))) == before  # nothing touched
    # Moved away first, the adoption's path is empty: the build goes ahead.
    shutil.move(prefix / "gc/corpus/v1", tmp_path / "moved")
    run([built], prefix=str(prefix), on_drift="rebuild")
    assert (tmp_path / "moved/data.txt").read_text() == "PRECIOUS"
    assert read_record(open_prefix(str(prefix)), "gc/corpus/v1").source is None


def test_data_put_at_the_path_of_an_adoption_from_elsewhere_is_said_to_be_so(
    tmp_path: Path,
) -> None:
    """Red team r9 (minor): the refusal said such data was adopted "(its record's source is
    /elsewhere)"; it was put there since, and the refusal names that."""
    from marin.execution.errors import AdoptedDataError
    from marin.execution.lazy import ArtifactStep

    prefix = tmp_path / "p"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/data.txt").write_text("ADOPTED")
    run([ArtifactStep.adopt("gc/corpus", "v1", str(tmp_path / "elsewhere"))], prefix=str(prefix))
    (prefix / "gc/corpus/v1").mkdir(parents=True)
    (prefix / "gc/corpus/v1/data.txt").write_text("PUT THERE")
    with pytest.raises(Exception) as raised:
        run([step("corpus", "v1")], prefix=str(prefix), force=["gc/corpus"])
    error = _cause(raised.value, AdoptedDataError)
    assert f"holds data put there since it was adopted from {tmp_path}/elsewhere" in error.what
    assert (prefix / "gc/corpus/v1/data.txt").read_text() == "PUT THERE"
    # Its record torn (red team r11, r9-1's variant): the adoption's mark still refuses.
    record = prefix / "gc/corpus/v1.marin/record.json"
    record.write_bytes(record.read_bytes()[:100])
    with pytest.raises(Exception) as raised:
        run([step("corpus", "v1")], prefix=str(prefix))
    assert "never Marin's" in _cause(raised.value, AdoptedDataError).what
    assert (prefix / "gc/corpus/v1/data.txt").read_text() == "PUT THERE"


@pytest.mark.parametrize("damage", ["torn", "emptied", "deleted"])
def test_a_lost_adoption_record_never_makes_data_adopted_in_place_clearable(
    tmp_path: Path, damage: str
) -> None:
    """Red team r9-1: data adopted in place, then its record torn (a copy cut short), emptied
    or deleted: a build of that name@version took the record's metadata folder as proof that
    Marin wrote the data, and cleared it. The adoption marks the folder before its record
    (``adopted.json``); once the data is moved away, the build goes ahead and drops the mark."""
    prefix = tmp_path / "p"
    (prefix / "gc/corpus/v1").mkdir(parents=True)
    (prefix / "gc/corpus/v1/data.txt").write_text("PRECIOUS")
    args = ("--prefix", str(prefix))
    assert marin("run", "tests/gc/pipelines.py:corpus_adopted", *args).returncode == 0
    record = prefix / "gc/corpus/v1.marin/record.json"
    if damage == "deleted":
        record.unlink()
    else:
        record.write_bytes(record.read_bytes()[:300] if damage == "torn" else b"")
    for more in ([], ["--force", "gc/corpus"]):
        refused = marin("run", "tests/gc/pipelines.py:corpus_built", *args, *more)
        assert refused.returncode == 1, refused.stderr
        assert "left there, never Marin's (gc/corpus/v1.marin/adopted.json says so)" in (
            refused.stdout + refused.stderr
        )
        assert os.listdir(prefix / "gc/corpus/v1") == ["data.txt"]
    assert (prefix / "gc/corpus/v1/data.txt").read_text() == "PRECIOUS"
    shutil.move(prefix / "gc/corpus/v1", tmp_path / "moved")
    for more in ([], ["--force", "gc/corpus"]):  # built, then rebuilt in place: no mark left
        assert marin("run", "tests/gc/pipelines.py:corpus_built", *args, *more).returncode == 0
    assert not (prefix / "gc/corpus/v1.marin/adopted.json").exists()
    assert (tmp_path / "moved/data.txt").read_text() == "PRECIOUS"


@pytest.mark.parametrize("killed", ["an adoption holding its lease", "gc deleting an adoption"])
def test_an_adoptions_leftovers_never_make_its_data_deletable(tmp_path: Path, killed: str) -> None:
    """Red team r9-2 and r9-3: data adopted in place; the adoption killed holding its lease (a
    lease naming the output, nothing saying "adoption"), or a gc killed while it deleted the
    adoption's record (its FAILED status, the same): the next gc deleted the data, and a build
    of that name@version cleared it as debris. An adoption's lease and every status written
    for one say so."""
    from marin.execution.errors import StepFailedError
    from tests.gc.pipelines import corpus_adopted

    prefix = tmp_path / "p"
    (prefix / "gc/corpus/v1").mkdir(parents=True)
    (prefix / "gc/corpus/v1/data.txt").write_text("PRECIOUS")
    adoption = "tests/gc/pipelines.py:corpus_adopted"
    if killed == "an adoption holding its lease":
        crashed = _gc_process(str(prefix), adoption, "after-lease@gc/corpus", command="run")
    else:
        run(corpus_adopted(), prefix=str(prefix))
        crashed = _gc_process(str(prefix), OTHER, "gc-after-record@gc/corpus")
    assert crashed.returncode == -9, crashed.stderr
    assert read_record(open_prefix(str(prefix)), "gc/corpus/v1") is None
    # Its lease or status says "adoption"; the mark it wrote before its record says so too.
    said = "holds only an adoption's lease or status|holds data an adoption left there"
    with pytest.raises(StepFailedError, match=said):
        run([step("corpus", "v1")], prefix=str(prefix))
    assert os.listdir(prefix / "gc/corpus/v1") == ["data.txt"]
    finished = _gc_process(str(prefix), OTHER, "")
    assert finished.returncode == 0, finished.stderr
    assert (prefix / "gc/corpus/v1/data.txt").read_text() == "PRECIOUS"
    assert not (prefix / "gc/corpus/v1.marin").exists()  # its metadata went


def test_a_failed_adoptions_status_never_makes_user_data_deletable(tmp_path: Path) -> None:
    """Red team r7-6: an in-place adopt run before the data was there failed and left a status
    beside ``gc/corpus/v1``; the data the user put there next was cleared by a build of that
    name@version as a failed attempt's debris, and deleted by gc. An adoption never writes its
    output path: its status proves nothing there."""
    from marin.execution.errors import StepFailedError, StorageError
    from marin.execution.lazy import ArtifactStep

    prefix = tmp_path / "p"
    with pytest.raises(StepFailedError):
        run([ArtifactStep.adopt("gc/corpus", "v1", "gc/corpus/v1")], prefix=str(prefix))
    status = read_status_file(open_prefix(str(prefix)), "gc/corpus/v1")
    assert status is not None and status["adoption"] == "gc/corpus/v1"
    (prefix / "gc/corpus/v1").mkdir(parents=True)
    (prefix / "gc/corpus/v1/data.txt").write_text("PRECIOUS")
    built = apply("gc/corpus", write_step_plain, version="v1", out_path=OUT)
    with pytest.raises(StepFailedError) as raised:
        run([built], prefix=str(prefix))
    error = _cause(raised.value, StorageError)
    assert "holds only an adoption's lease or status" in error.what and "move it away" in error.fix
    assert os.listdir(prefix / "gc/corpus/v1") == ["data.txt"]  # nothing cleared, nothing built
    report = collect_garbage(pipeline(), str(prefix))  # another pipeline's gc
    assert [(c.step, c.state) for c in report.collected] == [("gc/corpus@v1", "failed")]
    assert (prefix / "gc/corpus/v1/data.txt").read_text() == "PRECIOUS"  # only .marin went
    assert not (prefix / "gc/corpus/v1.marin").exists()


def write_step_plain(out_path: str) -> None:
    os.makedirs(out_path, exist_ok=True)
    Path(out_path, "new.txt").write_text("built")


def _cause(error: BaseException, kind: type[BaseException]) -> Any:
    """``error`` or the first error of its kind in its causes (a failed run wraps it)."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, kind):
        inner = getattr(seen, "failures", None)
        seen = next(iter(inner.values())) if inner else (seen.__cause__ or seen.__context__)
    assert seen is not None, f"no {kind.__name__} in {error!r}"
    return seen


def test_stored_times_are_read_by_one_public_parser() -> None:
    """``marin gc``'s ages and ``marin ls --after/--before`` read a record's times with the
    store's ``parse_stored_time``: a zone-less time is UTC, and hostile data is unknown."""
    import datetime

    import marin.gc.roots
    import marin.ls_filter
    from marin.execution.store.records import parse_stored_time

    noon = datetime.datetime(2026, 1, 31, 12, tzinfo=datetime.UTC)
    for text in ("2026-01-31T12:00:00Z", "2026-01-31T12:00:00", "2026-01-31T13:00:00+01:00"):
        assert parse_stored_time(text) == noon
    for hostile in (None, 3, "", "last tuesday", ["2026-01-31"], "2026-13-01"):
        assert parse_stored_time(hostile) is None
    assert marin.gc.roots.parse_stored_time is parse_stored_time
    assert marin.ls_filter.parse_stored_time is parse_stored_time
    assert marin.ls_filter.parse_when("2026-01-31T12:00", "--after") == noon


@pytest.mark.parametrize("age", ["99999999999999w", "3000000d"])
def test_an_age_before_the_year_1_is_an_option_error(age: str, tmp_path: Path) -> None:
    from marin.execution.errors import OptionError

    with pytest.raises(OptionError, match="reaches back before the year 1"):
        collect_garbage([], str(tmp_path / "p"), older_than=age)
    argv = ["gc", TARGET, "--older-than", age, "--prefix", str(tmp_path / "p")]
    try:
        code = main(argv)
    except SystemExit as exc:  # refused by the argument parser itself
        code = exc.code
    assert code == 2  # bad input, not a crash (it was an OverflowError)
    assert not (tmp_path / "p").exists()
