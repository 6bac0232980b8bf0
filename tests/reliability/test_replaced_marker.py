"""What keeps a killed rebuild's readers stale survives ``marin gc`` and damage (issue 53).

A rebuild that never commits leaves a status naming the build it deleted (``records.REPLACES``);
the one identity rule reads what was made from that build as stale. Red team round 2:

- finding 3: a ``marin gc`` that kept such a reader (registered, ``--keep-versions 1``, another
  user's ``--all-users --scope user``) reclaimed the killed rebuild's folder, status included;
  the step then read as a merely missing intermediate, was pruned, and its reader, made from
  the old build, was served as current. gc now keeps the status a kept reader's input build is
  named in (``gc/collect.py``).
- finding 6: a torn, empty or unparseable status was ignored (the same outcome). A corrupt
  status now reads as a failed attempt that may have replaced a build: readers stale.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from marin.execution.lazy import OUT, apply, run
from marin.execution.pipeline.lower import lower_graph
from marin.execution.plan.options import RunOptions
from marin.execution.run.runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import (
    FAILED,
    REPLACES,
    UNKNOWN_BUILD,
    read_record,
    read_status_file,
    status_path,
)
from marin.execution.vocabulary import Action
from marin.gc import collect_garbage
from tests.reliability.conftest import REPO, child_env
from tests.reliability.test_unfinished_rebuild import FAIL, STRICT, chain, decisions, make_a

TARGET = "tests/reliability/pipelines.py:crash"
OTHER = "tests/reliability/pipelines.py:held"
STRICT_FLAGS = ("--on-drift", "rebuild", "--on-code-drift", "rebuild")


def _marin(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip


def _plan(prefix: str, env: dict[str, str], *extra: str) -> dict[str, dict[str, object]]:
    done = _marin("plan", TARGET, "--prefix", prefix, "--json", *STRICT_FLAGS, *extra, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return {s["step"]: s for s in json.loads(done.stdout)["steps"]}


@pytest.mark.parametrize("keeper", ["register", "keep-versions", "other-user"])
def test_a_gc_that_keeps_a_reader_keeps_it_stale_after_a_killed_rebuild(
    tmp_path: Path, keeper: str
) -> None:
    """SIGKILL during ``--force crash/b``; a teammate's gc of an unrelated target keeps d (made
    from the old b): d stays stale after that gc, and the next run rebuilds b and d."""
    prefix = str(tmp_path / "p")
    scope = ("--scope", "user") if keeper == "other-user" else ()
    env = child_env(MARIN_USER="alice")
    home = "users/alice/" if scope else ""
    assert _marin("run", TARGET, "--prefix", prefix, *scope, env=env).returncode == 0
    if keeper == "register":
        registered = _marin("register", "crash/d@v1", "--id", "team/d/r1", "--prefix", prefix,
                            env=env)  # fmt: skip
        assert registered.returncode == 0, registered.stderr
    crash = {**env, "MARIN_FAULT_CRASH": "during-fn@crash/b"}
    killed = _marin("run", TARGET, "--prefix", prefix, "--force", "crash/b", *scope, env=crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    location = open_prefix(prefix)
    assert read_status_file(location, f"{home}crash/b/v1") is not None
    gc = {
        "register": ("gc", OTHER, "--prefix", prefix),
        "keep-versions": ("gc", OTHER, "--prefix", prefix, "--keep-versions", "1"),
        "other-user": ("gc", OTHER, "--prefix", prefix, "--all-users", "--scope", "user",
                       "--keep-versions", "1"),
    }[keeper]  # fmt: skip
    bob = child_env(MARIN_USER="bob") if keeper == "other-user" else env
    done = _marin(*gc, "--json", env=bob)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert f"{home}crash/b/v1" in {k["path"] for k in report["kept"]}, report
    assert not report["gone_inputs"], report["gone_inputs"]
    status = read_status_file(location, f"{home}crash/b/v1")
    assert status is not None and status[REPLACES], status
    steps = _plan(prefix, env, *scope)
    for step in ("crash/b@v1", "crash/d@v1", "crash/e@v1"):
        assert steps[step]["action"] == "build", steps[step]
    before = read_record(location, f"{home}crash/d/v1")
    last = _marin("run", TARGET, "--prefix", prefix, *scope, env=env)
    b, d = read_record(location, f"{home}crash/b/v1"), read_record(location, f"{home}crash/d/v1")
    if keeper == "register":  # a registered build is never rebuilt in place: the run says so
        assert last.returncode == 1 and "is registered as team/d/r1" in last.stderr, last.stderr
        assert d == before and b is not None and d.inputs["crash/b@v1"] != b.build_id
        return
    assert last.returncode == 0, last.stderr[-3000:]
    assert b is not None and d is not None and d.inputs["crash/b@v1"] == b.build_id


CORRUPTIONS = {"torn": lambda raw: raw[:40], "empty": lambda raw: b"", "list": lambda raw: b"[]"}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_corrupt_status_after_an_unfinished_rebuild_keeps_readers_stale(
    tmp_path: Path, kind: str
) -> None:
    """b's rebuild fails (its status names the build c read); the status is then damaged: c
    is still stale under every policy, gc keeping c keeps b's status, and a run rebuilds b."""
    prefix = str(tmp_path / "p")
    FAIL["b"] = False
    run(chain("1"), prefix=prefix)
    FAIL["b"] = True
    try:
        with pytest.raises(Exception, match="injected failure"):
            run(chain("1"), prefix=prefix, force=["b"])
    finally:
        FAIL["b"] = False
    location = open_prefix(prefix)
    path = location.path(status_path("b/v1"))
    location.fs.pipe_file(path, CORRUPTIONS[kind](location.fs.cat_file(path)))
    status = read_status_file(location, "b/v1")
    assert status is not None and status["state"] == FAILED
    assert status[REPLACES] == UNKNOWN_BUILD
    for options in ({}, STRICT):
        plan = decisions(chain("1"), prefix, **options)
        assert plan["c"].action == Action.BUILD and plan["b"].action == Action.BUILD
    served = decisions(chain("1"), prefix, cascade=False)["c"]
    assert served.action == Action.SKIP
    assert "upstream b@v1 has a corrupt status (it may be rebuilt)" in served.stale
    other = apply("other", make_a, version="v1", out=OUT, salt="z")
    report = collect_garbage([other], prefix, keep_versions=1)
    assert "b/v1" in {k.path for k in report.kept} and not report.gone, report
    assert read_status_file(location, "b/v1") is not None
    StepRunner(prefix=prefix, options=RunOptions(**STRICT)).run(lower_graph(chain("1")))
    b, c = read_record(location, "b/v1"), read_record(location, "c/v1")
    assert b is not None and c is not None and c.inputs["b@v1"] == b.build_id
    assert read_status_file(location, "b/v1") is None  # the commit dropped it
