"""A rebuild that never commits leaves what read the build it deleted stale (issue 52).

Found by the random-history checker (tests/oracle, seed 48; pinned as
``a-killed-rebuild-makes-its-stale-readers-current``): a rebuild deletes the step's record
before it clears the output; killed or failed after that, it left the step looking merely
missing (pruned below built readers), and its readers were served as current, even under
``--on-drift rebuild --on-code-drift rebuild``. The step's status now names the build it
replaced until a new build commits (``records.REPLACES``), and the one identity rule reads its
readers as stale.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marin.execution.lazy import OUT, apply, run
from marin.execution.pipeline.lower import lower_graph
from marin.execution.plan.options import RunOptions
from marin.execution.plan.read import plan_run
from marin.execution.run.runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record, read_status_file
from marin.execution.vocabulary import Action
from tests.reliability.conftest import REPO, child_env

NOT_FINISHED = "upstream {} was being rebuilt and did not finish"
STRICT = {"on_drift": "rebuild", "on_code_drift": "rebuild"}
FAIL: dict[str, bool] = {"b": False}


def _write(out: str, name: str, inputs: list[str], salt: str) -> str:
    text = name + salt + "".join(Path(i, "data").read_text() for i in inputs)
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, "data").write_text(text)
    return text


def make_a(out: str, salt: str) -> str:
    return _write(out, "a", [], salt)


def make_b(out: str, ins: list[str]) -> str:
    if FAIL["b"]:
        raise RuntimeError("b: injected failure")
    return _write(out, "b", ins, "")


def make_c(out: str, ins: list[str]) -> str:
    return _write(out, "c", ins, "")


def chain(salt: str) -> Any:
    a = apply("a", make_a, version="v1", out=OUT, salt=salt)
    b = apply("b", make_b, version="v1", out=OUT, ins=[a])
    return apply("c", make_c, version="v1", out=OUT, ins=[b])


def decisions(target: Any, prefix: str, **options: Any) -> dict[str, Any]:
    plan = plan_run(lower_graph(target), open_prefix(prefix), RunOptions(**options))
    return {d.spec.name: d for d in plan.decisions.values()}


@pytest.mark.parametrize("options", [{}, STRICT], ids=["warn", "rebuild"])
def test_a_failed_rebuild_leaves_its_readers_stale(tmp_path: Path, options: dict[str, str]) -> None:
    prefix = str(tmp_path / "p")
    FAIL["b"] = False
    run(chain("1"), prefix=prefix)
    c_before = read_record(open_prefix(prefix), "c/v1")
    assert c_before is not None
    FAIL["b"] = True
    with pytest.raises(Exception, match="injected failure"):
        strict = {**options, "on_drift": "rebuild"}  # a drifted: rebuilt, then b fails
        StepRunner(prefix=prefix, options=RunOptions(**strict)).run(lower_graph(chain("2")))
    status = read_status_file(open_prefix(prefix), "b/v1")
    assert status is not None and status["replaces"] == c_before.inputs["b@v1"]
    plan = decisions(chain("2"), prefix, **options)
    assert plan["c"].action == Action.BUILD, plan["c"].reason
    assert plan["b"].action == Action.BUILD
    served = decisions(chain("2"), prefix, **options, cascade=False)["c"]  # served: says why
    assert served.action == Action.SKIP and NOT_FINISHED.format("b@v1") in served.stale
    FAIL["b"] = False
    StepRunner(prefix=prefix, options=RunOptions(**options)).run(lower_graph(chain("2")))
    location = open_prefix(prefix)
    b, c = read_record(location, "b/v1"), read_record(location, "c/v1")
    assert b is not None and c is not None
    assert c.inputs["b@v1"] == b.build_id != c_before.inputs["b@v1"]
    assert (tmp_path / "p/c/v1/data").read_text() == "c" + "b" + "a2"
    assert read_status_file(location, "b/v1") is None  # the commit dropped it


def test_a_failed_rebuild_of_a_missing_step_keeps_naming_what_it_replaced(tmp_path: Path) -> None:
    """Two unfinished rebuilds in a row: the second's status still names the first's build."""
    prefix = str(tmp_path / "p")
    FAIL["b"] = False
    run(chain("1"), prefix=prefix)
    replaced = read_record(open_prefix(prefix), "b/v1")
    assert replaced is not None
    FAIL["b"] = True
    for _ in range(2):
        with pytest.raises(Exception, match="injected failure"):
            run(chain("1"), prefix=prefix, force=["b"])
        status = read_status_file(open_prefix(prefix), "b/v1")
        assert status is not None and status["replaces"] == replaced.build_id
    assert decisions(chain("1"), prefix)["c"].action == Action.BUILD
    FAIL["b"] = False


def _marin(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *args, "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_driver_killed_during_a_rebuild_leaves_its_readers_stale(tmp_path: Path) -> None:
    """SIGKILL while ``--force crash/b`` runs b's fn: d and e, built from the old b, are
    rebuilt when e is asked for next (under rebuild/rebuild too), never served."""
    prefix, target = str(tmp_path / "p"), "tests/reliability/pipelines.py:crash"
    env, tail = child_env(), ("--select", "crash/e")  # b is no target: only e's reads need it
    assert _marin("run", target, "--prefix", prefix, env=env).returncode == 0
    old_b = read_record(open_prefix(prefix), "crash/b/v1")
    assert old_b is not None
    crash = {**env, "MARIN_FAULT_CRASH": "during-fn@crash/b"}
    killed = _marin("run", target, "--prefix", prefix, "--force", "crash/b", *tail, env=crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert read_record(open_prefix(prefix), "crash/b/v1") is None
    plan = _marin("plan", target, "--prefix", prefix, "--on-drift", "rebuild",
                  "--on-code-drift", "rebuild", *tail, env=env)  # fmt: skip
    steps = {s["step"]: s for s in json.loads(plan.stdout)["steps"]}
    for step in ("crash/b@v1", "crash/d@v1", "crash/e@v1"):
        assert steps[step]["action"] == "build", steps[step]
    plan = _marin("plan", target, "--prefix", prefix, "--no-cascade", *tail, env=env)
    d = next(s for s in json.loads(plan.stdout)["steps"] if s["step"] == "crash/d@v1")
    assert d["action"] == "skip" and NOT_FINISHED.format("crash/b@v1") in d["stale"], d
    again = _marin("run", target, "--prefix", prefix, *tail, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    location = open_prefix(prefix)
    b, d = read_record(location, "crash/b/v1"), read_record(location, "crash/d/v1")
    assert b is not None and d is not None and b.build_id != old_b.build_id
    assert d.inputs["crash/b@v1"] == b.build_id
