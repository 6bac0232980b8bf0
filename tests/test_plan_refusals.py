"""Red team r16-2: ``marin plan`` said ``build ... new`` for steps a run then refuses to build,
having written nothing (``builder/clearing.py``'s rules: inside another step's output, data
Marin never wrote, another step's metadata in the output, a registered build). The plan names
the run's refusal, in the table and in ``--json`` (``refusal``), and the run refuses with it.

Two pipelines on one prefix: no one graph's ``lower()`` sees the clash, only storage does.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from marin.cli import main
from marin.execution.pipeline.artifact import Artifact
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record, write_status
from tests.reliability.faulty_fs import FAULTS
from tests.ux.helpers import ROOT, marin, marin_here

PIPELINES = str(ROOT / "tests" / "plan_refusal_pipelines.py")
OPS = ("ls", "exists", "info", "cat_file", "open")


def _plan(target: str, prefix: Path, *more: str) -> tuple[str, dict[str, Any]]:
    """``marin plan`` of ``target``: the table, and ``--json``."""
    args = ("--prefix", str(prefix), *more)
    table = marin_here("plan", f"{PIPELINES}:{target}", *args, env={"COLUMNS": "2000"})
    assert table.returncode == 0, table.stderr
    data = marin_here("plan", f"{PIPELINES}:{target}", *args, "--json")
    assert data.returncode == 0, data.stderr
    return table.stdout, json.loads(data.stdout)


def _refused(target: str, prefix: Path, *more: str) -> tuple[dict[str, Any], str]:
    """The one step ``marin plan`` says a run refuses to build (its ``--json``) and its table
    row's text, checked against what ``marin run`` then says, having written nothing."""
    table, data = _plan(target, prefix, *more)
    refused = [s for s in data["steps"] if "refusal" in s]
    assert len(refused) == 1 and data["summary"]["refused"] == 1, data["steps"]
    step = refused[0]
    assert step["action"] == "build" and step["refusal"]["fix"], step
    what, fix = step["refusal"]["what"], step["refusal"]["fix"]
    assert f"a run refuses it: {what}: {fix}" in table
    assert "(1 refused)" in table
    before = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*"))
    ran = marin("run", f"{PIPELINES}:{target}", "--prefix", str(prefix), *more)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert f"error: {what} (step {step['step']}): {fix}" in ran.stderr
    # The run names the step's log only if there is one: a refused build writes none.
    log = Path(f"{step['output_path']}.marin/log.txt")
    assert ("log.txt" in ran.stdout + ran.stderr) == log.exists(), ran.stdout + ran.stderr
    after = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*"))
    output = step["output_path"][len(str(prefix)) + 1 :]
    new = [p for p in after if p not in before and p.startswith(output)]
    assert [p for p in new if not p.endswith(".guard")] == []  # a lease's guard, if it took one
    return step, table


@pytest.mark.parametrize(
    "target, inside",
    [
        ("pinned_inside", "corpus/v1/sub"),  # pinned inside another pipeline's build
        ("nested", "corpus/v1/v0"),  # named so that its output lies in that build
    ],
)
def test_a_step_inside_another_pipelines_build_is_planned_as_refused(
    tmp_path: Path, target: str, inside: str
) -> None:
    prefix = tmp_path / "p"
    assert marin_here("run", f"{PIPELINES}:corpus", "--prefix", str(prefix)).returncode == 0
    step, _ = _refused(target, prefix)
    assert step["output_path"] == f"{prefix}/{inside}"
    assert "lies inside another step's output" in step["refusal"]["what"]
    assert "corpus/v1.marin is there" in step["refusal"]["what"]
    assert step["refusal"]["error"] == "StorageError"
    assert (prefix / "corpus/v1/data.txt").read_text() == "corpus"
    assert sorted(p.name for p in (prefix / "corpus/v1").iterdir()) == ["data.txt"]


@pytest.mark.parametrize("record", ["kept", "deleted", "torn"])
def test_a_build_over_adopted_data_is_planned_as_refused(tmp_path: Path, record: str) -> None:
    """``raw@v1`` adopted in place, then made a built step: its data is not Marin's to
    clear, whether the adoption's record is there or only its mark (``adopted.json``)."""
    prefix = tmp_path / "p"
    (prefix / "raw/v1").mkdir(parents=True)
    (prefix / "raw/v1/data.txt").write_text("PRECIOUS")
    assert marin_here("run", f"{PIPELINES}:raw_adopted", "--prefix", str(prefix)).returncode == 0
    stored = prefix / "raw/v1.marin/record.json"
    if record == "deleted":
        stored.unlink()
    elif record == "torn":
        stored.write_bytes(stored.read_bytes()[:100])
    step, _ = _refused("raw_built", prefix)
    assert step["refusal"]["error"] == "AdoptedDataError"
    held = {
        "kept": "holds data it adopted in place",
        "deleted": "left there, never Marin's (raw/v1.marin/adopted.json says so)",
        "torn": "left there, never Marin's (raw/v1.marin/adopted.json says so)",
    }[record]
    assert held in step["refusal"]["what"]
    assert [p.name for p in (prefix / "raw/v1").iterdir()] == ["data.txt"]
    # Moved away, the data no longer stops a build: the plan says a plain build, and it is.
    shutil.move(prefix / "raw/v1", tmp_path / "moved")
    table, data = _plan("raw_built", prefix)
    assert "refusal" not in data["steps"][0] and "refuses" not in table
    assert marin_here("run", f"{PIPELINES}:raw_built", "--prefix", str(prefix)).returncode == 0
    assert (tmp_path / "moved/data.txt").read_text() == "PRECIOUS"


def test_data_marin_never_wrote_is_planned_as_refused(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    (prefix / "raw/v1").mkdir(parents=True)
    (prefix / "raw/v1/data.txt").write_text("theirs")
    step, _ = _refused("raw_built", prefix)
    assert "already exists and was not written by Marin" in step["refusal"]["what"]
    assert "ArtifactStep.adopt('raw', 'v1', 'raw/v1')" in step["refusal"]["fix"]


def test_a_build_over_another_steps_metadata_is_planned_as_refused(tmp_path: Path) -> None:
    """``team@exp`` failed once (its status says Marin was there), and ``team/exp@v0`` was
    built inside its output since: clearing it would delete that build."""
    prefix = tmp_path / "p"
    assert marin_here("run", f"{PIPELINES}:inner", "--prefix", str(prefix)).returncode == 0
    write_status(open_prefix(str(prefix)), "team/exp", "FAILED", error="an earlier attempt")
    step, _ = _refused("outer", prefix)
    what = step["refusal"]["what"]
    assert "holds another step's build team/exp@v0 (its metadata team/exp/v0.marin)" in what
    assert (prefix / "team/exp/v0/data.txt").read_text() == "inner"


def test_a_folder_holding_another_steps_build_is_refused_as_such(tmp_path: Path) -> None:
    """Red team round 17, finding 8a: ``team/exp@v0`` built, ``team@exp`` (whose output
    ``team/exp`` holds it, with no ``exp.marin`` beside it) was refused as data "not written by
    Marin" to adopt where it is; Marin wrote it, and adopting it is refused too. The plan and
    the run name the build inside and the fix, renaming a step."""
    prefix = tmp_path / "p"
    assert marin_here("run", f"{PIPELINES}:inner", "--prefix", str(prefix)).returncode == 0
    step, _ = _refused("outer", prefix)
    what, fix = step["refusal"]["what"], step["refusal"]["fix"]
    assert step["refusal"]["error"] == "StorageError"
    assert f"output path {prefix}/team/exp holds another step's build team/exp@v0" in what
    assert "(its metadata team/exp/v0.marin)" in what
    assert "not written by Marin" not in what and "adopt" not in fix, step
    assert "rename one of the two steps" in fix
    assert (prefix / "team/exp/v0/data.txt").read_text() == "inner"
    assert not (prefix / "team/exp.marin").exists()


def test_a_refused_build_names_no_log_it_never_wrote(tmp_path: Path) -> None:
    """Red team round 17, finding 8b: a build refused before writing anything (``lies inside
    another step's output``) printed ``log: .../v1.marin/log.txt``, a file nobody wrote."""
    prefix = tmp_path / "p"
    assert marin_here("run", f"{PIPELINES}:corpus", "--prefix", str(prefix)).returncode == 0
    ran = marin_here("run", f"{PIPELINES}:nested", "--prefix", str(prefix), "--no-progress")
    out = ran.stdout + ran.stderr
    assert ran.returncode == 1 and "lies inside another step's output" in out, out
    assert "failed: corpus/v1@v0" in out, out
    assert "log:" not in out and "log.txt" not in out, out
    assert not (prefix / "corpus/v1/v0.marin").exists()


def test_a_registered_build_forced_is_planned_as_refused(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    args = ("--prefix", str(prefix))
    assert marin_here("run", f"{PIPELINES}:corpus", *args).returncode == 0
    assert marin_here("register", "corpus@v1", "--id", "team/corpus/r1", *args).returncode == 0
    table, data = _plan("corpus", prefix)  # served: nothing to refuse
    assert data["summary"]["refused"] == 0 and "refuses" not in table
    step, _ = _refused("corpus", prefix, "--force", "corpus")
    assert step["refusal"]["error"] == "RegisteredBuildFrozenError"
    assert "is registered as team/corpus/r1" in step["refusal"]["what"]


@pytest.mark.parametrize("damage", ["garbage", "empty", "wrong types", "folder", "deleted"])
def test_a_registered_build_whose_freeze_mark_is_damaged_is_planned_as_refused(
    tmp_path: Path, damage: str
) -> None:
    """Red team r17-4: with ``registered.json`` torn, ``{}`` or deleted while the manifest
    still names the build, ``--force`` rebuilt the registered build in place (the plan said a
    plain build) and ``from_id`` served the registered record over the new data. A mark that
    cannot be read freezes the build; without one, the registry itself is asked."""
    prefix = tmp_path / "p"
    args = ("--prefix", str(prefix))
    assert marin_here("run", f"{PIPELINES}:corpus", *args).returncode == 0
    assert marin_here("register", "corpus@v1", "--id", "team/corpus/r1", *args).returncode == 0
    mark, record = (
        prefix / "corpus/v1.marin/registered.json",
        prefix / "corpus/v1.marin/record.json",
    )
    mark.unlink()
    if damage == "folder":
        mark.mkdir()
    elif damage != "deleted":
        mark.write_text(
            {"garbage": "garb", "empty": "{}", "wrong types": '{"build_id": 1}'}[damage]
        )
    stored = record.read_bytes()
    step, _ = _refused("corpus", prefix, "--force", "corpus")
    what = step["refusal"]["what"]
    if damage == "folder":  # refused as any step-folder file that is no regular file
        assert what == f"{mark} is not a regular file"
    else:
        assert step["refusal"]["error"] == "RegisteredBuildFrozenError"
        assert (
            "is registered as team/corpus/r1" in what
            and "bump the version" in step["refusal"]["fix"]
        )
        unreadable = f"has a freeze mark that cannot be read ({mark}: not a mark marin register"
        assert (unreadable in what) == (damage != "deleted"), what
    assert (prefix / "corpus/v1/data.txt").read_text() == "corpus" and record.read_bytes() == stored
    found = Artifact.from_id("team/corpus/r1", prefix=str(prefix))
    assert found.record == read_record(open_prefix(str(prefix)), "corpus/v1")


def test_a_damaged_freeze_mark_no_manifest_names_is_refused_until_deleted(tmp_path: Path) -> None:
    """A torn mark whose manifest is gone (a registration that crashed before it, say): still
    refused, since a damaged mark is never read as "not registered"; the fix names the mark,
    and once it is deleted the build is rebuilt."""
    prefix = tmp_path / "p"
    args = ("--prefix", str(prefix))
    assert marin_here("run", f"{PIPELINES}:corpus", *args).returncode == 0
    assert marin_here("register", "corpus@v1", "--id", "team/corpus/r1", *args).returncode == 0
    (prefix / "registry.marin/team/corpus/r1.json").unlink()
    mark = prefix / "corpus/v1.marin/registered.json"
    mark.write_text('{"build_id": "')
    step, _ = _refused("corpus", prefix, "--force", "corpus")
    assert "may be registered" in step["refusal"]["what"]
    assert f"if it was never registered, delete {mark} and run again" in step["refusal"]["fix"]
    mark.unlink()
    assert marin_here("run", f"{PIPELINES}:corpus", *args, "--force", "corpus").returncode == 0


@pytest.fixture
def faulty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A ``faulty://`` prefix (the local disk, as an object store is asked: through fsspec),
    counting each operation by name; its local path."""
    FAULTS.clear()
    monkeypatch.setattr("marin.execution.store.location.RETRY_BASE_DELAY", 0.001)
    for op in OPS:
        FAULTS.add(op, ".", times=0)  # never fails: counts
    yield tmp_path / "p"
    FAULTS.clear()


def _counted_plan(target: str, prefix: Path, capsys: pytest.CaptureFixture[str]) -> Counter[str]:
    """The storage operations of one ``marin plan`` in this process, by name."""
    for rule in FAULTS.rules:
        rule.seen = 0
    capsys.readouterr()
    assert main(["plan", f"{PIPELINES}:{target}", "--prefix", f"faulty://{prefix}"]) == 0
    return Counter({next(iter(r.ops)): r.seen for r in FAULTS.rules if r.times == 0})


def test_a_plan_of_many_new_steps_lists_each_folder_above_them_once(
    faulty: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """41 new steps under ``wide/``, beside a folder there: the look for refusals lists the
    prefix and ``wide`` (the only folders above them that exist), and nothing else; a plan of
    the built pipeline reads nothing more than without the look."""
    (faulty / "wide/keep").mkdir(parents=True)
    with_look = _counted_plan("many", faulty, capsys)
    assert "41 steps: 41 to run; a run would build 41\n" in capsys.readouterr().out
    monkeypatch.setattr("marin.plan_view.build_refusals", lambda plan, location: {})
    without = _counted_plan("many", faulty, capsys)
    extra = with_look - without
    assert extra == Counter(ls=2), (with_look, without)
    monkeypatch.undo()
    monkeypatch.setattr("marin.execution.store.location.RETRY_BASE_DELAY", 0.001)
    assert main(["run", f"{PIPELINES}:many", "--prefix", f"faulty://{faulty}"]) == 0
    built_with_look = _counted_plan("many", faulty, capsys)
    monkeypatch.setattr("marin.plan_view.build_refusals", lambda plan, location: {})
    assert built_with_look == _counted_plan("many", faulty, capsys)


def test_a_look_that_cannot_read_never_fails_the_plan(
    faulty: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Advisory: every listing fails, so the plan shows the step as planned, and exits 0."""
    assert main(["run", f"{PIPELINES}:corpus", "--prefix", f"faulty://{faulty}"]) == 0
    FAULTS.add("ls", ".", times=None)
    capsys.readouterr()
    assert main(["plan", f"{PIPELINES}:pinned_inside", "--prefix", f"faulty://{faulty}"]) == 0
    out = capsys.readouterr().out
    assert "a run would build 2\n" in out and "refuses" not in out
    assert FAULTS.injected["ls"] > 0
    FAULTS.rules.pop()
    assert main(["plan", f"{PIPELINES}:pinned_inside", "--prefix", f"faulty://{faulty}"]) == 0
    assert "a run would build 2 (1 refused)" in capsys.readouterr().out


def _metadata_folder(prefix: Path, kind: str) -> None:
    """``raw/v1.marin/`` beside someone's data at ``raw/v1``, holding no file of an attempt's:
    nothing, only a lease's guard (a lock, no state), or only an empty checkpoints folder."""
    folder = prefix / "raw/v1.marin"
    folder.mkdir(parents=True)
    if kind == "guard only":
        (folder / "lease.json.guard").touch()
    elif kind == "empty checkpoints":
        (folder / "checkpoints").mkdir()


def _left_alone_by_gc(prefix: Path, why: str) -> None:
    """``marin gc`` of another pipeline calls ``raw/v1`` not Marin's (``why``: the start of
    the build's own reason, in the same words) and leaves the user's ``precious.bin``."""
    gc = marin_here("gc", f"{PIPELINES}:corpus", "--prefix", str(prefix), "--dry-run")
    assert gc.returncode == 0, gc.stderr
    assert f"not Marin's, left alone: raw/v1 ({why}" in gc.stdout, gc.stdout
    assert marin_here("gc", f"{PIPELINES}:corpus", "--prefix", str(prefix)).returncode == 0
    assert [p.name for p in (prefix / "raw/v1").iterdir()] == ["precious.bin"]
    assert (prefix / "raw/v1/precious.bin").read_text() == "theirs"


@pytest.mark.parametrize("kind", ["empty", "guard only", "empty checkpoints"])
def test_data_beside_a_metadata_folder_of_no_attempt_is_refused(tmp_path: Path, kind: str) -> None:
    """Red team r17-2: such a folder was taken as proof that Marin wrote the data beside it,
    and the build deleted that data as an earlier attempt's debris, while ``marin plan`` said
    ``new`` and ``marin gc`` called it not Marin's. One rule for all three: refused, kept."""
    prefix = tmp_path / "p"
    (prefix / "raw/v1").mkdir(parents=True)
    (prefix / "raw/v1/precious.bin").write_text("theirs")
    _metadata_folder(prefix, kind)
    step, _ = _refused("raw_built", prefix)  # the plan's refusal, the run's error
    what = step["refusal"]["what"]
    assert "raw/v1 already exists and was not written by Marin" in what
    shown = "is empty" if kind == "empty" else "holds none of the files a Marin attempt leaves"
    assert f"(its v1.marin folder {shown}" in what and step["refusal"]["error"] == "StorageError"
    assert "ArtifactStep.adopt('raw', 'v1', 'raw/v1')" in step["refusal"]["fix"]
    assert not (prefix / "raw/v1.marin/record.json").exists()  # nothing marked built
    _left_alone_by_gc(prefix, f"its metadata folder {shown}")


def test_data_put_later_where_a_value_only_step_wrote_nothing_is_kept(tmp_path: Path) -> None:
    """Red team r24-3: a step whose artifact is its returned value makes no folder at its
    output path; someone's data put there later was deleted by ``--force`` and by ``marin gc``
    as that step's output, though its record says it wrote no file there (the same data there
    before the first build was refused and kept). Now refused and kept alike."""
    prefix = tmp_path / "p"
    built = marin_here("run", f"{PIPELINES}:raw_value", "--prefix", str(prefix))
    assert built.returncode == 0 and not (prefix / "raw/v1").exists(), built.stderr
    (prefix / "raw/v1").mkdir()
    (prefix / "raw/v1/precious.bin").write_text("theirs")
    step, _ = _refused("raw_value", prefix, "--force", "raw")
    said = "its record says the build wrote no file there (its artifact is its returned value)"
    assert f"raw/v1 already exists and was not written by Marin ({said}" in step["refusal"]["what"]
    _left_alone_by_gc(prefix, said)
    (prefix / "raw/v1/precious.bin").unlink()  # an empty folder left there is no one's data
    assert (
        marin_here(
            "run", f"{PIPELINES}:raw_value", "--prefix", str(prefix), "--force", "raw"
        ).returncode
        == 0
    )


def test_gc_leaves_a_value_only_build_whose_record_it_cannot_read(tmp_path: Path) -> None:
    """Red team r25-5: a step whose artifact is its returned value is its record alone; one a
    newer Marin wrote (a schema this Marin cannot read) was deleted by gc as "unfinished",
    though gc keeps it when it reads it and leaves such a record beside output data."""
    prefix = tmp_path / "p"
    assert marin_here("run", f"{PIPELINES}:raw_value", "--prefix", str(prefix)).returncode == 0
    record = prefix / "raw/v1.marin/record.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "schema": 2}))
    gc = marin_here("gc", f"{PIPELINES}:corpus", "--prefix", str(prefix))
    assert gc.returncode == 0, gc.stderr
    assert "not Marin's, left alone: raw/v1 (its record cannot be read by this Marin" in gc.stdout
    assert json.loads(record.read_text())["schema"] == 2


@pytest.mark.parametrize("left", ["status", "status replacing an unknown build", "lease"])
def test_an_earlier_attempts_leftovers_are_still_cleared_and_rebuilt(
    tmp_path: Path, left: str
) -> None:
    """What an earlier attempt of Marin's left beside its partial output (a FAILED status, an
    expired lease of a holder gone, each naming it) still proves the output Marin's: cleared,
    built, and ``marin gc`` would delete it (it asked a lease or ``job.json`` of a status whose
    replaced build is unknown, which a build takes as proof). A log alone names nothing
    (``test_a_file_that_cannot_prove_the_output_marins_...``)."""
    prefix = tmp_path / "p"
    (prefix / "raw/v1").mkdir(parents=True)
    (prefix / "raw/v1/partial.bin").write_text("half")
    location = open_prefix(str(prefix))
    folder = prefix / "raw/v1.marin"
    folder.mkdir(parents=True)
    (folder / "lease.json.guard").touch()
    if left.startswith("status"):
        replaces = {"replaces": "unknown"} if "unknown" in left else {}
        write_status(location, "raw/v1", "FAILED", error="an earlier attempt", **replaces)
    else:
        lease = {"holder": "otherhost:4242:99", "token": "t", "ttl": 600, "expires_at": 1.0,
                 "started_at": "2026-01-01T00:00:00Z", "output_path": "raw/v1"}  # fmt: skip
        (folder / "lease.json").write_text(json.dumps(lease))
    (folder / "log.txt").write_text("working on shard 2\n")
    table, data = _plan("raw_built", prefix)
    assert "refusal" not in data["steps"][0] and "refuses" not in table
    gc = marin_here("gc", f"{PIPELINES}:corpus", "--prefix", str(prefix), "--dry-run")
    assert "would delete raw@v1" in gc.stdout and "not Marin's, left" not in gc.stdout, gc.stdout
    ran = marin_here("run", f"{PIPELINES}:raw_built", "--prefix", str(prefix))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert sorted(p.name for p in (prefix / "raw/v1").iterdir()) == ["data.txt"]
    assert (folder / "record.json").exists()


COPIED = {
    "status": ("status.json", {"state": "FAILED", "output_path": "raw/v0", "error": "boom"}),
    "lease": ("lease.json", {"holder": "otherhost:4242:99", "token": "t", "ttl": 600,
                             "expires_at": 1.0, "started_at": "2026-01-01T00:00:00Z",
                             "output_path": "raw/v0"}),
    "attempt": ("attempt.json", {"number": 1, "fingerprint": "f", "started_at": "t",
                                 "holder": "h", "placement": "raw/v0"}),
    "job": ("job.json", {"job_id": "marin-00000000000000000000", "output_path": "raw/v0"}),
}  # fmt: skip


@pytest.mark.parametrize("copied", sorted(COPIED))
def test_a_file_naming_another_output_proves_nothing_about_the_data_beside_it(
    tmp_path: Path, copied: str
) -> None:
    """Red team r19-8: a status, lease or ``attempt.json`` copied from another step's folder
    (it names ``raw/v0``) into ``raw/v1.marin/`` beside someone's data at ``raw/v1`` was taken
    as proof that Marin wrote that data: the run deleted it as debris, while ``marin gc``
    called it not Marin's and the plan named the other step. One rule for the three: a file
    naming another output is no proof. Refused, kept, said alike."""
    prefix = tmp_path / "p"
    (prefix / "raw/v1").mkdir(parents=True)
    (prefix / "raw/v1/precious.bin").write_text("theirs")
    folder = prefix / "raw/v1.marin"
    folder.mkdir()
    name, body = COPIED[copied]
    (folder / name).write_text(json.dumps(body))
    (folder / "log.txt").write_text("copied too\n")  # a file naming nothing proves no more
    step, _ = _refused("raw_built", prefix)  # the plan's refusal, the run's error
    what = step["refusal"]["what"]
    assert "raw/v1 already exists and was not written by Marin" in what
    said = f"{name} does not name this output: it names 'raw/v0' (copied from that step's folder"
    assert f"(its v1.marin folder's {said}" in what and step["refusal"]["error"] == "StorageError"
    _left_alone_by_gc(prefix, f"its metadata folder's {said}")


def test_a_status_naming_the_output_beside_a_lease_naming_another_is_no_proof(
    tmp_path: Path,
) -> None:
    """One foreign file is enough: beside it, a status naming this output (planted, or
    copied too) does not make the folder an attempt of this step, for a build as for gc."""
    prefix = tmp_path / "p"
    (prefix / "raw/v1").mkdir(parents=True)
    (prefix / "raw/v1/precious.bin").write_text("theirs")
    write_status(open_prefix(str(prefix)), "raw/v1", "FAILED", error="an earlier attempt")
    name, body = COPIED["lease"]
    (prefix / "raw/v1.marin" / name).write_text(json.dumps(body))
    step, _ = _refused("raw_built", prefix)
    assert "lease.json does not name this output: it names 'raw/v0'" in step["refusal"]["what"]
    gc = marin_here("gc", f"{PIPELINES}:corpus", "--prefix", str(prefix), "--dry-run")
    assert "left alone: raw/v1 (its metadata folder's lease.json does not name" in gc.stdout
    assert (prefix / "raw/v1/precious.bin").read_text() == "theirs"


def _copied_record(prefix: Path, how: str) -> bytes:
    """``raw@v0``'s record, as copied beside ``raw/v1``: damaged, or of a newer Marin."""
    assert marin_here("run", f"{PIPELINES}:raw_v0", "--prefix", str(prefix)).returncode == 0
    raw = (prefix / "raw/v0.marin/record.json").read_bytes()
    if how == "torn":
        return raw[: len(raw) // 2]
    data = json.loads(raw)
    if how.endswith("newer schema"):
        data["schema"] = 2
    if how.startswith("this build's"):
        out = str(data["output_path"])
        data.update(version="v1", output_path=out[: -len("v0")] + "v1")
    else:
        del data["fingerprint"]
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "file, content",
    [
        ("record.json", "newer schema"),  # a copy of raw@v0's record a newer Marin wrote
        ("record.json", "this build's, newer schema"),  # raw@v1's own, of a newer Marin (r22-3)
        ("record.json", "a field missing"),
        ("record.json", "torn"),
        ("record.json", "{}"),
        ("status.json", "{}"),
        ("status.json", '{"state": "FAILED", "error": "boom"}'),  # names no output
        ("lease.json", "{"),
        ("job.json", "{}"),
        ("log.txt", "working on shard 2\n"),
    ],
)
def test_a_file_that_cannot_prove_the_output_marins_leaves_the_data(
    tmp_path: Path, file: str, content: str
) -> None:
    """Red team r20-1 and r20-3: a record that cannot be read as this step's (a damaged copy of
    another step's, or one of a newer schema), a status, lease or ``job.json`` that cannot be
    read or names no output, or a log alone, was proof enough for a build, which deleted the
    data beside it as "the previous build" or debris, while ``marin gc`` called it not Marin's
    and ``marin plan`` said nothing. One rule for all three: refused, kept."""
    prefix = tmp_path / "p"
    data = (
        _copied_record(prefix, content)
        if file == "record.json" and content != "{}"
        else content.encode()
    )
    (prefix / "raw/v1.marin").mkdir(parents=True)
    (prefix / f"raw/v1.marin/{file}").write_bytes(data)
    (prefix / "raw/v1").mkdir()
    (prefix / "raw/v1/precious.bin").write_text("theirs")
    step, _ = _refused("raw_built", prefix)
    refusal = (
        "raw/v1 already exists beside a record naming this build that this Marin cannot read"
        if content.startswith("this build's")
        else "raw/v1 already exists and was not written by Marin"
    )
    assert refusal in step["refusal"]["what"]
    _left_alone_by_gc(prefix, "")
    assert (prefix / f"raw/v1.marin/{file}").read_bytes() == data


def test_a_record_committed_while_the_folder_is_looked_at_proves_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four processes racing one S3 prefix: a runner looked at a step's folder while another
    committed it (its record written, then its lease released) between the first read of the
    record and the read of the lease: neither proved the output, and the build was refused as
    someone's data. The record is read once more, last: the committer's is there by then."""
    from marin.execution.builder import clearing
    from marin.execution.builder.commit import build_step
    from marin.execution.builder.request import BuildRequest
    from marin.execution.lazy import OUT, apply
    from marin.execution.store.lease import Lease
    from tests.plan_refusal_pipelines import write

    prefix = str(tmp_path / "p")
    location = open_prefix(prefix)
    spec = apply("raw", write, version="v1", text="raw", out_path=OUT).lower()
    build_step(BuildRequest(spec, location))  # the committer's build, as it will stand
    record = (tmp_path / "p/raw/v1.marin/record.json").read_bytes()
    (tmp_path / "p/raw/v1.marin/record.json").unlink()
    other = Lease(location, "raw/v1", ttl=60)
    assert other.try_acquire() is None  # the committer, building: its lease names the output
    listed = clearing.folder_entries

    def commits_meanwhile(location: Any, folder: str) -> list[tuple[str, str]]:
        entries = listed(location, folder)
        (tmp_path / "p/raw/v1.marin/record.json").write_bytes(record)  # its commit, then
        other.release()  # its lease goes, before this runner reads it
        return entries

    monkeypatch.setattr(clearing, "folder_entries", commits_meanwhile)
    assert clearing.output_left_by_marin(location, spec)  # Marin's: no refusal


@pytest.mark.parametrize("left", ["file", "folder"])
def test_a_first_builds_clearing_of_its_checkpoint_folder_is_said(
    tmp_path: Path, left: str
) -> None:
    """Red team r19-5: a resumable step's first build deleted whatever was at its checkpoint
    folder without a word. Still cleared (it is Marin's metadata folder), but ``marin plan``
    says so first, and the run's log says so."""
    prefix = tmp_path / "p"
    checkpoints = prefix / "raw/v1.marin/checkpoints"
    if left == "folder":
        checkpoints.mkdir(parents=True)
        (checkpoints / "user.txt").write_text("mine")
    else:
        checkpoints.parent.mkdir(parents=True)
        checkpoints.write_text("mine")
    table, data = _plan("raw_resumable", prefix)
    cleared = "clear: what is at its checkpoint folder was left by no attempt Marin recorded"
    assert cleared in table and data["steps"][0]["resume"]["reason"].startswith(cleared)
    ran = marin_here("run", f"{PIPELINES}:raw_resumable", "--prefix", str(prefix))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    said = f"clear raw@v1: removing what was left at its checkpoint folder {checkpoints}"
    assert said in ran.stdout + ran.stderr
    assert not checkpoints.exists() and (prefix / "raw/v1/data.txt").read_text() == "raw"


def test_a_look_at_a_metadata_folder_never_hides_a_later_record(s3_server: dict[str, str]) -> None:
    """The look that asks whether an attempt worked at an output lists its metadata folder; on
    S3 that listing was left in s3fs's cache, so the lease holder's later look at the record
    (``isfile``) missed the record another runner had written since, and rebuilt its build as
    debris (processes racing one S3 prefix built steps twice)."""
    import uuid

    import s3fs

    from marin.execution.store.step_folder import folder_entries

    location = open_prefix(f"s3://marin-tests/look-{uuid.uuid4().hex[:10]}")
    folder = location.path("raw/v1.marin")
    location.put_file(f"{folder}/lease.json", b"{}")
    assert [name for name, _ in folder_entries(location, folder)] == ["lease.json"]
    another_runner = s3fs.S3FileSystem(skip_instance_cache=True)
    another_runner.pipe_file(f"{folder}/record.json", b"{}")
    assert location.has_file(f"{folder}/record.json")
    assert sorted(name for name, _ in folder_entries(location, folder)) == [
        "lease.json",
        "record.json",
    ]


@pytest.mark.parametrize(
    "case, culprit",
    [
        ("step folder a file, data kept", "raw/v1.marin"),  # built, then its folder replaced
        ("step folder a file", "raw/v1.marin"),
        ("a file above the output", "raw"),
    ],
)
def test_a_file_where_a_folder_must_be_is_planned_as_refused(
    tmp_path: Path, case: str, culprit: str
) -> None:
    """Red team r18-3: with a file at ``raw/v1.marin`` (or at ``raw``), the plan said a plain
    build and the run failed with a raw ``NotADirectoryError`` (or called the data not Marin's,
    its "folder" empty), naming a log it never wrote. Plan and run refuse alike, naming the
    file and the fix; the file and the data are left as they were."""
    prefix = tmp_path / "p"
    if case == "step folder a file, data kept":
        assert marin_here("run", f"{PIPELINES}:raw_built", "--prefix", str(prefix)).returncode == 0
        shutil.rmtree(prefix / "raw/v1.marin")
    prefix.mkdir(exist_ok=True)
    (prefix / culprit).parent.mkdir(parents=True, exist_ok=True)
    (prefix / culprit).write_text("someone's notes")
    step, _ = _refused("raw_built", prefix)
    what, fix = step["refusal"]["what"], step["refusal"]["fix"]
    assert step["refusal"]["error"] == "NotAFolderError" and step["step"] == "raw@v1"
    assert what.startswith(f"{prefix}/{culprit} is not a folder: raw@v1"), what
    assert fix.startswith("move it away (or delete it yourself), then run again"), fix
    assert (prefix / culprit).read_text() == "someone's notes"
    if case == "step folder a file, data kept":
        assert (prefix / "raw/v1/data.txt").read_text() == "raw"
        return  # with its step folder gone, that data proves nothing: refused as not Marin's
    (prefix / culprit).unlink()  # moved away: built
    assert marin_here("run", f"{PIPELINES}:raw_built", "--prefix", str(prefix)).returncode == 0
    assert (prefix / "raw/v1.marin/record.json").exists()


def test_an_object_at_a_step_folders_name_is_in_nobodys_way(s3_server: dict[str, str]) -> None:
    """r18-3 on an object store: a folder is only a prefix of keys, so objects at ``raw`` and
    ``raw/v1.marin`` stop nothing (plan and run agree: built) and are kept."""
    import uuid

    import s3fs

    prefix = f"s3://marin-tests/in-the-way-{uuid.uuid4().hex[:10]}"
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for key in ("raw", "raw/v1.marin"):
        fs.pipe_file(f"{prefix[5:]}/{key}", b"someone's notes")
    table, data = _plan("raw_built", Path(prefix))
    assert data["summary"]["refused"] == 0 and "refuses" not in table, table
    ran = marin_here("run", f"{PIPELINES}:raw_built", "--prefix", prefix)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert fs.cat_file(f"{prefix[5:]}/raw/v1.marin") == b"someone's notes"
    assert fs.cat_file(f"{prefix[5:]}/raw/v1/data.txt") == b"raw"
    assert fs.isfile(f"{prefix[5:]}/raw/v1.marin/record.json")


@pytest.mark.parametrize(
    "planted, error",
    [
        ("raw/v1/precious.bin", "StorageError"),  # no step folder beside it
        ("raw/v1.marin/lease.json.guard", "StorageError"),  # a folder that shows no attempt
        ("raw/v1.marin/checkpoints/step1", "StorageError"),
        ("raw/v1.marin", "NotAFolderError"),  # a key where the step folder must be
        ("raw", "NotAFolderError"),  # a key above the output
        ("raw/v1", "StorageError"),  # a key at the output path itself
    ],
)
def test_memory_data_marin_never_wrote_is_refused_and_kept(
    planted: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team r19-7: on ``memory://`` the look was skipped: the run built into the user's
    data (or beside a key at its step folder's name) and ``marin gc`` then deleted it with the
    build. Plan, run and gc ask the same rule there as on disk: refused, kept."""
    import uuid

    import fsspec

    prefix = f"memory://refusals-{uuid.uuid4().hex[:10]}"
    fs = fsspec.filesystem("memory")
    theirs = f"{prefix[len('memory://') :]}/{planted}"
    if planted != "raw/v1":  # data at the output beside the planted key
        fs.pipe(f"{prefix[len('memory://') :]}/raw/v1/precious.bin", b"theirs")
    fs.pipe(theirs, b"theirs")
    before = sorted(fs.find(prefix))
    assert main(["plan", f"{PIPELINES}:raw_built", "--prefix", prefix, "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert steps[0]["refusal"]["error"] == error, steps
    assert main(["run", f"{PIPELINES}:raw_built", "--prefix", prefix, "--no-progress"]) == 1
    assert steps[0]["refusal"]["what"] in capsys.readouterr().err
    assert main(["gc", f"{PIPELINES}:corpus", "--prefix", prefix]) == 0
    assert sorted(fs.find(prefix)) == before and fs.cat(theirs) == b"theirs"


UPSTREAM = """import os, pathlib
def make(out_path):
    pathlib.Path(out_path).mkdir(parents=True, exist_ok=True)
    pathlib.Path(out_path, "data.txt").write_text(os.environ.get("SRC_TEXT", "src"))
"""
READER = """import pathlib
from marin.execution.lazy import OUT, apply
from upstream import make
def read(out_path, src):
    pathlib.Path(out_path).mkdir(parents=True, exist_ok=True)
    pathlib.Path(out_path, "data.txt").write_text(pathlib.Path(src, "data.txt").read_text() + "!")
src = apply("src", make, version="v1", out_path=OUT)
pipeline = apply("reader", read, version="v1", out_path=OUT, src=src)
"""


def test_a_refusal_only_a_changed_upstream_output_makes_is_planned_as_conditional(
    tmp_path: Path,
) -> None:
    """Red team r18-2: ``reader@v1`` registered, its input ``src@v1``'s code changed and
    rebuilt (``--on-code-drift rebuild``): the plan said ``a run refuses it`` and counted it in
    ``summary.refused``, and the run rebuilt ``src`` into the same bytes, served ``reader``
    unchanged (early cutoff) and exited 0. The plan says the refusal holds only if the upstream
    output changes (``refusal.conditional``, out of ``summary.refused``); and it does then."""
    # Subprocesses: the pipeline imports a module of its own folder (``upstream``), and each
    # edit of it must be imported afresh.
    (tmp_path / "upstream.py").write_text(UPSTREAM)
    (tmp_path / "pipe.py").write_text(READER)
    target, prefix = f"{tmp_path}/pipe.py:pipeline", tmp_path / "p"
    args = ("--prefix", str(prefix), "--on-code-drift", "rebuild")
    assert marin("run", target, *args).returncode == 0
    registered = marin("register", "reader@v1", "--id", "team/reader/r1", *args[:2])
    assert registered.returncode == 0, registered.stderr
    (tmp_path / "upstream.py").write_text(
        UPSTREAM.replace("    pathlib", "    unused = 1\n    pathlib", 1)
    )
    table = marin("plan", target, *args, env={"COLUMNS": "2000"}).stdout
    data = json.loads(marin("plan", target, *args, "--json").stdout)
    reader = next(s for s in data["steps"] if s["step"] == "reader@v1")
    assert reader["unless_unchanged"] == ["src@v1"] and reader["refusal"]["conditional"] is True
    assert reader["refusal"]["error"] == "RegisteredBuildFrozenError"
    assert data["summary"]["refused"] == 0, data["summary"]
    assert "a run refuses it if the output of src@v1 changes: the build " in table, table
    assert "a run would build 2 (1 refused if an upstream output changes)" in table
    assert "a run refuses it:" not in table and "(1 refused)" not in table
    ran = marin("run", target, *args)  # rebuilt into the same bytes: served, unrefused
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"reader@v1 +unchanged", ran.stdout), ran.stdout
    # Changed again, into other bytes this time: refused, as the plan said it would be.
    again = UPSTREAM.replace("    pathlib", "    unused = 2\n    pathlib", 1)
    (tmp_path / "upstream.py").write_text(again)
    changed = marin("run", target, *args, env={"SRC_TEXT": "new"})
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "is registered as team/reader/r1" in changed.stderr
    assert (prefix / "reader/v1/data.txt").read_text() == "src!"
    # Whatever the upstream makes, a forced rebuild is refused: unconditional, and counted.
    forced = json.loads(marin("plan", target, *args, "--force", "reader", "--json").stdout)
    reader = next(s for s in forced["steps"] if s["step"] == "reader@v1")
    assert reader["refusal"]["conditional"] is False and forced["summary"]["refused"] == 1


def test_a_reader_of_an_upstream_with_a_new_config_is_refused_unconditionally(
    tmp_path: Path,
) -> None:
    """Red team r19-4: an upstream rebuilt for its changed config (``--on-drift rebuild``) is
    never cut off (its output digest covers the config), yet the plan called the refusal of
    its registered reader conditional and left it out of ``summary.refused``; the run refused."""
    (tmp_path / "upstream.py").write_text(
        UPSTREAM.replace("def make(out_path)", "def make(out_path, n)")
    )
    with_n = READER.replace('version="v1", out_path=OUT)', 'version="v1", out_path=OUT, n=N)', 1)
    n_from_env = "import os\nfrom upstream import make\nN = int(os.environ.get('N', '1'))"
    (tmp_path / "pipe.py").write_text(with_n.replace("from upstream import make", n_from_env))
    target, prefix = f"{tmp_path}/pipe.py:pipeline", tmp_path / "p"
    args = ("--prefix", str(prefix), "--on-drift", "rebuild")
    assert marin("run", target, *args).returncode == 0
    assert marin("register", "reader@v1", "--id", "team/reader/r1", *args[:2]).returncode == 0
    data = json.loads(marin("plan", target, *args, "--json", env={"N": "2"}).stdout)
    reader = next(s for s in data["steps"] if s["step"] == "reader@v1")
    assert reader["unless_unchanged"] == [] and reader["refusal"]["conditional"] is False
    assert data["summary"]["refused"] == 1, data["summary"]
    ran = marin("run", target, *args, env={"N": "2"})
    assert ran.returncode == 1 and "is registered as team/reader/r1" in ran.stderr
