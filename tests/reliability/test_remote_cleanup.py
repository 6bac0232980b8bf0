"""A finished ``local`` job's folder is removed only when it is provably this build's job's
(``remote/cleanup.py``); the committed and failed paths are in ``test_remote.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marin.execution.remote.cleanup import forget_failed, release_job
from marin.execution.store.location import open_prefix
from marin.execution.store.step_folder import JobRecord, create_job, read_job

ID, OTHER = "marin-" + "a" * 20, "marin-" + "b" * 20


@pytest.fixture(autouse=True)
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MARIN_LOCAL_JOBS", str(tmp_path / "jobs"))
    return tmp_path / "jobs"


def _job(jobs: Path, job_id: str, result: bool = True) -> tuple[JobRecord, Path]:
    folder = jobs / job_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "call.pkl").write_bytes(b"")
    if result:
        (folder / "result.json").write_bytes(b"")
    return JobRecord("local", job_id, "build-1", "now", {}), folder


def test_release_removes_only_the_recorded_ended_job(tmp_path: Path, jobs: Path) -> None:
    location = open_prefix(str(tmp_path / "prefix"))
    mine, folder = _job(jobs, ID)
    other, other_folder = _job(jobs, OTHER)
    create_job(location, "s/v1", other)  # another job of the step is recorded now
    release_job(location, "s/v1", mine)
    assert folder.is_dir()  # not the recorded job: untouched
    release_job(location, "s/v1", other)
    assert not other_folder.exists() and read_job(location, "s/v1") == other


def test_release_keeps_a_running_job_and_follows_no_link(tmp_path: Path, jobs: Path) -> None:
    location = open_prefix(str(tmp_path / "prefix"))
    running, folder = _job(jobs, ID, result=False)
    forget_failed(location, "s/v1", running)
    assert folder.is_dir()  # no result: it may still run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "result.json").write_bytes(b"")
    linked = JobRecord("local", OTHER, "build-1", "now", {})
    link = jobs / OTHER
    os.symlink(elsewhere, link)  # the job's folder is a link: never followed
    forget_failed(location, "s/v1", linked)
    assert (elsewhere / "result.json").exists() and link.is_symlink()
    hostile = JobRecord("local", "../elsewhere", "build-1", "now", {})
    forget_failed(location, "s/v1", hostile)  # not a Marin job id: never a path
    assert (elsewhere / "result.json").exists()
