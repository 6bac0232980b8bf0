"""``marin gc`` trusted (issue 53: 1, 10, 12, 17; issue 55.9): it keeps what each user's plan
serves and never touches another user's folder, reclaims a crash's leftovers, lists (or cancels)
orphaned jobs, and two of it at once report each step once and leave no debris. Through the
command line, on real file systems."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from marin.cli import main
from marin.execution.lazy import run
from marin.execution.store.lease import Lease
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record, record_path, write_status
from tests.gc.pipelines import pipeline, scratch, step
from tests.reliability.conftest import REPO, child_env
from tests.reliability.pipelines import wait_for_file
from tests.ux.helpers import marin

SCOPED = "tests/gc/pipelines.py:scoped"
TARGET = "tests/gc/pipelines.py:pipeline"
DEFERRED = "tests/gc/pipelines.py:deferred"
REMOTE = "tests/gc/pipelines.py:remote"


def gc_json(capsys: Any, *argv: str) -> dict[str, Any]:
    """``marin gc ... --json`` in this process: its report (exit 0 asserted)."""
    assert main(["gc", *argv, "--json"]) == 0, capsys.readouterr().err
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def built(prefix: Path, output_path: str) -> bool:
    return read_record(open_prefix(str(prefix)), output_path) is not None


@pytest.fixture
def users(tmp_path: Path, monkeypatch: Any) -> Path:
    """The team's shared raw; alice's and bob's user-scope models and scratch experiments."""
    monkeypatch.chdir(REPO)
    prefix = tmp_path / "p"
    run([step("raw", "v1")], prefix=str(prefix))
    for user in ("alice", "bob"):
        monkeypatch.setenv("MARIN_USER", user)
        assert main(["run", SCOPED, "--prefix", str(prefix), "--no-progress"]) == 0
        assert main(["run", "tests/gc/pipelines.py:scratch", "--prefix", str(prefix),
                     "--scope", "user", "--no-progress"]) == 0  # fmt: skip
    return prefix


def test_gc_keeps_every_users_build_the_target_serves(users: Path, capsys, monkeypatch) -> None:
    """Issue 53.1: alice's gc of the target kept nothing of any user's folder: her model and
    bob's were deleted while their plans served them."""
    monkeypatch.setenv("MARIN_USER", "alice")
    report = gc_json(capsys, SCOPED, "--prefix", str(users))
    assert [c["output_path"] for c in report["collected"]] == ["users/alice/gc/scratch/v1"]
    kept = {k["path"] for k in report["kept"]}
    assert kept == {"gc/raw/v1", "users/alice/gc/model/v1"}
    assert report["other_users"] == [
        {"path": "users/bob", "why": "another user's builds (--all-users collects them too)"}
    ]
    for path in ("gc/raw/v1", "users/alice/gc/model/v1", "users/bob/gc/model/v1",
                 "users/bob/gc/scratch/v1"):  # fmt: skip
        assert built(users, path), path
    assert report["not_marins"] == []
    # The plan still serves alice's model: nothing to build.
    assert main(["plan", SCOPED, "--prefix", str(users), "--exit-code"]) == 0


def test_all_users_keeps_each_users_own_placement(users: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_USER", "alice")
    report = gc_json(capsys, SCOPED, "--prefix", str(users), "--all-users")
    assert sorted(c["output_path"] for c in report["collected"]) == [
        "users/alice/gc/scratch/v1",
        "users/bob/gc/scratch/v1",
    ]
    assert {k["path"] for k in report["kept"]} == {
        "gc/raw/v1",
        "users/alice/gc/model/v1",
        "users/bob/gc/model/v1",
    }
    assert report["other_users"] == []
    monkeypatch.setenv("MARIN_USER", "bob")
    assert main(["plan", SCOPED, "--prefix", str(users), "--exit-code"]) == 0


def test_a_service_account_leaves_every_users_folder_alone(users: Path, capsys, monkeypatch):
    """A team's cron gc (no user) never collects in users' folders; their inputs stay too."""
    monkeypatch.setenv("MARIN_USER", "root")
    monkeypatch.setattr("getpass.getuser", lambda: "root")
    report = gc_json(capsys, TARGET, "--prefix", str(users))
    assert report["collected"] == []  # raw is what every user's build was made from
    assert [x["path"] for x in report["other_users"]] == ["users/alice", "users/bob"]


def test_scope_user_keeps_a_user_scope_runs_builds(tmp_path: Path, capsys, monkeypatch) -> None:
    """``gc --scope user`` keeps what ``run --scope user`` built; without it, the target's plan
    places nothing in a user's folder, so it proves nothing about the user's own builds: they
    are left alone, with ``--all-users`` too (red team round 5, finding 4: it deleted them)."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MARIN_USER", "alice")
    prefix = str(tmp_path / "p")
    assert main(["run", TARGET, "--prefix", prefix, "--scope", "user", "--no-progress"]) == 0
    capsys.readouterr()
    dry = gc_json(capsys, TARGET, "--prefix", prefix, "--scope", "user", "--dry-run")
    assert dry["collected"] == []
    assert {k["path"] for k in dry["kept"]} == {
        f"users/alice/gc/{name}/v1" for name in ("raw", "tok", "train")
    }
    dry = gc_json(capsys, TARGET, "--prefix", prefix, "--dry-run")
    assert dry["collected"] == []
    assert [x["path"] for x in dry["other_users"]] == ["users/alice"]
    dry = gc_json(capsys, TARGET, "--prefix", prefix, "--dry-run", "--all-users")
    assert dry["collected"] == []
    assert dry["other_users"] == [
        {"path": "users/alice", "why": "your user builds: this plan places nothing there "
         "(--scope user)"}
    ]  # fmt: skip


def test_gc_with_a_version_codex_keeps_that_codexs_builds(tmp_path, capsys, monkeypatch) -> None:
    """Issue 53.1 / 55.9: gc, graph and why take --version and --override as run does."""
    monkeypatch.chdir(REPO)
    prefix = str(tmp_path / "p")
    for version in ("v2", "v3"):
        assert main(["run", DEFERRED, "--prefix", prefix, "--version", version]) == 0
    capsys.readouterr()
    report = gc_json(capsys, DEFERRED, "--prefix", prefix, "--version", "v3")
    assert [c["output_path"] for c in report["collected"]] == ["gc/dv/v2"]
    assert [k["path"] for k in report["kept"]] == ["gc/dv/v3"]
    report = gc_json(capsys, DEFERRED, "--prefix", prefix, "--override", "gc/dv=v3")
    assert report["collected"] == []
    assert main(["graph", DEFERRED, "--version", "v3", "--prefix", prefix]) == 0
    assert "gc/dv@v3" in capsys.readouterr().out
    assert main(["why", DEFERRED, "gc/dv", "--override", "gc/dv=v4", "--prefix", prefix]) == 0
    assert capsys.readouterr().out.startswith("gc/dv@v4: build")


def test_graph_and_why_take_the_scope(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MARIN_USER", "alice")
    prefix = str(tmp_path / "p")
    assert main(["run", TARGET, "--prefix", prefix, "--scope", "user", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["why", TARGET, "gc/train", "--prefix", prefix]) == 0
    assert capsys.readouterr().out.startswith("gc/train@v1: build")  # nothing shared is built
    assert main(["why", TARGET, "gc/train", "--prefix", prefix, "--scope", "user"]) == 0
    assert capsys.readouterr().out.startswith("gc/train@v1: skip")  # alice's own build
    assert main(["graph", TARGET, "--prefix", prefix, "--scope", "user"]) == 0
    assert "to run" not in capsys.readouterr().out


@pytest.mark.parametrize("command", [["gc"], ["plan"], ["graph"], ["run"]])
def test_a_repeated_override_is_refused(command: list[str], tmp_path, capsys, monkeypatch):
    """Issue 53.17: the last of two ``--override`` values for one name silently won."""
    monkeypatch.chdir(REPO)
    argv = [*command, DEFERRED, "--prefix", str(tmp_path / "p")]
    argv += ["--override", "gc/dv=v1", "--override", "gc/dv=v2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--override gc/dv is given twice (gc/dv=v1, gc/dv=v2)" in err
    assert not (tmp_path / "p").exists()


# --- a crash's leftovers, orphaned jobs, a step being built, one line per path ----------------


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "started").mkdir(exist_ok=True)
    return child_env(
        MARIN_TEST_STARTED=str(tmp_path / "started"),
        MARIN_TEST_GATE=str(tmp_path / "gate"),
        MARIN_REMOTE_POLL_MAX_S="0.2",
        **extra,
    )


def started_pid(path: Path) -> int:
    """The pid a step wrote to ``path`` when it started (waiting for the whole line)."""
    wait_for_file(str(path), timeout=60)
    deadline = time.monotonic() + 60
    while not path.read_text().endswith("\n"):  # created, not yet written
        assert time.monotonic() < deadline, f"{path} stayed empty"
        time.sleep(0.005)
    return int(path.read_text().split()[0])


def driver_of(target: str, prefix: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``marin run`` in its own session (a kill of its group kills it, not a detached job)."""
    return subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", target, "--prefix", str(prefix),
         "--no-progress"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def test_a_killed_builds_leftovers_are_reclaimed(tmp_path: Path) -> None:
    """Issue 53.10: after ``kill -9`` of ``marin run``, its step's folder holds Marin's lease
    (its holder gone), log and partial output: gc called it "not Marin's" and kept it."""
    prefix = tmp_path / "p"
    env = env_for(tmp_path)
    driver = driver_of("tests/gc/pipelines.py:crashing", prefix, env)
    started_pid(tmp_path / "started" / "gc_crash")
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    folder = prefix / "gc/crash/v1.marin"
    assert {"lease.json", "log.txt"} <= set(os.listdir(folder))
    assert not (folder / "record.json").exists()
    done = marin("gc", "tests/gc/pipelines.py:other", "--prefix", str(prefix), "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {(c["step"], c["state"]) for c in report["collected"]} == {("gc/crash@v1", "unfinished")}
    assert report["not_marins"] == []
    assert not (prefix / "gc/crash").exists()


@pytest.mark.parametrize(
    "plant",
    ["copied status", "bare status", "lone log", "old lease"],
)
def test_metadata_naming_no_step_never_gets_user_data_deleted(
    plant: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Red team r6-11: a status names no step, so one copied from a failed build's folder (or
    a bare ``{"state": "FAILED"}``, a lone ``log.txt``, a lease naming no output) beside the
    user's own files made gc delete them. Only a record, status, lease or job naming that very
    output proves a folder is Marin's build of it; the rest is kept and reported."""
    monkeypatch.chdir(REPO)
    prefix = tmp_path / "p"
    location = open_prefix(str(prefix))
    write_status(location, "gc/failed/v0", "FAILED", error="boom")  # a failed build's own
    run(pipeline(), prefix=str(prefix))
    (prefix / "gc/corpus/v1").mkdir(parents=True)
    (prefix / "gc/corpus/v1/data.txt").write_text("PRECIOUS")
    meta = prefix / "gc/corpus/v1.marin"
    meta.mkdir()
    if plant == "copied status":
        shutil.copy(prefix / "gc/failed/v0.marin/status.json", meta / "status.json")
    elif plant == "bare status":
        (meta / "status.json").write_text('{"state": "FAILED"}')
    elif plant == "lone log":
        (meta / "log.txt").write_text("some log\n")
    else:
        lease = Lease(location, "gc/corpus/v1", ttl=1)
        assert lease.try_acquire() is None
        body = json.loads((meta / "lease.json").read_text())
        lease.release()  # its own goes (only its guard stays: gc says it proves nothing)
        (meta / "lease.json").write_text(json.dumps({**body, "output_path": None}))
    report = gc_json(capsys, TARGET, "--prefix", str(prefix))
    assert (prefix / "gc/corpus/v1/data.txt").read_text() == "PRECIOUS"
    assert "gc/corpus@v1" not in [c["step"] for c in report["collected"]]
    (left,) = [n for n in report["not_marins"] if n["path"] == "gc/corpus/v1"]
    # A copy names another output; the rest name none (one rule with a build's, r20-3).
    assert "naming this output" in left["why"] or "does not name this output" in left["why"]
    assert [c["step"] for c in report["collected"]] == ["gc/failed@v0"]  # its own: named


def test_an_orphaned_job_is_listed_and_cancelled_on_request(tmp_path: Path) -> None:
    """Issue 53.10: a version bumped while its job ran (the driver killed) left the job running
    for nothing, silently. ``plan`` warns of it; ``gc`` lists it and keeps its step (deleting
    it would pull the folder from under a running job); ``--cancel-orphans`` cancels it."""
    prefix = tmp_path / "p"
    env = env_for(tmp_path)
    driver = driver_of(REMOTE, prefix, env)
    try:
        job_pid = started_pid(tmp_path / "started" / "gc_rtrain")
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        _orphan_is_listed_then_cancelled(prefix, env, job_pid)
    finally:
        (tmp_path / "gate").touch()  # a job this test left running ends


def _orphan_is_listed_then_cancelled(prefix: Path, env: dict[str, str], job_pid: int) -> None:
    from marin.execution.remote.local_job import start_time

    assert start_time(job_pid) is not None  # the job outlived its driver
    bumped = {**env, "MARIN_TEST_GC_TRAIN": "v2"}
    plan = marin("plan", REMOTE, "--prefix", str(prefix), "--json", env=bumped)
    assert plan.returncode == 0, plan.stderr
    (train,) = [s for s in json.loads(plan.stdout)["steps"] if s["step"] == "gc/rtrain@v2"]
    (running,) = train["other_jobs"]
    assert (running["version"], running["state"]) == ("v1", "running")
    other_job = running["job_id"]
    table = marin("plan", REMOTE, "--prefix", str(prefix), env={**bumped, "COLUMNS": "200"})
    assert f"job {other_job} of version v1 still runs" in table.stdout, table.stdout
    listed = marin("gc", REMOTE, "--prefix", str(prefix), "--json", env=bumped)
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert report["collected"] == []
    assert [(o["step"], o["state"], o["action"]) for o in report["orphans"]] == [
        ("gc/rtrain@v1", "running", "left running")
    ]
    assert "--cancel-orphans cancels it" in report["skipped"][0]["why"]
    assert start_time(job_pid) is not None and (prefix / "gc/rtrain/v1.marin").is_dir()
    # Red team r10 (minor): gc of another pipeline deleted the running job's input.
    other = marin("gc", "tests/gc/pipelines.py:other", "--prefix", str(prefix), "--json", env=env)
    assert other.returncode == 0, other.stderr
    kept = {k["path"]: k["why"] for k in json.loads(other.stdout)["kept"]}
    assert kept["gc/rdata/v1"] == f"read by local job {other_job} of gc/rtrain@v1, which may run"
    assert built(prefix, "gc/rdata/v1") and start_time(job_pid) is not None
    dry = marin("gc", REMOTE, "--prefix", str(prefix), "--cancel-orphans", "--dry-run", env=bumped)
    assert "would delete gc/rtrain@v1" in dry.stdout and "would cancel" in dry.stdout
    assert start_time(job_pid) is not None
    cancelled = marin("gc", REMOTE, "--prefix", str(prefix), "--cancel-orphans", env=bumped)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"local job {other_job} of gc/rtrain@v1 (running): cancelled" in cancelled.stdout
    assert "deleted gc/rtrain@v1" in cancelled.stdout
    assert start_time(job_pid) is None  # the job is gone
    assert not (prefix / "gc/rtrain/v1.marin").exists()
    assert built(prefix, "gc/rdata/v1")


def test_a_step_being_built_is_skipped_not_called_foreign(tmp_path: Path, capsys) -> None:
    """Issue 53.17: a live lease and no record yet is a step being built (skipped), not a
    folder that is "not Marin's"; and a path is listed once."""
    prefix = tmp_path / "p"
    run(pipeline(), prefix=str(prefix))
    location = open_prefix(str(prefix))
    lease = Lease(location, "gc/being/v1")  # this process builds it: a live lease
    assert lease.try_acquire() is None
    (prefix / "gc/being/v1").mkdir()
    (prefix / "gc/being/v1/part-0").write_text("half")
    outside = tmp_path / "outside"
    outside.mkdir()
    (prefix / "gc/sl/v1.marin").mkdir(parents=True)
    (prefix / "gc/sl/v1.marin/status.json").write_text('{"state": "FAILED"}')
    (prefix / "gc/sl/v1").symlink_to(outside)  # an output that is a link
    try:
        for dry in ([], ["--dry-run"]):
            report = gc_json(capsys, str(REPO / TARGET), "--prefix", str(prefix), *dry)
            assert report["collected"] == []
            (skipped,) = report["skipped"]
            assert skipped["step"] == "gc/being@v1"
            assert skipped["why"].startswith("being built: its lease is live, held by ")
            paths = [x["path"] for x in report["not_marins"]]
            assert paths == ["gc/sl/v1"]  # once
            assert (prefix / "gc/being/v1/part-0").read_text() == "half"
    finally:
        lease.release()


# --- two gc at once ----------------------------------------------------------------------------


def _fail(out_path: str) -> None:
    raise RuntimeError("a failed attempt: a status, no record")


def test_two_gcs_at_once_report_each_step_once_and_leave_no_debris(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Issue 53.12: gc B listed the prefix; gc A (another process) then deleted everything; B
    then reported collecting the failed step again, and left ``lease.json.guard`` behind."""
    from marin.execution.lazy import OUT, apply
    from marin.gc import api

    monkeypatch.chdir(REPO)
    prefix = tmp_path / "p"
    run(pipeline(), prefix=str(prefix))
    run(scratch(), prefix=str(prefix))
    failing = apply("gc/failed", _fail, version="v1", out_path=OUT)
    with pytest.raises(Exception, match="a failed attempt"):
        run([failing], prefix=str(prefix))
    listed = api.list_prefix

    def listing_then_other_gc(location: Any) -> Any:
        found = listed(location)
        other = marin("gc", TARGET, "--prefix", str(prefix))  # gc A, to its end
        assert other.returncode == 0, other.stderr
        assert "deleted gc/scratch@v1" in other.stdout and "deleted gc/failed@v1" in other.stdout
        return found

    monkeypatch.setattr(api, "list_prefix", listing_then_other_gc)
    assert main(["gc", TARGET, "--prefix", str(prefix)]) == 0
    out = capsys.readouterr().out
    assert "deleted gc/" not in out  # A collected them: B says so, not that it did
    for step_id in ("gc/scratch@v1", "gc/failed@v1"):
        assert f"skipped {step_id}: deleted since the listing" in out
    assert not (prefix / "gc/scratch").exists() and not (prefix / "gc/failed").exists()


def test_a_later_gc_reclaims_a_lease_guards_debris(tmp_path: Path, capsys, monkeypatch) -> None:
    """Debris an older gc left (a metadata folder holding only ``lease.json.guard``)."""
    monkeypatch.chdir(REPO)
    prefix = tmp_path / "p"
    run(pipeline(), prefix=str(prefix))
    (prefix / "gc/old/v1.marin").mkdir(parents=True)
    (prefix / "gc/old/v1.marin/lease.json.guard").write_bytes(b"")
    report = gc_json(capsys, TARGET, "--prefix", str(prefix))
    assert [(c["step"], c["state"]) for c in report["collected"]] == [("gc/old@v1", "unfinished")]
    assert not (prefix / "gc/old").exists()


# --- a gc-deleted input ------------------------------------------------------------------------


def test_a_reader_of_an_input_gc_deleted_is_told_so(tmp_path: Path) -> None:
    """Issue 53.17: an input gc deleted while a step read it was reported as "rebuilt by
    another runner"."""
    from tests.gc.test_gc import GO, start_reader

    prefix = str(tmp_path / "p")
    run(scratch(), prefix=prefix)
    thread, failure = start_reader(prefix)
    done = marin("gc", "tests/gc/pipelines.py:other", "--prefix", prefix)
    GO.set()
    thread.join(30)
    assert done.returncode == 0 and "deleted gc/raw@v1" in done.stdout, done.stderr
    text = str(failure[0])
    assert "input gc/raw@v1 had its record deleted (by `marin gc`, or by hand)" in text, text
    assert "another runner" not in text
    assert read_record(open_prefix(prefix), "gc/reader/v1") is None
    assert not (tmp_path / "p" / record_path("gc/raw/v1")).exists()


# --- red team round 5 ----------------------------------------------------------------------------


def test_all_users_with_a_shared_plan_keeps_every_users_scope_user_builds(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Finding 4: alice built the target with ``--scope user``; bob's ``marin gc TARGET
    --all-users`` (the natural admin command) deleted her builds, which her plan serves. One
    rule for each user folder: a plan that places nothing there leaves it alone."""
    monkeypatch.chdir(REPO)
    prefix = str(tmp_path / "p")
    monkeypatch.setenv("MARIN_USER", "alice")
    assert main(["run", TARGET, "--prefix", prefix, "--scope", "user", "--no-progress"]) == 0
    monkeypatch.setenv("MARIN_USER", "bob")
    capsys.readouterr()
    report = gc_json(capsys, TARGET, "--prefix", prefix, "--all-users")
    assert report["collected"] == []
    assert report["other_users"] == [
        {"path": "users/alice",
         "why": "alice's user builds: this plan places nothing there (--scope user)"}
    ]  # fmt: skip
    monkeypatch.setenv("MARIN_USER", "alice")
    flags = ["--prefix", prefix, "--scope", "user", "--exit-code"]
    assert main(["plan", TARGET, *flags]) == 0  # nothing to rebuild
    # With a plan that places steps in users' folders, each user's own placement is kept.
    monkeypatch.setenv("MARIN_USER", "bob")
    capsys.readouterr()
    report = gc_json(capsys, TARGET, "--prefix", prefix, "--all-users", "--scope", "user")
    assert report["collected"] == [] and len(report["kept"]) == 3
    monkeypatch.setenv("MARIN_USER", "alice")
    assert main(["plan", TARGET, *flags]) == 0


def test_all_users_never_judges_another_users_deferred_versions_by_its_own_codex(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Finding 4: bob's ``gc --all-users --scope user --version v2`` deleted alice's ``--scope
    user --version exp7`` builds, although their records name her codex. Another user's build
    of a deferred step at another version is hers to judge; gc's own codex judges the caller's
    folder and the shared one."""
    monkeypatch.chdir(REPO)
    prefix = str(tmp_path / "p")
    runs = [("alice", "exp7"), ("bob", "v1"), ("bob", "v2")]
    for user, version in runs:
        monkeypatch.setenv("MARIN_USER", user)
        argv = ["run", DEFERRED, "--prefix", prefix, "--scope", "user", "--version", version]
        assert main(argv) == 0
    assert main(["run", DEFERRED, "--prefix", prefix, "--version", "v1"]) == 0  # shared
    capsys.readouterr()
    report = gc_json(capsys, DEFERRED, "--prefix", prefix, "--all-users", "--scope", "user",
                     "--version", "v2")  # fmt: skip
    assert sorted(c["output_path"] for c in report["collected"]) == [
        "gc/dv/v1",  # the shared one: this codex's to judge
        "users/bob/gc/dv/v1",  # the caller's own folder: his codex judges it
    ]
    kept = {k["path"]: k["why"] for k in report["kept"]}
    assert kept["users/alice/gc/dv/exp7"].startswith("alice's build at another version")
    assert kept["users/bob/gc/dv/v2"].startswith("needed by the targets")
    monkeypatch.setenv("MARIN_USER", "alice")
    flags = ["--prefix", prefix, "--scope", "user", "--version", "exp7", "--exit-code"]
    assert main(["plan", DEFERRED, *flags]) == 0


def test_a_build_inside_another_steps_output_is_refused(tmp_path: Path, capsys, monkeypatch):
    """Finding 5: a pipeline built ``gc/corpus/v1/model@v2`` inside the committed output of
    another pipeline's ``gc/corpus@v1`` on the same prefix, changing that artifact after its
    commit. The build is refused before anything is written."""
    monkeypatch.chdir(REPO)
    prefix = str(tmp_path / "p")
    assert main(["run", "tests/gc/pipelines.py:outer", "--prefix", prefix, "--no-progress"]) == 0
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "p").rglob("*"))
    capsys.readouterr()
    assert main(["run", "tests/gc/pipelines.py:inner", "--prefix", prefix, "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "lies inside another step's output" in err and "gc/corpus/v1.marin" in err
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "p").rglob("*")) == before


def test_gc_never_deletes_a_step_whose_output_holds_another_steps_build(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Finding 5: ``marin gc inner`` deleted ``gc/corpus@v1`` (not needed by that plan), and with
    its output folder the inner build the plan serves ("0 kept"). gc applies the build's rule:
    a folder holding another step's metadata is never deleted. (Builds now refuse to nest, so
    the inner build is made elsewhere and copied in, as by a release without that check.)"""
    monkeypatch.chdir(REPO)
    prefix = str(tmp_path / "p")
    for target, where in (("outer", "p"), ("inner", "elsewhere")):
        argv = ["run", f"tests/gc/pipelines.py:{target}", "--prefix", str(tmp_path / where)]
        assert main(argv) == 0
    for folder in ("v2", "v2.marin"):
        shutil.copytree(tmp_path / "elsewhere/gc/corpus/v1/model" / folder,
                        tmp_path / "p/gc/corpus/v1/model" / folder)  # fmt: skip
    capsys.readouterr()
    report = gc_json(capsys, "tests/gc/pipelines.py:inner", "--prefix", prefix)
    assert report["collected"] == []
    assert report["skipped"] == [
        {"path": "gc/corpus/v1", "step": "gc/corpus@v1",
         "why": "its output holds another step's build (gc/corpus/v1/model/v2.marin): deleting "
         "it would delete that build too; move one of the two, then run gc again"}
    ]  # fmt: skip
    # The walk never enters an output (its cost stays one listing per folder): the inner build
    # is kept with the outer one, named by the skip.
    assert built(tmp_path / "p", "gc/corpus/v1") and built(tmp_path / "p", "gc/corpus/v1/model/v2")
    flags = ["--prefix", prefix, "--exit-code"]
    assert main(["plan", "tests/gc/pipelines.py:inner", *flags]) == 0


# --- red team round 2 (fresh context) ------------------------------------------------------------


def test_a_link_in_users_is_listed_and_gc_goes_on(users: Path, capsys, monkeypatch) -> None:
    """Round-two finding 7: a link planted as a user folder (``users/mallory -> alice``), or
    inside one where its plan places a step, made every ``gc --all-users --scope user`` stop
    with exit 2, nothing collected. Links elsewhere are listed "not Marin's" and gc goes on:
    so do these, never followed, nothing deleted through them."""
    (users / "users" / "mallory").symlink_to("alice")
    (users / "users" / "eve").mkdir()
    (users / "users" / "eve" / "gc").symlink_to("../bob/gc")
    monkeypatch.setenv("MARIN_USER", "carol")
    args = (SCOPED, "--prefix", str(users), "--all-users", "--scope", "user")
    dry = gc_json(capsys, *args, "--dry-run")
    report = gc_json(capsys, *args)
    assert report["collected"] == dry["collected"]
    assert sorted(c["output_path"] for c in report["collected"]) == [
        "users/alice/gc/scratch/v1",
        "users/bob/gc/scratch/v1",
    ]
    assert [(x["path"], x["why"]) for x in report["not_marins"]] == [
        ("users/mallory", "a symbolic link (never followed)")
    ]
    assert report["other_users"] == [
        {"path": "users/eve",
         "why": "a symbolic link lies where its plan places a step (never followed)"}
    ]  # fmt: skip
    for path in ("gc/raw/v1", "users/alice/gc/model/v1", "users/bob/gc/model/v1"):
        assert built(users, path), path
    assert (users / "users" / "mallory").is_symlink() and (
        users / "users" / "eve" / "gc"
    ).is_symlink()


def test_a_stalled_build_gc_reclaimed_is_told_what_happened(tmp_path: Path) -> None:
    """Red team round 16, finding 3: a build whose heartbeat stalled past its lease's TTL
    looks dead; ``marin gc`` reclaims its folder, and the build, waking up, was told its
    metadata folder was deleted "by fn, or by hand". It is told that ``marin gc`` can have
    reclaimed it (its lease went unrenewed past its TTL), and what to do."""
    prefix, started, release, wake = (tmp_path / n for n in ("p", "started", "release", "wake"))
    env = child_env(
        MARIN_LEASE_TTL="1",
        MARIN_FAULT_PAUSE_HEARTBEAT=f"until:{wake}",  # a stalled holder: alive, not renewing
        MARIN_TEST_HOLD=f"held/one:{started}:{release}",
    )
    build = subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", "tests/reliability/pipelines.py:held",
         "--prefix", str(prefix), "--no-progress"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_file(str(started))
        location = open_prefix(str(prefix))
        _wait_expired(location, "held/one/v1")
        gc = marin("gc", "tests/gc/pipelines.py:other", "--prefix", str(prefix), "--json", env=env)
        assert gc.returncode == 0, gc.stderr[-2000:]
        collected = {c["step"] for c in json.loads(gc.stdout)["collected"]}
        assert collected == {"held/one@v1"}, gc.stdout
        assert not (prefix / "held/one/v1.marin").exists()
    finally:
        wake.touch()
        release.touch()
        _, err = build.communicate(timeout=60)
    assert build.returncode == 1, err[-3000:]
    assert "was deleted while fn ran" in err, err[-3000:]
    assert "its lease went unrenewed for " in err and "past its TTL of 1s" in err, err[-3000:]
    assert "`marin gc` reclaims the folder of a build whose lease looked dead" in err
    assert "run again" in err and "use a longer lease (MARIN_LEASE_TTL)" in err, err[-3000:]
    assert "by fn, or by hand)" not in err
    assert read_record(location, "held/one/v1") is None


def test_a_stalled_build_whose_fn_fails_on_its_reclaimed_folder_is_told_why(tmp_path) -> None:
    """Red team round 17, finding 7: as above, but ``fn``, woken up, goes on writing into its
    output folder, which ``marin gc`` deleted: the step failed with ``FileNotFoundError ... fix
    it and run again``, blaming fn. The error is the lost lease (gc reclaimed the folder), with
    fn's error named as what followed; the step still fails and commits nothing."""
    prefix, started, gate, wake = (tmp_path / n for n in ("p", "started", "gate", "wake"))
    started.mkdir()
    env = child_env(
        MARIN_LEASE_TTL="1",
        MARIN_FAULT_PAUSE_HEARTBEAT=f"until:{wake}",  # a stalled holder: alive, not renewing
        MARIN_TEST_STARTED=str(started),
        MARIN_TEST_GATE=str(gate),
    )
    build = subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", "tests/gc/pipelines.py:stalling",
         "--prefix", str(prefix), "--no-progress"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_file(str(started / "gc_stalling"))
        location = open_prefix(str(prefix))
        _wait_expired(location, "gc/stalling/v1")
        gc = marin("gc", "tests/gc/pipelines.py:other", "--prefix", str(prefix), "--json", env=env)
        assert gc.returncode == 0, gc.stderr[-2000:]
        assert {c["step"] for c in json.loads(gc.stdout)["collected"]} == {"gc/stalling@v1"}
        assert not (prefix / "gc/stalling/v1").exists()
    finally:
        wake.touch()
        gate.touch()
        _, err = build.communicate(timeout=60)
    assert build.returncode == 1, err[-3000:]
    error = next(line for line in err.splitlines() if line.startswith("error: "))
    assert "was deleted while fn ran" in error and "past its TTL of 1s" in error, error
    assert "`marin gc` reclaims the folder of a build whose lease looked dead" in error, error
    assert "fn then failed (FileNotFoundError: " in error and "part-1" in error, error
    assert "use a longer lease (MARIN_LEASE_TTL)" in error, error
    assert "fix it and run again" not in error, error
    assert read_record(location, "gc/stalling/v1") is None


def _wait_expired(location: Any, output_path: str) -> None:
    """Until the step's lease (a TTL of 1 s, its heartbeat paused) has expired."""
    from marin.execution.store.lease import read_lease

    deadline = time.monotonic() + 30
    while not (read_lease(location, output_path, ttl=1) or pytest.fail("no lease")).expired:
        assert time.monotonic() < deadline, "the stalled lease never expired"
        time.sleep(0.02)
