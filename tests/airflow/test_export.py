"""``marin export airflow`` code generation: determinism, safety, task ids, --check, runtime.

These tests need no Airflow installation: generating the file never imports Airflow.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin_airflow import cli, runtime
from marin_airflow.contract import graph_digest, resolve_target, target_reference
from marin_airflow.export import (
    _HEADER,
    DagOptions,
    ExportError,
    StepInfo,
    TaskEntry,
    assign_task_ids,
    build_export,
    check_export,
    default_dag_id,
    plan_tasks,
    render_dag,
    write_export,
)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EXAMPLE = f"{ROOT / 'examples' / 'ngram.py'}:pipeline"
TOY = f"{HERE / 'airflow_pipelines.py'}:toy"
AIRFLOW_KEY = re.compile(r"^[\w.-]+$")  # airflow.sdk.definitions._internal.node.KEY_REGEX


# --- the committed DAG ---------------------------------------------------------------------


def test_committed_dag_is_up_to_date() -> None:
    """Regenerating dags/ from the example pipeline gives the committed bytes exactly."""
    result = build_export(EXAMPLE, str(ROOT / "dags"))
    committed = ROOT / "dags" / "ngram_pipeline.py"
    assert result.path == str(committed)
    assert committed.exists(), "run: marin export airflow examples/ngram.py:pipeline -o dags"
    fresh, message = check_export(result)
    assert fresh, f"dags/ngram_pipeline.py is stale; re-export it:\n{message}"
    assert committed.read_bytes() == result.text.encode("utf-8")


def test_generated_file_is_machine_independent(tmp_path: Path) -> None:
    text = (ROOT / "dags" / "ngram_pipeline.py").read_text(encoding="utf-8")
    host = os.uname().nodename
    needles = [str(ROOT), os.path.expanduser("~") + "/", sys.version.split()[0], sys.executable]
    needles += [host] if len(host) >= 6 else []  # a short host name could match by chance
    for needle in needles:
        assert needle not in text, f"machine-specific {needle!r} baked into the DAG file"
    assert "airflow" in text and "dag" in text  # the DAG processor skips files without both
    assert 'TARGET = "../examples/ngram.py:pipeline"' in text
    assert 'EXPORT_COMMAND = "marin export airflow examples/ngram.py:pipeline -o dags"' in text
    assert "DEFAULT_PREFIX = None" in text
    assert "max_active_runs=1" in text and "MAX_CONCURRENT = 8" in text


def test_export_is_byte_stable_across_cwd_and_spelling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = build_export(EXAMPLE, str(ROOT / "dags"))
    monkeypatch.chdir(ROOT)
    second = build_export("./examples/../examples/ngram.py:pipeline", "dags/")
    monkeypatch.chdir(tmp_path)
    third = build_export(EXAMPLE, str(ROOT / "dags"))
    assert first.text == second.text == third.text


def test_no_pipeline_or_airflow_import_needed_to_generate() -> None:
    code = (
        "import sys; import marin_airflow.cli, marin_airflow.runtime, marin_airflow.export; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('airflow', 'prefect')]; "
        "assert not bad, bad; "
        "assert 'marin.execution.lazy' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- structure and escaping ------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=()), max_size=40) | st.sampled_from(
    ['"', "'", '"""', "'''", "\\", "\n", "\r\n", "{{ 7 * 7 }}", "\u2028", "\x00", "é", "\ud800"]
)
_DATA_NAMES = [
    "EXPORT_COMMAND",
    "EXPORT_ROOT",
    "TARGET",
    "DAG_ID",
    "DESCRIPTION",
    "SCHEDULE",
    "MAX_CONCURRENT",
    "DEFAULT_PREFIX",
    "ON_DRIFT",
    "GRAPH_DIGEST",
    "STEPS",
]


_CODE_START = len(_DATA_NAMES) + 7


def _structure(text: str) -> tuple[ast.Module, dict[str, object]]:
    """Check the file is exactly: docstring, the 6 imports, data assignments, then code."""
    tree = ast.parse(text)
    body = tree.body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    assert body[0].value.value == ast.literal_eval(_HEADER)  # the fixed docstring
    imports = [ast.unparse(node) for node in body[1:7]]
    assert imports == [
        "from __future__ import annotations",
        "import datetime",
        "from airflow.sdk import DAG, Param, TriggerRule",
        "from marin_airflow.assets import task_assets",
        "from marin_airflow.operator import MarinOperator, MarinPlanOperator",
        "from marin_airflow.runtime import PLAN_TASK_ID, plan_steps, run_step, task_placement",
    ]
    data: dict[str, object] = {}
    for node in body[7:_CODE_START]:
        assert isinstance(node, ast.Assign), ast.dump(node)
        (name,) = node.targets
        assert isinstance(name, ast.Name)
        data[name.id] = ast.literal_eval(node.value)  # plain data only: no calls, no names
    assert list(data) == _DATA_NAMES
    assert isinstance(body[_CODE_START], ast.Assign)  # dag = DAG(...)
    return tree, data


def _code(tree: ast.Module) -> str:
    return "\n".join(ast.dump(node) for node in tree.body[_CODE_START:])


def _reference_with_block() -> str:
    tasks = [TaskEntry("a", "a@v0", "f" * 64)]
    tree, _ = _structure(render_dag("x.py:p", tasks, DagOptions(dag_id="d")))
    return _code(tree)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(_TEXT, min_size=1, max_size=6, unique=True),
    versions=st.lists(_TEXT, min_size=1, max_size=6),
    pool=st.none() | _TEXT,
    target=_TEXT,
    command=_TEXT,
    prefix=st.none() | _TEXT,
    data=st.data(),
)
def test_unsafe_strings_cannot_inject_code(
    names: list[str],
    versions: list[str],
    pool: str | None,
    target: str,
    command: str,
    prefix: str | None,
    data: st.DataObject,
) -> None:
    step_ids = list(
        dict.fromkeys(f"{n}@{versions[i % len(versions)]}" for i, n in enumerate(names))
    )
    steps = []
    for i, sid in enumerate(step_ids):
        deps = tuple(data.draw(st.lists(st.sampled_from(step_ids[:i]), unique=True))) if i else ()
        steps.append(StepInfo(sid, f"{i:064x}", deps, retries=i % 3, pool=pool if i % 2 else None))
    tasks = plan_tasks(steps)
    options = DagOptions(dag_id="d", prefix=prefix, export_command=command, export_root="..")
    text = render_dag(target, tasks, options)
    tree, values = _structure(text)
    assert values["TARGET"] == target
    assert values["EXPORT_COMMAND"] == command
    assert values["DEFAULT_PREFIX"] == prefix
    assert values["DESCRIPTION"] == f"Marin pipeline {target}"
    assert values["GRAPH_DIGEST"] == graph_digest((s.step_id, s.fingerprint) for s in steps)
    by_task = {t.task_id: t for t in tasks}
    assert values["STEPS"] == {
        t.task_id: {
            "step": t.step_id,
            "fingerprint": t.fingerprint,
            "retries": t.retries,
            "pool": t.pool,
            "upstream": list(t.upstream),
        }
        for t in tasks
    }
    assert len(by_task) == len(step_ids)
    # The code part never contains user data: it is the same for every input.
    assert _code(tree) == _reference_with_block()
    # Non-data lines are exactly what a reference render has (comments cannot be injected).
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    reference = render_dag("x.py:p", [TaskEntry("a", "a@v0", "f" * 64)], DagOptions(dag_id="d"))
    ref_comments = [line for line in reference.splitlines() if line.lstrip().startswith("#")]
    assert [c for c in comments if c != "# ruff: noqa: E501"] == [
        c for c in ref_comments if c != "# ruff: noqa: E501"
    ]
    text.encode("utf-8")  # always writable as UTF-8 (lone surrogates are escaped)


def test_real_pipeline_with_quotes_braces_and_non_ascii_round_trips() -> None:
    from tests.airflow.airflow_pipelines import WEIRD_NAME

    result = build_export(TOY, str(HERE / "no-such-dags"))
    _, values = _structure(result.text)
    steps = values["STEPS"]
    assert isinstance(steps, dict)
    assert f"{WEIRD_NAME}@v1" in {s["step"] for s in steps.values()}
    for task_id in steps:
        assert AIRFLOW_KEY.match(task_id) and task_id.isascii()


# --- task ids --------------------------------------------------------------------------------


def test_task_ids_are_readable() -> None:
    ids = assign_task_ids(["ngram/tokens/shard-00@v1", "report@2026.11.29", "x/y@dev"])
    assert ids == {
        "ngram/tokens/shard-00@v1": "ngram.tokens.shard-00__v1",
        "report@2026.11.29": "report__2026.11.29",
        "x/y@dev": "x.y__dev",
    }


def test_colliding_task_ids_get_stable_hash_suffixes() -> None:
    ids = assign_task_ids(["a/b@v0", "a.b@v0", "c@v0"])
    assert ids["c@v0"] == "c__v0"
    assert ids["a/b@v0"] != ids["a.b@v0"]
    assert all(ids[s].startswith("a.b__v0_") for s in ("a/b@v0", "a.b@v0"))
    assert assign_task_ids(["c@v0", "a.b@v0", "a/b@v0"]) == ids  # order-independent


@settings(max_examples=200, deadline=None)
@given(st.lists(_TEXT.map(lambda s: f"{s}@v{len(s)}") | _TEXT, max_size=20))
def test_task_ids_valid_unique_and_order_independent(step_ids: list[str]) -> None:
    ids = assign_task_ids(step_ids)
    assert set(ids) == set(step_ids)
    assert len(set(ids.values())) == len(ids)
    for task_id in ids.values():
        assert AIRFLOW_KEY.match(task_id) and task_id.isascii() and len(task_id) <= 250
    assert assign_task_ids(list(reversed(step_ids))) == ids


def test_long_names_are_truncated_validly() -> None:
    long = "n" * 400 + "@v0"
    (task_id,) = assign_task_ids([long]).values()
    assert len(task_id) <= 250 and AIRFLOW_KEY.match(task_id)


def test_edges_and_order_follow_the_graph() -> None:
    steps = [
        StepInfo("c@v0", "3", ("a@v0", "b@v0")),
        StepInfo("b@v0", "2", ("a@v0",)),
        StepInfo("a@v0", "1"),
    ]
    tasks = plan_tasks(steps, default_retries=2)
    assert [t.task_id for t in tasks] == ["a__v0", "b__v0", "c__v0"]
    assert [t.upstream for t in tasks] == [(), ("a__v0",), ("a__v0", "b__v0")]
    assert [t.retries for t in tasks] == [2, 2, 2]


def test_order_takes_the_smallest_ready_task_id_each_time() -> None:
    """Not level by level: ``b`` is ready once ``a`` is placed and comes before ``c``."""
    steps = [StepInfo("c@v0", "3"), StepInfo("b@v0", "2", ("a@v0",)), StepInfo("a@v0", "1")]
    assert [t.task_id for t in plan_tasks(steps)] == ["a__v0", "b__v0", "c__v0"]


def test_a_dependency_cycle_is_an_export_error_naming_its_steps() -> None:
    steps = [
        StepInfo("a@v0", "1", ("c@v0",)),
        StepInfo("b@v0", "2", ("a@v0",)),
        StepInfo("c@v0", "3", ("b@v0",)),
        StepInfo("d@v0", "4"),
    ]
    with pytest.raises(ExportError, match=r"dependency cycle among steps a@v0, b@v0, c@v0"):
        plan_tasks(steps)


def test_default_dag_id() -> None:
    assert default_dag_id("examples/ngram.py:pipeline") == "ngram_pipeline"
    assert default_dag_id("pkg.mod:make.steps") == "mod_make_steps"


# --- targets ---------------------------------------------------------------------------------


def test_target_recorded_relative_and_resolved_back(tmp_path: Path) -> None:
    dags = tmp_path / "deploy" / "dags"
    ref = target_reference(EXAMPLE, str(dags))
    assert not os.path.isabs(ref.split(":")[0])
    assert resolve_target(ref, str(dags)) == EXAMPLE
    assert target_reference("pkg.mod:attr", str(dags)) == "pkg.mod:attr"
    assert resolve_target("pkg.mod:attr", str(dags)) == "pkg.mod:attr"


# --- CLI -------------------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="marin")
    sub = parser.add_subparsers(dest="command")
    export = sub.add_parser("export").add_subparsers(dest="engine")
    cli.register(export)
    return parser.parse_args(["export", *argv])


def test_cli_writes_then_check_passes_then_detects_staleness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dags"
    argv = ["airflow", TOY, "-o", str(out), "--max-concurrent", "3", "--retries", "1"]
    args = _parse(argv)
    assert args.func(args) == 0
    path = out / "airflow_pipelines_toy.py"
    text = path.read_text(encoding="utf-8")
    assert "MAX_CONCURRENT = 3" in text and '"retries": 1' in text
    mtime = path.stat().st_mtime_ns
    assert args.func(args) == 0  # unchanged bytes are not rewritten
    assert path.stat().st_mtime_ns == mtime
    check = _parse([*argv, "--check"])
    assert check.func(check) == 0
    capsys.readouterr()

    edited = text.replace(
        '"af/tuned@v1",\n        "fingerprint": "', '"af/tuned@v1",\n        "fingerprint": "0'
    )
    assert edited != text
    path.write_text(edited, encoding="utf-8")
    assert check.func(check) == 1
    err = capsys.readouterr().err
    assert "is stale" in err and "1 step(s) changed: af/tuned@v1" in err
    assert "af/tuned@v1: fingerprint" in err and "line(s) differ" in err
    assert "fix: run `" in err and "marin export airflow" in err

    path.unlink()
    assert check.func(check) == 1
    assert "does not exist" in capsys.readouterr().err


def test_cli_rejects_bad_input(tmp_path: Path) -> None:
    for argv, needle in (
        (
            ["airflow", TOY, "-o", str(tmp_path), "--dag-id", "bad id!"],
            "not a valid Airflow DAG id",
        ),
        (["airflow", TOY, "-o", str(tmp_path), "--schedule", "every day"], "is not a schedule"),
        (["airflow", "no-colon", "-o", str(tmp_path)], "target"),
    ):
        args = _parse(argv)
        with pytest.raises(ValueError, match=needle):
            args.func(args)
    # the options are checked once, by RunOptions (marin.run_flags), not by argparse
    args = _parse(["airflow", TOY, "-o", str(tmp_path), "--max-concurrent", "0"])
    from marin.execution.errors import OptionError

    with pytest.raises(OptionError, match="max_concurrent=0"):
        args.func(args)


def test_cli_options_reach_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = f"{HERE / 'airflow_pipelines.py'}:scheduling"
    args = _parse(
        ["airflow", target, "-o", str(tmp_path / "x.py"), "--dag-id", "sched",
         "--schedule", "0 3 * * *", "--prefix", "s3://bucket/p"]
    )  # fmt: skip
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "airflow pools set 'gpu '\"'\"'pool'\"'\"'' <slots>" in out  # shell-quoted pool hint
    _, values = _structure((tmp_path / "x.py").read_text(encoding="utf-8"))
    assert values["DAG_ID"] == "sched" and values["SCHEDULE"] == "0 3 * * *"
    assert values["DEFAULT_PREFIX"] == "s3://bucket/p"
    steps = values["STEPS"]
    assert isinstance(steps, dict)
    assert steps["sched.a__v1"]["retries"] == 3 and steps["sched.b__v1"]["pool"] == "gpu 'pool'"


def test_marin_cli_entry_point(tmp_path: Path) -> None:
    """``marin export airflow`` through the core CLI, once the entry point is installed."""
    from importlib.metadata import entry_points

    if not any(e.name == "airflow" for e in entry_points(group="marin.exporters")):
        pytest.skip("marin.exporters entry point 'airflow' not installed yet")
    proc = subprocess.run(
        [sys.executable, "-m", "marin.cli", "export", "airflow", EXAMPLE, "-o", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ngram_pipeline.py").exists()
    bad = subprocess.run(
        [sys.executable, "-m", "marin.cli", "export", "airflow", "nope.py:x", "-o", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("error:")


# --- runtime (called directly; the Airflow end-to-end tests are in test_airflow_runs.py) -----


def test_runtime_builds_then_caches_then_refuses_stale_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marin_airflow_log: pytest.LogCaptureFixture
) -> None:
    from tests.airflow.airflow_pipelines import CALLS_ENV, LR_ENV, read_calls

    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    monkeypatch.delenv(LR_ENV, raising=False)
    result = build_export(TOY, str(tmp_path / "dags"))
    write_export(result)
    root = next(t for t in result.tasks if t.step_id == "af/root@v1")
    kwargs = {
        "target": target_reference(TOY, str(tmp_path / "dags")),
        "step": root.step_id,
        "fingerprint": root.fingerprint,
        "dag_dir": str(tmp_path / "dags"),
        "export_command": result.command,
        "export_root": "..",
    }
    runtime.clear_cache()
    first = runtime.run_step(prefix=str(tmp_path / "p"), **kwargs)
    assert first["action"] == "built" and first["cached"] is False
    second = runtime.run_step(prefix=str(tmp_path / "p"), **kwargs)
    assert second["action"] == "cached" and second["cached"] is True
    assert [c["event"] for c in read_calls(str(calls))] == ["start", "end"]

    # The baked prefix default is used when no param and no $MARIN_PREFIX.
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    third = runtime.run_step(default_prefix=str(tmp_path / "p"), **kwargs)
    assert third["cached"] is True

    with pytest.raises(runtime.StaleDagError) as err:
        runtime.run_step(prefix=str(tmp_path / "p"), **{**kwargs, "fingerprint": "0" * 64})
    message = str(err.value)
    assert "DAG file is stale: " in message and "(step af/root@v1): re-run" in message
    assert "fingerprint" in message and result.command in message
    assert str(tmp_path) in message  # where to run it

    # A changed graph (a step added elsewhere) only warns, in the plan task, which lowers the
    # whole graph anyway: a step's task checks its own fingerprint and lowers only ancestors.
    digest = graph_digest((t.step_id, t.fingerprint) for t in result.tasks)
    plan_kwargs = {k: v for k, v in kwargs.items() if k not in ("step", "fingerprint")}
    runtime.plan_steps(prefix=str(tmp_path / "p"), graph_digest=digest, **plan_kwargs)
    assert "stale" not in marin_airflow_log.text
    runtime.plan_steps(prefix=str(tmp_path / "p"), graph_digest="0" * 16, **plan_kwargs)
    assert "the DAG file is stale: the pipeline's steps changed" in marin_airflow_log.text

    with pytest.raises(runtime.StaleDagError, match="no longer has a step af/gone@v1"):
        runtime.run_step(prefix=str(tmp_path / "p"), **{**kwargs, "step": "af/gone@v1"})


def test_runtime_lowers_once_per_process(tmp_path: Path) -> None:
    runtime.clear_cache()
    first = runtime.steps_for(TOY)
    assert runtime.steps_for(TOY) is first


def test_prefix_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARIN_PREFIX", "/env")
    assert runtime.choose_prefix("/param", "/baked") == "/param"
    assert runtime.choose_prefix(None, "/baked") == "/env"
    monkeypatch.delenv("MARIN_PREFIX")
    assert runtime.choose_prefix(None, "/baked") == "/baked"
    assert runtime.choose_prefix(None, None) is None


# --- edges at scale: Airflow's own parse and serialization -----------------------------------


def _random_steps(n: int, seed: int) -> list[StepInfo]:
    """A random DAG with fan-in and fan-out: each step depends on up to 3 earlier ones."""
    rng = random.Random(seed)
    steps = []
    for i in range(n):
        deps = {f"g/s{rng.randrange(i)}@v0" for _ in range(rng.randint(0, 3))} if i else set()
        steps.append(StepInfo(f"g/s{i}@v0", f"{i:064x}", tuple(sorted(deps))))
    return steps


def test_edges_equal_airflow_wiring_through_dagbag_and_serialization(tmp_path: Path) -> None:
    """The generated file wires edges without ``>>`` (which hashes the whole DAG per edge, so
    O(tasks x edges)); Airflow's ``DagBag`` must still see exactly the graph's edges, both ways,
    the same as ``>>`` gives, and they must survive ``DagSerialization``'s round trip (which
    stores only downstream ids), as the DAG processor stores the DAG."""
    pytest.importorskip("airflow.sdk")
    tasks = plan_tasks(_random_steps(400, seed=7))
    n_edges = sum(len(t.upstream) for t in tasks)
    assert n_edges > 500
    dags = tmp_path / "dags"
    dags.mkdir()
    path = dags / "edges.py"
    path.write_text(render_dag("x.py:p", tasks, DagOptions(dag_id="edges")), encoding="utf-8")
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(tmp_path / "home"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "edges_check.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("EDGES-JSON "))
    out = json.loads(line[len("EDGES-JSON ") :])
    assert out["tasks"] == len(tasks) + 1 == 401  # and marin-plan, upstream of every step
    expected_up = {t.task_id: sorted(["marin-plan", *t.upstream]) for t in tasks}
    expected_up["marin-plan"] = []
    expected_down: dict[str, list[str]] = {t.task_id: [] for t in tasks}
    expected_down["marin-plan"] = []
    for task_id, ups in expected_up.items():
        for u in ups:
            expected_down[u].append(task_id)
    assert out["parsed"] == {
        "upstream": expected_up,
        "downstream": {k: sorted(v) for k, v in expected_down.items()},
    }
    for key in ("parsed_round_trip", "reference", "reference_round_trip"):
        assert out[key] == out["parsed"], key
    assert out["roots"] == out["reference_roots"] and out["leaves"] == out["reference_leaves"]
    assert out["roots"] == ["marin-plan"]
    assert out["last_task"] == "marin-plan", "the plan task must be added last (cycle check)"
    # Linear: parsing hashes the DAG a constant number of times, `>>` at least once per edge.
    assert out["reference_dag_hash_calls"] >= n_edges
    assert out["dag_hash_calls"] <= 20, out["dag_hash_calls"]


def test_runtime_step_for_lowers_only_the_steps_ancestors() -> None:
    """A task builds one step: it must not lower the whole graph (a 10k-step DAG per task)."""
    from marin.execution.pipeline.graph import collect_steps
    from marin.execution.step_spec import StepSpec

    runtime.clear_cache()
    from marin_airflow.export import lower_target

    everything = {s.step_id: s for s in collect_steps(lower_target(TOY))}
    assert len(everything) >= 4
    # A step with ancestors but not the whole graph behind it.
    leafish = next(
        s for s in everything.values() if s.deps and len(collect_steps([s])) < len(everything)
    )
    spec = runtime.step_for(TOY, leafish.step_id)
    assert spec is not None and spec.fingerprint == leafish.fingerprint
    ancestors = {s.step_id for s in collect_steps([spec])}
    lowered = {v.step_id for v in runtime._memos[TOY].values() if isinstance(v, StepSpec)}
    assert lowered == ancestors and len(lowered) < len(everything)
    assert runtime.step_for(TOY, "af/none@v9") is None
    runtime.clear_cache()


WIDE = f"{HERE / 'airflow_pipelines.py'}:wide"


def _count_lowered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every step the real ``lower`` makes a spec of from now on, by step id."""
    from marin.execution.pipeline import lower as lazy

    real = lazy._spec_for
    made: list[str] = []

    def counting(handle: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(handle.step_id)
        return real(handle, *args, **kwargs)

    monkeypatch.setattr(lazy, "_spec_for", counting)
    return made


def test_run_step_lowers_only_the_steps_ancestors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task of a wide graph lowers its own step and its ancestors, never the whole graph:
    counted at the real ``lower``, the root's task makes 1 spec and a leaf's 2, of 41."""
    from tests.airflow.airflow_pipelines import WIDE_WIDTH

    made = _count_lowered(monkeypatch)
    dags = str(tmp_path / "dags")
    result = build_export(WIDE, dags)
    assert len(made) == len(result.tasks) == WIDE_WIDTH + 1  # the export lowers everything
    fingerprints = {t.step_id: t.fingerprint for t in result.tasks}

    def run(step: str) -> dict[str, Any]:
        return runtime.run_step(
            target=target_reference(WIDE, dags),
            step=step,
            fingerprint=fingerprints[step],
            dag_dir=dags,
            prefix=str(tmp_path / "p"),
        )

    runtime.clear_cache()
    made.clear()
    assert run("wide/root@v1")["action"] == "built"
    assert made == ["wide/root@v1"]

    runtime.clear_cache()  # a fresh worker process
    made.clear()
    assert run("wide/leaf-7@v1")["action"] == "built"
    assert sorted(made) == ["wide/leaf-7@v1", "wide/root@v1"]
    made.clear()  # a second task in the same process shares the lowered root
    assert run("wide/leaf-8@v1")["action"] == "built"
    assert made == ["wide/leaf-8@v1"]

    # A stale DAG file is still caught per step, with the step and the fix named.
    with pytest.raises(runtime.StaleDagError, match=r"stale: .*\(step wide/leaf-9@v1\): re-run"):
        runtime.run_step(
            target=target_reference(WIDE, dags),
            step="wide/leaf-9@v1",
            fingerprint=fingerprints["wide/leaf-8@v1"],
            dag_dir=dags,
            export_command=result.command,
        )
    runtime.clear_cache()


def test_run_step_force_outside_a_dag_run_checks_names_without_lowering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the plan task's XCom, ``force`` names are checked against the whole pipeline's
    handles (an unknown name fails; a step outside the ancestors is valid but not this step's
    business), and still only the ancestors are lowered; a forced step rebuilds."""
    from marin.execution.errors import InvalidStepError

    dags = str(tmp_path / "dags")
    result = build_export(WIDE, dags)
    fingerprints = {t.step_id: t.fingerprint for t in result.tasks}
    params: dict[str, Any] = {}
    monkeypatch.setattr(runtime, "_airflow_context", lambda: {"params": params})

    def run(step: str = "wide/leaf-1@v1") -> str:
        out = runtime.run_step(
            target=target_reference(WIDE, dags),
            step=step,
            fingerprint=fingerprints[step],
            dag_dir=dags,
            prefix=str(tmp_path / "p"),
        )
        return str(out["action"])

    assert run("wide/root@v1") == "built"
    runtime.clear_cache()
    made = _count_lowered(monkeypatch)
    assert run() == "built"
    params["force"] = ["wide/leaf-2"]  # another branch: valid, and leaf-1 is not forced
    assert run() == "cached"
    params["force"] = ["wide/leaf-1@v1"]
    assert run() == "built"
    params["force"] = ["wide/nope"]
    with pytest.raises(InvalidStepError, match="--force names no step in this pipeline"):
        run()
    assert sorted(set(made)) == ["wide/leaf-1@v1", "wide/root@v1"]
    runtime.clear_cache()
