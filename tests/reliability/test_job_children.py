"""What a ``local`` job or an isolated step's child starts from, and what it prints, is
untrusted (issue 53, red-team round 1: findings 10, 11, 12): a jobs root under a folder others
can change is refused; the child never unpickles a call that is a link or that another user
could write; nothing is imported from the driver's working folder; echoed job output shows
its escapes off a terminal too; and a full disk is decided by the errno, never by printed
words. Real ``marin`` drivers and real child interpreters."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.conftest import REPO, child_env
from tests.reliability.job_trust_pipelines import ESCAPES

PIPELINES = REPO / "tests/reliability/job_trust_pipelines.py"


def marin(
    target: str, prefix: Path, env: dict[str, str], *extra: str, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """``marin run`` of a pipeline of ``job_trust_pipelines.py`` (output piped: no terminal).
    ``-P``: the driver itself never imports from ``cwd`` (as the ``marin`` console script)."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "marin.cli", "run", f"{PIPELINES}:{target}",
         "--prefix", str(prefix), *extra],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def env_for(tmp_path: Path) -> dict[str, str]:
    return child_env(MARIN_LOCAL_JOBS=str(tmp_path / "jobs"), MARIN_REMOTE_POLL_MAX_S="0.2")


class _Touch:
    """Unpickling this runs ``touch PATH`` (what a planted call could do)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("parent", ["writable by others", "a link to one writable by others"])
def test_a_jobs_root_under_a_folder_others_can_change_is_refused(
    tmp_path: Path, parent: str
) -> None:
    """Finding 10: ``MARIN_LOCAL_JOBS`` is a private folder inside a team scratch folder that
    others can write without the sticky bit (another user could rename the jobs root away
    between a submit and the job's start): the run refuses the step, naming that folder and
    the fix, and no job starts."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    via = shared
    if parent.startswith("a link"):
        via = tmp_path / "via"
        via.symlink_to(shared)
    env = {**env_for(tmp_path), "MARIN_LOCAL_JOBS": str(via / "jobs")}
    done = marin("children", tmp_path / "p", env, "--keep-going")
    assert done.returncode == 1, done.stderr[-3000:]
    refusal = "  error: RemoteJobError: error: the local jobs folder"
    (line,) = [x for x in (done.stdout + done.stderr).splitlines() if x.startswith(refusal)]
    assert f"the local jobs folder {via / 'jobs'} is inside {shared}" in line, line
    assert "which others can write (mode 777, not sticky)" in line, line
    assert "(step trust/remote@v1)" in line and "MARIN_LOCAL_JOBS" in line, line
    assert not (shared / "jobs").exists() or os.listdir(shared / "jobs") == []
    assert read_record(open_prefix(str(tmp_path / "p")), "trust/remote/v1") is None
    assert read_record(open_prefix(str(tmp_path / "p")), "trust/isolated/v1") is not None


def test_a_jobs_root_in_a_sticky_folder_is_accepted(tmp_path: Path) -> None:
    """Finding 10's check keeps ``/tmp``'s case working: a sticky folder others can write
    (no one renames what is another's there) holds a usable jobs root."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    env = {**env_for(tmp_path), "MARIN_LOCAL_JOBS": str(shared / "jobs")}
    done = marin("children", tmp_path / "p", env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_record(open_prefix(str(tmp_path / "p")), "trust/remote/v1") is not None


def test_the_child_never_unpickles_a_call_it_cannot_trust(tmp_path: Path) -> None:
    """Finding 10: the interpreter a job or an isolated step starts (``isolated_child``, as
    they start it) refuses a call that is a link, writable by others or (as root) another
    user's: the payload is never unpickled, and the outcome says why."""
    marker = tmp_path / "marker"
    planted = tmp_path / "planted.pkl"
    planted.write_bytes(pickle.dumps(_Touch(str(marker))))
    os.chmod(planted, 0o600)
    cases = {"a link": tmp_path / "link.pkl", "writable by others": tmp_path / "open.pkl"}
    cases["a link"].symlink_to(planted)
    cases["writable by others"].write_bytes(planted.read_bytes())
    os.chmod(cases["writable by others"], 0o666)
    if os.getuid() == 0:  # only root can give a file away
        cases["another user's"] = tmp_path / "theirs.pkl"
        cases["another user's"].write_bytes(planted.read_bytes())
        os.chown(cases["another user's"], 65534, 65534)
    for case, call in cases.items():
        out = tmp_path / f"{call.stem}.json"
        child = [sys.executable, "-P", "-m", "marin.execution.pipeline.isolated_child"]
        subprocess.run([*child, str(call), str(out)], env=child_env(), cwd=tmp_path, check=True)
        outcome = json.loads(out.read_text())
        assert (outcome["ok"], outcome["type"]) == (False, "PermissionError"), (case, outcome)
        assert "never unpickled" in outcome["message"], (case, outcome)
        assert not marker.exists(), case


def test_a_marin_package_in_the_working_folder_is_never_imported(tmp_path: Path) -> None:
    """Finding 12: the driver runs from a shared folder (``/tmp``, sticky) where someone
    planted ``marin/__init__.py``; the ``local`` job and the isolated step start their own
    interpreters there, and neither imports it: both steps are built, the planted code never
    runs."""
    work = tmp_path / "work"
    (work / "marin").mkdir(parents=True)
    marker = tmp_path / "PWNED"
    (work / "marin" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write('planted marin ran')\nraise SystemExit(3)\n"
    )
    done = marin("children", tmp_path / "p", env_for(tmp_path), cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not marker.exists(), marker.read_text()
    location = open_prefix(str(tmp_path / "p"))
    for step in ("trust/remote/v1", "trust/isolated/v1"):
        record = read_record(location, step)
        assert record is not None and record.result["pid"] != os.getpid(), step


@pytest.mark.parametrize("display", ["piped", "--no-progress", "--json"])
def test_echoed_job_output_shows_escapes_off_a_terminal(tmp_path: Path, display: str) -> None:
    """Finding 11: a job prints a window title, a screen clear and a bidi override; off a
    terminal (a CI log) the echoed line shows them as text, on stdout and stderr alike, and
    the step's own log keeps what it printed."""
    extra = [] if display == "piped" else [display]
    done = marin("noisy_job", tmp_path / "p", env_for(tmp_path), *extra)
    assert done.returncode == 1, done.stderr[-3000:]
    both = done.stdout + done.stderr
    assert "\x1b" not in both and "\x07" not in both and "\u202e" not in both, repr(both[-2000:])
    echoed = [line for line in both.splitlines() if line.startswith("trust/noisy@v1 | ")]
    assert any("\\x1b]0;pwned-title\\x07\\x1b[2J" in line for line in echoed), echoed
    assert ESCAPES in (tmp_path / "p/trust/noisy/v1.marin/log.txt").read_text()


def test_printed_disk_full_words_never_decide_enospc(tmp_path: Path) -> None:
    """Finding 11: a job prints ``No space left on device`` and then fails with a plain bug:
    the step's error is that bug, never "the disk was full" (a real ENOSPC still is:
    ``test_remote_trust.py``'s full-disk tests)."""
    done = marin("noisy_job", tmp_path / "p", env_for(tmp_path), "--no-progress")
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "failed: ValueError: a plain bug, not a full disk" in last, last
    assert "the disk was full" not in done.stderr and "free space" not in done.stderr
