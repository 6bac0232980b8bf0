"""Issue 48.2: per-user output scopes (Marin's ``OutputScope.USER``)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from marin.cli import main
from marin.execution.errors import InvalidStepError
from marin.execution.lazy import apply, lower, run
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests import scope_pipeline
from tests.reliability.conftest import REPO, child_env

TARGET = f"{REPO / 'tests' / 'scope_pipeline.py'}:pipeline"


def build_shared_base(prefix: str) -> str:
    """The team's shared build of ``scope/base``; its build id."""
    (artifact,) = run(scope_pipeline.base, prefix=prefix)
    assert artifact.record is not None
    return artifact.record.build_id


def test_user_scope_writes_under_the_users_folder_and_reads_shared(prefix, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_USER", "alice")
    shared_id = build_shared_base(prefix)
    (artifact,) = run(scope_pipeline.variant, prefix=prefix)
    location = open_prefix(prefix)
    assert artifact.url.endswith("/users/alice/scope/variant/v1")
    assert read_record(location, "users/alice/scope/variant/v1") is not None
    assert read_record(location, "scope/variant/v1") is None  # nothing shared was written
    base = read_record(location, "scope/base/v1")
    assert base is not None and base.build_id == shared_id  # read, never rebuilt
    assert artifact.result == f"{location.url}/scope/base/v1:1"  # the shared build's path
    assert read_record(location, "users/alice/scope/base/v1") is None


def test_a_user_build_wins_over_the_shared_one_for_that_user(prefix, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_USER", "bob")
    run(scope_pipeline.base, prefix=prefix, scope="user")  # nothing shared yet: bob's own
    build_shared_base(prefix)
    (artifact,) = run(scope_pipeline.variant, prefix=prefix, scope="user")
    assert artifact.result == f"{open_prefix(prefix).url}/users/bob/scope/base/v1:1"
    monkeypatch.setenv("MARIN_USER", "carol")  # another user reads the shared one
    (other,) = run(scope_pipeline.variant, prefix=prefix, scope="user")
    assert other.result == f"{open_prefix(prefix).url}/scope/base/v1:1"


def test_the_scope_is_not_identity(tmp_path) -> None:
    shared = apply("s", scope_pipeline.make, version="v1", n=1)
    assert lower(shared).fingerprint == lower(shared.with_options(scope="user")).fingerprint


@pytest.mark.parametrize("user", ["root", "nobody", ""])
def test_a_service_account_is_no_user(user, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_USER", user)
    monkeypatch.setattr("getpass.getuser", lambda: "root")
    with pytest.raises(InvalidStepError, match="set MARIN_USER"):
        run(scope_pipeline.variant, prefix=str(tmp_path))


@pytest.mark.parametrize("user", ["a/b", "..", "x y", "../../etc"])
def test_a_user_name_that_is_not_one_path_segment_is_an_error(user, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_USER", user)
    with pytest.raises(InvalidStepError, match="not one path segment"):
        run(scope_pipeline.variant, prefix=str(tmp_path))


def test_a_bad_scope_is_refused() -> None:
    with pytest.raises(InvalidStepError, match="use one of shared, user"):
        scope_pipeline.base.with_options(scope="team")


def test_plan_shows_where_each_step_reads_and_writes(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_USER", "alice")
    prefix = str(tmp_path / "p")
    build_shared_base(prefix)
    assert main(["plan", TARGET, "--prefix", prefix, "--json"]) == 0
    steps = {s["step"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    # A user's run reads the shared build; were it rebuilt, it would be built in alice's folder.
    assert steps["scope/base@v1"]["scope"] == {"reads": "shared", "writes": "user"}
    assert steps["scope/variant@v1"]["scope"] == {"reads": "user:alice", "writes": "user:alice"}
    assert steps["scope/variant@v1"]["output_path"].endswith("/users/alice/scope/variant/v1")
    assert main(["plan", TARGET, "--prefix", prefix, "--scope", "user"]) == 0
    table = capsys.readouterr().out
    assert "shared -> user" in table  # base: served from the shared build, else alice's own
    assert "user:alice -> user:alice" in table


def test_user_scope_on_s3(s3_server, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_USER", "alice")
    prefix = f"s3://marin-tests/scope-{uuid.uuid4().hex[:8]}"
    build_shared_base(prefix)
    (artifact,) = run(scope_pipeline.variant, prefix=prefix)
    location = open_prefix(prefix)
    assert artifact.url == f"{prefix}/users/alice/scope/variant/v1"
    assert read_record(location, "scope/variant/v1") is None


def _driver(root: Path, user: str, prefix: str, *flags: str) -> subprocess.Popen[str]:
    """``marin run`` as ``user`` on its own machine: own cwd, HOME and TMPDIR."""
    home = root / user
    (home / "home").mkdir(parents=True)
    (home / "tmp").mkdir()
    env = child_env(MARIN_USER=user, HOME=str(home / "home"), TMPDIR=str(home / "tmp"))
    return subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", TARGET, "--prefix", prefix, "--json",
         "--no-progress", *flags],
        cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_two_users_racing_on_one_bucket_never_touch_each_other_or_shared(
    s3_server, tmp_path
) -> None:
    prefix = f"s3://marin-tests/race-{uuid.uuid4().hex[:8]}"
    shared_id = build_shared_base(prefix)
    procs = [
        _driver(tmp_path, "alice", prefix),
        _driver(tmp_path, "bob", prefix, "--scope", "user"),
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        actions = {s["step"]: s["action"] for s in json.loads(out)["steps"]}
        assert actions["scope/base@v1"] != "built"  # read from the shared build
    location = open_prefix(prefix)
    base = read_record(location, "scope/base/v1")
    assert base is not None and base.build_id == shared_id
    assert read_record(location, "scope/variant/v1") is None
    for user in ("alice", "bob"):
        record = read_record(location, f"users/{user}/scope/variant/v1")
        assert record is not None
        assert record.result == f"{location.url}/scope/base/v1:1"
    assert not location.exists(location.path("users/bob/scope/base/v1"))


def test_a_user_scope_never_rebuilds_the_shared_build_it_reads(tmp_path, monkeypatch) -> None:
    """Placed on the shared build, which then vanished: build_step refuses to write there."""
    from marin.execution.builder.commit import build_step
    from marin.execution.builder.request import BuildRequest
    from marin.execution.plan.scope import resolve_scopes

    monkeypatch.setenv("MARIN_USER", "alice")
    prefix = str(tmp_path / "p")
    build_shared_base(prefix)
    location = open_prefix(prefix)
    (placed,) = resolve_scopes([lower(scope_pipeline.base)], location, "user")
    assert placed.output_path == "scope/base/v1" and placed.user_home == ""
    (tmp_path / "p" / "scope" / "base" / "v1.marin" / "record.json").unlink()
    with pytest.raises(InvalidStepError, match="never writes a shared artifact"):
        build_step(BuildRequest(placed, location))
    assert read_record(location, "scope/base/v1") is None


def test_a_shared_step_may_not_write_inside_the_users_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_USER", "alice")
    squatter = apply("users/alice/scope/variant", scope_pipeline.make, version="v1", n=1)
    with pytest.raises(InvalidStepError, match="inside the users' folder"):
        run(squatter, scope_pipeline.variant, prefix=str(tmp_path))


def test_a_shared_step_pinned_onto_the_users_folder_itself_is_refused(
    tmp_path, monkeypatch
) -> None:
    """Red team r8-3: ``pin="users"`` (the folder itself, not a path under it) was built, and
    every user's run on the prefix was refused from then on."""
    monkeypatch.setenv("MARIN_USER", "alice")
    for pin in ("users", "Users"):
        squatter = apply("x", scope_pipeline.make, version="v1", n=1, pin=pin)
        with pytest.raises(InvalidStepError, match="at or inside the users' folder"):
            run(squatter, prefix=str(tmp_path / "p"))
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("name, version", [("users", "alice"), ("Users/bob/x", "v1")])
def test_a_shared_step_whose_name_and_version_make_a_users_path_is_refused(
    tmp_path, monkeypatch, name: str, version: str
) -> None:
    """Finding 5b: ``apply("users", fn, version="alice")`` was accepted as a shared step whose
    output is alice's whole user folder; her user builds then landed inside it, and her own gc
    deleted them with it. The path is checked (name and version), in every scope and without
    reading the prefix, nothing built."""
    monkeypatch.setenv("MARIN_USER", "alice")
    squatter = apply(name, scope_pipeline.make, version=version, n=1)
    with pytest.raises(InvalidStepError, match="inside the users' folder"):
        lower(squatter)
    with pytest.raises(InvalidStepError, match="inside the users' folder"):
        run(squatter, prefix=str(tmp_path / "p"))
    assert not (tmp_path / "p").exists()


def test_a_users_run_builds_a_missing_shared_upstream_in_the_users_folder(
    tmp_path, capsys, monkeypatch
) -> None:
    """Issue 53.15: nothing shared is built yet; alice's run builds it all in her folder."""
    monkeypatch.setenv("MARIN_USER", "alice")
    prefix = str(tmp_path / "p")
    assert main(["run", TARGET, "--prefix", prefix, "--no-progress"]) == 0
    location = open_prefix(prefix)
    assert read_record(location, "scope/base/v1") is None  # the team's folder: untouched
    assert not (tmp_path / "p" / "scope").exists()
    assert read_record(location, "users/alice/scope/base/v1") is not None
    variant = read_record(location, "users/alice/scope/variant/v1")
    assert variant is not None and variant.result == f"{location.url}/users/alice/scope/base/v1:1"


def test_a_forced_shared_upstream_is_rebuilt_in_the_users_folder(
    tmp_path, capsys, monkeypatch
) -> None:
    """Issue 53.15: `--force` of the team's build in a user's run never replaces it."""
    monkeypatch.setenv("MARIN_USER", "alice")
    prefix = str(tmp_path / "p")
    shared_id = build_shared_base(prefix)
    shared_bytes = (tmp_path / "p/scope/base/v1.marin/record.json").read_bytes()
    # In this process, not `run --json`: that routes step output to this test's stderr.
    assert main(["run", TARGET, "--prefix", prefix, "--force", "scope/base", "--no-progress"]) == 0
    location = open_prefix(prefix)
    assert (tmp_path / "p/scope/base/v1.marin/record.json").read_bytes() == shared_bytes
    assert read_record(location, "scope/base/v1").build_id == shared_id
    own = read_record(location, "users/alice/scope/base/v1")
    assert own is not None and own.build_id != shared_id
    variant = read_record(location, "users/alice/scope/variant/v1")
    assert variant is not None and variant.inputs["scope/base@v1"] == own.build_id


@pytest.mark.parametrize("user", ["alice.marin", "Alice.MARIN", "bob."])
def test_a_user_name_colliding_with_marins_names_is_refused(user, tmp_path, capsys, monkeypatch):
    """Issue 53.11: ``users/alice.marin`` would read as the metadata folder of ``users/alice``:
    its builds would vanish from ``ls`` and ``gc``. Refused wherever a user name is taken."""
    from marin.execution.pipeline.scope import user_param

    monkeypatch.setenv("MARIN_USER", user)
    prefix = tmp_path / "p"
    for command in ("run", "plan"):
        assert main([command, TARGET, "--prefix", str(prefix)]) == 2
        err = capsys.readouterr().err
        assert f"user name {user!r} cannot name a folder" in err and "MARIN_USER" in err
    assert not (prefix / "users").exists()
    with pytest.raises(InvalidStepError, match="cannot name a folder"):
        user_param(user, "pass another user")  # an engine run's `user` param


def test_a_runner_in_user_scope_places_the_specs_it_is_given(tmp_path, monkeypatch) -> None:
    """``RunOptions(scope="user")`` with specs nobody placed: the run builds (and reports)
    the placed steps; it once looked the unplaced paths up in the placed plan (KeyError)."""
    from marin.execution.plan.options import RunOptions
    from marin.execution.step_runner import StepRunner

    monkeypatch.setenv("MARIN_USER", "alice")
    runner = StepRunner(RunOptions(scope="user"), prefix=str(tmp_path))
    report = runner.run([lower(scope_pipeline.base)])
    assert list(report.outcomes) == ["users/alice/scope/base/v1"]
    assert [t.output_path for t in report.targets] == ["users/alice/scope/base/v1"]


_DRIFTING = """
import os
from marin.execution.lazy import OUT, apply
def make(out_path):
    os.makedirs(out_path, exist_ok=True)
    open(os.path.join(out_path, "d.txt"), "w").write("data")
def use(src, out_path):
    os.makedirs(out_path, exist_ok=True)
    open(os.path.join(out_path, "u.txt"), "w").write(open(os.path.join(src, "d.txt")).read())
a = apply("s/a", make, version="v1", out_path=OUT)
pipeline = [apply("s/b", use, version="v1", src=a, out_path=OUT)]
"""


def _as(user: str, folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = child_env(MARIN_USER=user, PYTHONPATH=f"{folder}:{child_env()['PYTHONPATH']}")
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *argv, "--prefix", str(folder / "P")],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("case", ["code drift, rebuild", "stale"])
def test_a_shared_build_the_users_run_rebuilds_is_built_in_the_users_folder(
    case: str, tmp_path: Path
) -> None:
    """Red team round 5, finding 3: a user-scope run whose shared upstream must be rebuilt
    (its code changed, under ``--on-code-drift rebuild``; or stale after a teammate's
    ``--no-cascade`` rebuild) planned ``shared -> user`` and then failed every run with advice
    that looped ("run again"). The plan places the rebuild in the user's folder, as for a
    missing or forced step; the run succeeds; the shared builds are untouched."""
    pipe = tmp_path / "pipe.py"
    pipe.write_text(_DRIFTING)
    assert _as("alice", tmp_path, "run", "pipe.py:pipeline", "--no-progress").returncode == 0
    flags = ["--scope", "user"]
    if case == "stale":
        pipe.write_text(_DRIFTING.replace('"data"', '"data2"'))
        again = _as("alice", tmp_path, "run", "pipe.py:pipeline", "--force", "s/a",
                    "--no-cascade", "--no-progress")  # fmt: skip
        assert again.returncode == 0, again.stderr
        rebuilt = ["s/b"]
    else:
        pipe.write_text(_DRIFTING.replace('"data"', '"data!"'))
        flags += ["--on-code-drift", "rebuild"]
        rebuilt = ["s/a", "s/b"]
    shared = {p: (tmp_path / f"P/{p}/v1.marin/record.json").read_bytes() for p in ("s/a", "s/b")}
    plan = _as("bob", tmp_path, "plan", "pipe.py:pipeline", *flags, "--json")
    assert plan.returncode == 0, plan.stderr
    steps = {s["step"]: s for s in json.loads(plan.stdout)["steps"]}
    for name in rebuilt:
        assert steps[f"{name}@v1"]["action"] == "build"
        assert steps[f"{name}@v1"]["scope"] == {"reads": "user:bob", "writes": "user:bob"}
        assert steps[f"{name}@v1"]["output_path"].endswith(f"/users/bob/{name}/v1")
    for _ in range(2):
        done = _as("bob", tmp_path, "run", "pipe.py:pipeline", *flags, "--no-progress")
        assert done.returncode == 0, done.stderr
    for name in rebuilt:
        assert (tmp_path / f"P/users/bob/{name}/v1.marin/record.json").exists()
    for p, before in shared.items():
        assert (tmp_path / f"P/{p}/v1.marin/record.json").read_bytes() == before
    assert _as("bob", tmp_path, "plan", "pipe.py:pipeline", *flags, "--exit-code").returncode == 0
