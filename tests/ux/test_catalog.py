"""``marin ls`` and ``marin show`` on a really built prefix; help and error style everywhere."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from marin.catalog import human_size
from tests.ux.helpers import EXAMPLE, PIPELINES, ROOT, marin


def test_ls_lists_every_built_artifact(built_example: str) -> None:
    result = marin("ls", "--prefix", built_example)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("ngram/")]
    assert len(rows) == 11
    report = next(r for r in rows if r.startswith("ngram/report@v1 "))
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", report)
    assert f"@{socket.gethostname()}" in report
    assert re.search(r"\d+(\.\d)? (B|KB|MB)", report)
    assert "11 artifact(s)" in result.stdout and built_example in result.stdout


def test_ls_json_and_unfinished_steps(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    failed = marin("run", f"{PIPELINES}:failing", "--prefix", prefix, env={"MARIN_TEST_SLEEP": "0"})
    assert failed.returncode == 1
    data = json.loads(marin("ls", "--prefix", prefix, "--json").stdout)
    assert sorted(a["step"] for a in data["artifacts"]) == ["demo/right@v1", "demo/source@v1"]
    assert all(a["size_bytes"] and a["user"] and a["host"] for a in data["artifacts"])
    assert data["unfinished"] == [
        {
            "step": "demo/bad@v1",
            "output_path": f"{prefix}/demo/bad/v1",
            "state": "FAILED",
            "error": "RuntimeError: kaboom: the model diverged",
        }
    ]
    text = marin("ls", "--prefix", prefix).stdout
    assert "not built: demo/bad@v1 (FAILED: RuntimeError: kaboom" in text


def test_ls_of_an_empty_or_missing_prefix(tmp_path: Path) -> None:
    result = marin("ls", "--prefix", str(tmp_path / "nothing"))
    assert result.returncode == 0 and "0 artifact(s)" in result.stdout


def test_show_by_name_at_version(built_example: str) -> None:
    result = marin("show", "ngram/dataset@v1", "--prefix", built_example)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    record = json.loads(Path(built_example, "ngram/dataset/v1.marin/record.json").read_text())
    assert out.startswith("ngram/dataset@v1")
    assert f"fingerprint  {record['fingerprint']}" in out
    prov = record["provenance"]
    commit = prov["git_commit"]
    if commit:
        assert f"git          {commit} ({'dirty' if prov['git_dirty'] else 'clean'})" in out
    assert f"by           {prov['user']}@{prov['host']}" in out
    assert f"time         {prov['time']}" in out
    assert "duration     " in out
    assert f"ngram/tokens/shard-00@v1  {built_example}/ngram/tokens/shard-00/v1" in out
    assert '"heldout_every": 10' in out  # config
    assert f'"vocab": {record["result"]["vocab"]}' in out  # result
    # The dataset step prints nothing, so it has no log.txt (a build creates one only when the
    # step prints), and show says so instead of naming a file that is not there.
    assert not Path(built_example, "ngram/dataset/v1.marin/log.txt").exists()
    assert "log          (none: the step printed and logged nothing)" in out


def test_show_by_path_by_bare_name_and_as_json(built_example: str) -> None:
    by_path = marin("show", f"{built_example}/ngram/report/v1")
    assert by_path.returncode == 0 and by_path.stdout.startswith("ngram/report@v1")
    by_record = marin("show", f"{built_example}/ngram/report/v1.marin/record.json")
    assert by_record.stdout == by_path.stdout
    by_name = marin("show", "ngram/report", "--prefix", built_example)
    assert by_name.returncode == 0 and by_name.stdout.startswith("ngram/report@v1")
    raw = json.loads(marin("show", "ngram/report@v1", "--prefix", built_example, "--json").stdout)
    assert raw["name"] == "ngram/report" and raw["provenance"]["user"]


def test_show_a_failed_step_and_a_missing_one(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    marin("run", f"{PIPELINES}:failing", "--prefix", prefix, env={"MARIN_TEST_SLEEP": "0"})
    failed = marin("show", "demo/bad@v1", "--prefix", prefix)
    assert failed.returncode == 1
    assert "demo/bad@v1: not built (FAILED)" in failed.stdout
    assert "RuntimeError: kaboom" in failed.stdout and "traceback" in failed.stdout
    assert f"log          {prefix}/demo/bad/v1.marin/log.txt" in failed.stdout
    missing = marin("show", "demo/nope@v9", "--prefix", prefix)
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: nothing is built at ")
    assert "(step demo/nope@v9): " in missing.stderr and "Traceback" not in missing.stderr


def test_human_size() -> None:
    assert [human_size(n) for n in (None, 0, 1023, 1024, 5 * 1024**2)] == [
        "-", "0 B", "1023 B", "1.0 KB", "5.0 MB",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [[], ["run"], ["plan"], ["graph"], ["show"], ["ls"], ["export"]],
)
def test_every_command_has_help_with_an_example(command: list[str]) -> None:
    result = marin(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "example:" in result.stdout and "marin " in result.stdout.split("example:", 1)[1]


@pytest.mark.parametrize(
    "args",
    [["run"], ["plan", EXAMPLE, "--bogus"], ["graph", EXAMPLE, "--format", "svg"], ["nope"]],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = marin(*args)
    assert result.returncode == 2 and "usage:" in result.stderr


def test_errors_follow_one_style(tmp_path: Path) -> None:
    for args in (
        ["graph", "missing.py:pipeline"],
        ["show", "x@v1", "--prefix", str(tmp_path)],
        ["ls", "--prefix", "nosuch://bucket"],
        ["plan", EXAMPLE, "--prefix", "nosuch://bucket"],
    ):
        result = marin(*args)
        assert result.returncode == 2, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and re.match(r"^error: .+: .+", lines[0]), (args, result.stderr)


def test_ls_tells_a_users_build_from_the_shared_one(tmp_path: Path) -> None:
    """Issue 55: the team's build and alice's build of one step were two identical rows."""
    prefix, target = str(tmp_path / "p"), f"{ROOT / 'tests' / 'scope_pipeline.py'}:team"
    assert marin("run", target, "--prefix", prefix).returncode == 0
    mine = marin(
        "run", target, "--prefix", prefix, "--scope", "user", "--force", "scope/variant",
        env={"MARIN_USER": "alice"},
    )  # fmt: skip
    assert mine.returncode == 0, mine.stderr
    listed = marin("ls", "--prefix", prefix).stdout
    rows = [line.split()[:2] for line in listed.splitlines() if line.startswith("scope/variant")]
    assert sorted(rows) == [["scope/variant@v1", "shared"], ["scope/variant@v1", "user:alice"]]
    assert listed.splitlines()[0].split()[:2] == ["step", "scope"]
    data = json.loads(marin("ls", "--prefix", prefix, "--json").stdout)
    scopes = sorted((a["step"], a["scope"]) for a in data["artifacts"])
    assert ("scope/variant@v1", "user:alice") in scopes and ("scope/base@v1", "shared") in scopes


def test_ls_without_user_builds_has_no_scope_column(built_example: str) -> None:
    assert "scope" not in marin("ls", "--prefix", built_example).stdout.splitlines()[0]


@pytest.mark.parametrize("expires_in", [-30.0, 590.0], ids=["expired", "live"])
def test_an_expired_lease_of_a_live_holder_is_unfinished_not_running(
    tmp_path: Path, expires_in: float
) -> None:
    """Issue 55.4: the same test as a run's, wherever a status is shown. A lease of another
    host (whose process no one here can see) that expired is ``UNFINISHED``, saying so; one
    that has not is still ``RUNNING``."""
    import time

    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import RUNNING, lease_path, metadata_dir, write_status

    prefix = str(tmp_path / "p")
    location = open_prefix(prefix)
    location.fs.makedirs(location.path(metadata_dir("s/v0")), exist_ok=True)
    lease = {"holder": "otherhost:4242:99", "token": "t", "ttl": 600,
             "expires_at": time.time() + expires_in, "started_at": "2026-12-06T00:00:00Z"}  # fmt: skip
    location.fs.pipe_file(location.path(lease_path("s/v0")), json.dumps(lease).encode())
    write_status(location, "s/v0", RUNNING, holder=lease["holder"], started_at=lease["started_at"])
    listed = marin("ls", "--prefix", prefix).stdout
    shown = marin("show", "s@v0", "--prefix", prefix).stdout
    if expires_in > 0:
        assert "not built: s@v0 (RUNNING" in listed and "UNFINISHED" not in listed, listed
        return
    assert re.search(r"s@v0 \(UNFINISHED: its lease expired \d+s ago; the next run takes", listed)
    assert "RUNNING" not in listed and "RUNNING" not in shown, shown
    assert "not built (UNFINISHED)" in shown, shown
