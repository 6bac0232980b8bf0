"""A user's build of a shared input whose rebuild failed is stale in her plan too (issue 53).

Red team round 4, finding 5: alice builds the shared ``s/d``; bob builds ``s/r`` with
``--scope user`` (in ``users/bob/``, reading the shared d). alice changes d's code and rebuilds
it; the rebuild deletes d's record and fails, leaving a status naming the build it replaced.
alice's shared plan rebuilds r, but bob's plan placed d in his folder (no shared record now),
found nothing there, pruned it and served his r, made from the replaced build, as current. A
torn shared status did the same. What a user-placed step's shared placement holds, record or
status, is now read as the shared plan reads it (``records.shared_build``), and one rule
(``identity._gone_input``) makes its readers stale in every placement.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.conftest import child_env

_PIPE = """
import os, pathlib
from marin.execution.lazy import OUT, apply

def dfn(out_path):
    pathlib.Path(out_path).mkdir(parents=True, exist_ok=True)
    pathlib.Path(out_path, "d.txt").write_text("A")
    return 0

def rfn(data, out_path):
    pathlib.Path(out_path).mkdir(parents=True, exist_ok=True)
    pathlib.Path(out_path, "r.txt").write_text(pathlib.Path(data, "d.txt").read_text() + "r")
    return 0

d = apply("s/d", dfn, version="v1", out_path=OUT)
r = apply("s/r", rfn, version="v1", data=d, out_path=OUT)
"""
_NEW_CODE = 'write_text("B")\n    if os.environ.get("FAIL_D"): raise RuntimeError("transient")'
_USER = ("--scope", "user", "--on-code-drift", "rebuild")
_DONE = {"build": "built", "skip": "skipped", "prune": "pruned"}
"""A plan's action -> the run's word for having done it."""


def _as(user: str, folder: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    extra = child_env(MARIN_USER=user, MARIN_LOCAL_JOBS=str(folder / "jobs"), **env)
    extra["PYTHONPATH"] = f"{folder}:{extra['PYTHONPATH']}"
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *argv, "--prefix", str(folder / "P")],
        cwd=folder, env=extra, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _steps(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    assert done.returncode == 0, done.stderr[-3000:]
    return {s["step"]: s for s in json.loads(done.stdout)["steps"]}


@pytest.mark.parametrize("status", ["names the replaced build", "torn"])
def test_a_users_reader_of_a_shared_step_whose_rebuild_failed_is_rebuilt(
    status: str, tmp_path: Path
) -> None:
    pipe = tmp_path / "pipe.py"
    pipe.write_text(_PIPE)
    assert _as("alice", tmp_path, "run", "pipe.py:d", "--no-progress").returncode == 0
    assert _as("bob", tmp_path, "run", "pipe.py:r", "--scope", "user").returncode == 0
    assert (tmp_path / "P/users/bob/s/r/v1/r.txt").read_text() == "Ar"
    pipe.write_text(_PIPE.replace('write_text("A")', _NEW_CODE))
    failed = _as("alice", tmp_path, "run", "pipe.py:d", "--on-code-drift", "rebuild",
                 "--no-progress", FAIL_D="1")  # fmt: skip
    assert failed.returncode != 0
    shared = tmp_path / "P/s/d/v1.marin"
    assert not (shared / "record.json").exists()
    if status == "torn":
        (shared / "status.json").write_text('{"sta')
    else:
        assert json.loads((shared / "status.json").read_text())["replaces"]

    plan = _steps(_as("bob", tmp_path, "plan", "pipe.py:r", *_USER, "--json"))
    for step in ("s/d@v1", "s/r@v1"):
        assert plan[step]["action"] == "build", plan[step]
        assert "/users/bob/" in str(plan[step]["output_path"])
    assert plan["s/r@v1"]["lineage"] == "stale"
    why = "has a corrupt status (it may be rebuilt)" if status == "torn" else (
        "was being rebuilt and did not finish")  # fmt: skip
    served = _steps(_as("bob", tmp_path, "plan", "pipe.py:r", *_USER, "--no-cascade", "--json"))
    assert served["s/r@v1"]["stale"] == [f"upstream s/d@v1 {why}"]  # the cause, d not rebuilt
    ran = _steps(_as("bob", tmp_path, "run", "pipe.py:r", *_USER, "--json", "--no-progress"))
    assert {k: s["action"] for k, s in ran.items()} == {
        k: _DONE[str(s["action"])] for k, s in plan.items()
    }
    assert (tmp_path / "P/users/bob/s/r/v1/r.txt").read_text() == "Br"  # a clean build's
    assert not (shared / "record.json").exists()  # a user's run never writes the shared build
    again = _as("bob", tmp_path, "plan", "pipe.py:r", *_USER, "--exit-code")
    assert again.returncode == 0, again.stdout
