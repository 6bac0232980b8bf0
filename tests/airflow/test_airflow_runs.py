"""Exported DAGs under real Airflow 3: DagBag parsing, ``airflow dags test``, a real scheduler.

All Airflow commands run in subprocesses against one migrated SQLite ``AIRFLOW_HOME`` per
session (see ``conftest.py``); the scheduler test copies that database into its own home.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marin_airflow.export import build_export, write_export
from tests.airflow.airflow_pipelines import (
    CALLS_ENV,
    FAIL_ENV,
    FANOUT_WIDTH,
    LR_ENV,
    WEIRD_NAME,
    read_calls,
)

pytest.importorskip("airflow.sdk")

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EXAMPLE = f"{ROOT / 'examples' / 'ngram.py'}:pipeline"
PIPELINES = HERE / "airflow_pipelines.py"
EXAMPLE_DAG = "ngram_pipeline"


def _export(name: str, dags: Path, **options: Any) -> Any:
    result = build_export(f"{PIPELINES}:{name}", str(dags), **options)
    write_export(result)
    return result


def _dagbag(sandbox: Any, *folders: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "dagbag_dump.py"), *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=120,
        env=sandbox.env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("DAGBAG-JSON "))
    return dict(json.loads(line[len("DAGBAG-JSON ") :]))


def _events(calls: list[dict[str, Any]], event: str) -> dict[str, float]:
    return {c["step"]: c["t"] for c in calls if c["event"] == event}


def _record(prefix: Path, output_path: str) -> dict[str, Any]:
    with open(prefix / f"{output_path}.marin" / "record.json") as f:
        return dict(json.load(f))


def _status(prefix: Path, output_path: str) -> str:
    """The step's state as Marin's readers see it (lease, status file, record)."""
    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import read_status

    return str((read_status(open_prefix(str(prefix)), output_path) or {}).get("state"))


def _launched(sandbox: Any, dag_id: str) -> list[str]:
    """The task ids of the latest run that had a process (a task skipped before it was
    queued never has one)."""
    rows = sandbox.query(
        "SELECT task_id FROM task_instance WHERE dag_id = ? AND run_id = ? AND pid IS NOT NULL",
        (dag_id, sandbox.latest_run_id(dag_id)),
    )
    return sorted(str(r[0]) for r in rows)


def _fail_msg(proc: subprocess.CompletedProcess[str]) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-3000:]}"


# --- parsing ---------------------------------------------------------------------------------


def test_dagbag_parses_committed_and_exported_dags(tmp_path: Path, sandbox: Any) -> None:
    """Airflow's own DagBag: no import errors, exact tasks/edges/limits, no pipeline import."""
    dags = tmp_path / "dags"
    toy = _export("toy", dags, max_concurrent=3)
    sched = _export("scheduling", dags, retries=1, schedule="@daily")
    bag = _dagbag(sandbox, ROOT / "dags", dags)
    assert bag["import_errors"] == {}
    assert bag["pipeline_modules"] == [], "parsing a DAG file imported the pipeline"

    example = bag["dags"][EXAMPLE_DAG]
    assert example["max_active_tasks"] == 8 and example["max_active_runs"] == 1
    assert example["schedule"] is None
    assert example["params"] == {
        "prefix": None,
        "on_drift": "warn",
        "on_code_drift": "warn",
        "force": [],
        "cascade": True,
        "keep_going": False,
    }
    tasks = example["tasks"]
    # Tasks read the params from their DAG at run time; a per-task copy is what made a
    # 10,000-step file slow to parse (Airflow deep-copies the DAG's params into each operator
    # made inside `with dag:`).
    assert {(t["operator"], t["own_params"]) for t in tasks.values()} == {
        ("MarinOperator", 0),
        ("MarinPlanOperator", 0),
    }
    assert tasks["marin-plan"]["operator"] == "MarinPlanOperator"
    from marin_airflow.export import lower_target, step_infos

    specs = step_infos(lower_target(EXAMPLE))
    assert len(tasks) == len(specs) + 1 == 12  # the steps and marin-plan, which runs first
    assert tasks["marin-plan"]["upstream"] == []
    by_step = {t["display"]: (tid, t) for tid, t in tasks.items() if tid != "marin-plan"}
    ids = {s.step_id: by_step[s.step_id][0] for s in specs}
    for s in specs:  # edges: the lowered StepSpec graph, and the plan task, which may skip any
        upstream = sorted(["marin-plan", *(ids[d] for d in set(s.deps))])
        assert by_step[s.step_id][1]["upstream"] == upstream, s.step_id
        # A skipped (served) upstream must not skip a step that builds; a failed one blocks it.
        assert by_step[s.step_id][1]["trigger_rule"] == "none_failed"
    assert tasks["ngram.report__v1"]["upstream"] == [
        "marin-plan",
        "ngram.eval.bigram-add-k__v1",
        "ngram.eval.trigram-interpolated__v1",
    ]

    toy_dag = bag["dags"][toy.dag_id]
    assert toy_dag["max_active_tasks"] == 3
    weird = next(t for t in toy_dag["tasks"].values() if t["display"] == f"{WEIRD_NAME}@v1")
    assert weird["upstream"] == ["af.root__v1", "marin-plan"]
    assert toy_dag["tasks"]["af.root__v1"]["upstream"] == ["marin-plan"]

    sched_dag = bag["dags"][sched.dag_id]
    assert sched_dag["schedule"] is not None
    s_tasks = sched_dag["tasks"]
    assert s_tasks["sched.a__v1"]["retries"] == 3  # the step's own retries win
    assert s_tasks["sched.c__v1"]["retries"] == 1  # --retries for the others
    assert s_tasks["sched.b__v1"]["pool"] == "gpu 'pool'"
    assert s_tasks["sched.a__v1"]["pool"] == "default_pool"
    assert s_tasks["sched.c__v1"]["upstream"] == ["marin-plan", "sched.a__v1", "sched.b__v1"]


# --- airflow dags test -------------------------------------------------------------------------


@pytest.mark.slow
def test_example_dag_matches_local_run_and_reruns_cached(tmp_path: Path, sandbox: Any) -> None:
    """The committed example DAG under ``airflow dags test``: same artifacts as ``marin run``;
    a second run launches no step task (the plan task skips every one, listing them as
    cached); a third, forcing one step, runs only it and what was made from it, although
    their other upstream tasks end skipped."""
    from marin.execution.lazy import run
    from marin.execution.pipeline.targets import load_target

    af_prefix, local_prefix = tmp_path / "airflow-prefix", tmp_path / "local-prefix"
    # The prefix comes from the run's `prefix` param; $MARIN_PREFIX must not win over it.
    env = {"MARIN_PREFIX": str(tmp_path / "wrong-prefix")}
    proc = sandbox.dags_test(
        EXAMPLE_DAG, str(ROOT / "dags"), conf={"prefix": str(af_prefix)}, env=env
    )
    assert proc.returncode == 0, _fail_msg(proc)
    assert not (tmp_path / "wrong-prefix").exists()
    states = sandbox.task_states(EXAMPLE_DAG)
    assert len(states) == 12 and set(states.values()) == {"success"}, states
    assert set(sandbox.xcoms(EXAMPLE_DAG, "action").values()) == {"built"}

    run(load_target(EXAMPLE), prefix=str(local_prefix))
    from marin_airflow.export import assign_task_ids, lower_target

    specs = lower_target(EXAMPLE)
    assert len(specs) == 11
    for spec in specs:
        a, b = _record(af_prefix, spec.output_path), _record(local_prefix, spec.output_path)
        assert a["fingerprint"] == b["fingerprint"] == spec.fingerprint
        assert _status(af_prefix, spec.output_path) == "SUCCESS"
        for key in ("provenance", "started_at", "finished_at", "duration_s", "build_id"):
            a.pop(key), b.pop(key)
        assert (
            sorted(a.pop("inputs"))
            == sorted(b.pop("inputs"))
            == sorted(d.step_id for d in spec.deps)
        )
        normalised = json.loads(json.dumps(a).replace(str(af_prefix), str(local_prefix)))
        assert normalised == b, spec.step_id
        assert a["output_path"] == str(af_prefix / spec.output_path)
        # The artifacts themselves are byte-identical.
        out_a, out_b = af_prefix / spec.output_path, local_prefix / spec.output_path
        files_a = sorted(p.relative_to(out_a) for p in out_a.rglob("*") if p.is_file()) or [Path()]
        files_b = sorted(p.relative_to(out_b) for p in out_b.rglob("*") if p.is_file()) or [Path()]
        assert files_a == files_b
        for rel in files_a:
            assert (out_a / rel).read_bytes() == (out_b / rel).read_bytes(), (spec.step_id, rel)

    snapshot = {
        p: p.stat().st_mtime_ns
        for p in af_prefix.rglob("*")
        if p.is_file() and "lease" not in p.name
    }
    again = sandbox.dags_test(EXAMPLE_DAG, str(ROOT / "dags"), conf={"prefix": str(af_prefix)})
    assert again.returncode == 0, _fail_msg(again)
    states = sandbox.task_states(EXAMPLE_DAG)
    assert states.pop("marin-plan") == "success"
    assert len(states) == 11 and set(states.values()) == {"skipped"}, states
    assert _launched(sandbox, EXAMPLE_DAG) == ["marin-plan"], "a cached step's task was launched"
    assert sorted(sandbox.xcoms(EXAMPLE_DAG, "skip")["marin-plan"]) == sorted(
        s.step_id for s in specs
    )
    assert sandbox.xcoms(EXAMPLE_DAG, "build") == {"marin-plan": []}
    assert sandbox.xcoms(EXAMPLE_DAG, "action") == {}, "a step task ran"
    assert "cached: already built at" not in again.stdout
    out = again.stdout + again.stderr
    assert "11 step(s) cached (served), their tasks skipped without a launch" in out
    after = {p: p.stat().st_mtime_ns for p in snapshot}
    assert after == snapshot, "a cached run rewrote artifacts or records"

    # Forcing the bigram model runs it, its eval and the report. The report's other upstream
    # (the trigram eval) is skipped, served: that must not skip the report.
    forced = sandbox.dags_test(
        EXAMPLE_DAG,
        str(ROOT / "dags"),
        conf={"prefix": str(af_prefix), "force": ["ngram/models/bigram-add-k"]},
    )
    assert forced.returncode == 0, _fail_msg(forced)
    rebuilt = ["ngram/eval/bigram-add-k@v1", "ngram/models/bigram-add-k@v1", "ngram/report@v1"]
    states = sandbox.task_states(EXAMPLE_DAG)
    by_id = assign_task_ids(s.step_id for s in specs)
    for step_id, task_id in by_id.items():
        assert states[task_id] == ("success" if step_id in rebuilt else "skipped"), step_id
    assert sorted(sandbox.xcoms(EXAMPLE_DAG, "build")["marin-plan"]) == rebuilt
    # Their tasks ran. What read the forced model is rebuilt whatever its new bytes (forcing
    # repairs, issue 43); the eval's new output is byte for byte the old one, so the report
    # finds it unchanged at task time and is served (early cutoff, as with marin run).
    actions = sandbox.xcoms(EXAMPLE_DAG, "action")
    assert actions == {
        by_id["ngram/models/bigram-add-k@v1"]: "built",
        by_id["ngram/eval/bigram-add-k@v1"]: "built",
        by_id["ngram/report@v1"]: "cached",
    }, actions
    assert sorted(_launched(sandbox, EXAMPLE_DAG)) == sorted(
        ["marin-plan", *(by_id[s] for s in rebuilt)]
    )


@pytest.mark.slow
def test_failure_stale_dag_and_cache_with_call_counts(
    tmp_path: Path, sandbox: Any, calls: Path
) -> None:
    """Run 1: a step raises -> its task fails and its dependents never start (keep_going: the
    independent branches still build; fail-fast is covered by the conformance suite).
    Run 2: a config changed without re-export -> that task fails as stale; built steps are
    cached and their ``fn`` is never called; the step that failed before builds now."""
    dags, prefix = tmp_path / "dags", tmp_path / "prefix"
    env = {CALLS_ENV: str(calls), LR_ENV: "0.1"}
    result = _export("toy", dags)
    ids = {t.step_id: t.task_id for t in result.tasks}

    first = sandbox.dags_test(
        result.dag_id,
        str(dags),
        env={**env, FAIL_ENV: "bad", "MARIN_PREFIX": str(prefix)},
        conf={"keep_going": True},
    )
    assert first.returncode != 0, _fail_msg(first)
    states = sandbox.task_states(result.dag_id)
    assert states[ids["af/bad@v1"]] == "failed"
    assert states[ids["af/after-bad@v1"]] == "upstream_failed"
    for ok in ("af/root@v1", f"{WEIRD_NAME}@v1", "af/tuned@v1", "af/after-tuned@v1"):
        assert states[ids[ok]] == "success", (ok, states)
    run1 = read_calls(str(calls))
    assert set(_events(run1, "fail")) == {"bad"}
    assert "after-bad" not in _events(run1, "start")
    assert set(_events(run1, "end")) == {"root", "weird", "tuned", "after-tuned"}
    assert _status(prefix, "af/bad/v1") == "FAILED"
    assert not (prefix / "af/bad/v1.marin/record.json").exists()
    # The weird name went through Airflow untemplated: its record carries it verbatim.
    assert _record(prefix, f"{WEIRD_NAME}/v1")["name"] == WEIRD_NAME

    calls.unlink()
    second = sandbox.dags_test(
        result.dag_id,
        str(dags),
        env={**env, LR_ENV: "0.2"},
        conf={"prefix": str(prefix), "keep_going": True},
    )
    assert second.returncode != 0, _fail_msg(second)
    states = sandbox.task_states(result.dag_id)
    assert states[ids["af/tuned@v1"]] == "failed"
    assert states[ids["af/after-tuned@v1"]] == "upstream_failed"
    for ok in ("af/bad@v1", "af/after-bad@v1"):
        assert states[ids[ok]] == "success", (ok, states)
    for served in ("af/root@v1", f"{WEIRD_NAME}@v1"):  # cached: skipped by the plan task
        assert states[ids[served]] == "skipped", (served, states)
    out = second.stdout + second.stderr
    assert "error: the DAG file is stale: field fingerprint is" in out
    assert "(step af/tuned@v1): re-run" in out
    assert f"re-run `{result.command}`" in out
    run2 = read_calls(str(calls))
    assert sorted(_events(run2, "start")) == ["after-bad", "bad"], "a cached or stale fn ran"
    actions = sandbox.xcoms(result.dag_id, "action")
    assert ids["af/root@v1"] not in actions and ids[f"{WEIRD_NAME}@v1"] not in actions
    # The plan serves tuned (its record is there, its config drifted: warn), but the DAG file
    # is stale for it: its task runs, to fail, and its dependent is blocked, not skipped.
    assert sorted(sandbox.xcoms(result.dag_id, "skip")["marin-plan"]) == sorted(
        ["af/root@v1", f"{WEIRD_NAME}@v1", "af/tuned@v1", "af/after-tuned@v1"]
    )
    assert sandbox.xcoms(result.dag_id, "stale") == {"marin-plan": ["af/tuned@v1"]}
    assert actions[ids["af/bad@v1"]] == "built"


@pytest.mark.slow
def test_a_served_step_below_a_failed_one_is_blocked_not_skipped(
    tmp_path: Path, sandbox: Any, calls: Path
) -> None:
    """``cascade`` off, the root forced and failing: the plan serves every step below it, but
    their tasks are not skipped: each ends ``upstream_failed``, and the DAG run fails (skipped
    leaves below a failed step would make it end "success"). The steps beside stay skipped."""
    dags, prefix = tmp_path / "dags", tmp_path / "prefix"
    env = {CALLS_ENV: str(calls), LR_ENV: "0.1"}
    result = _export("toy", dags)
    ids = {t.step_id: t.task_id for t in result.tasks}
    first = sandbox.dags_test(result.dag_id, str(dags), env=env, conf={"prefix": str(prefix)})
    assert first.returncode == 0, _fail_msg(first)
    second = sandbox.dags_test(
        result.dag_id,
        str(dags),
        env={**env, FAIL_ENV: "bad"},
        conf={"prefix": str(prefix), "force": ["af/bad"], "cascade": False},
    )
    assert second.returncode != 0, _fail_msg(second)
    states = sandbox.task_states(result.dag_id)
    assert sandbox.xcoms(result.dag_id, "build") == {"marin-plan": ["af/bad@v1"]}
    assert "af/after-bad@v1" in sandbox.xcoms(result.dag_id, "skip")["marin-plan"]
    assert states[ids["af/bad@v1"]] == "failed"
    assert states[ids["af/after-bad@v1"]] == "upstream_failed"
    for served in ("af/root@v1", f"{WEIRD_NAME}@v1", "af/tuned@v1", "af/after-tuned@v1"):
        assert states[ids[served]] == "skipped", (served, states)
    assert _launched(sandbox, result.dag_id) == sorted(["marin-plan", ids["af/bad@v1"]])


# --- a real scheduler ----------------------------------------------------------------------------


@pytest.mark.slow
def test_scheduler_respects_max_active_tasks_and_dependencies(
    tmp_path: Path, sandbox: Any, calls: Path
) -> None:
    """A real Airflow on loopback (api-server, scheduler with LocalExecutor, DAG processor, each
    started on its own; see ``AirflowServices``) runs two DAGs at once: a wide fan-out, which
    reaches exactly ``max_active_tasks`` concurrent steps and never more, in dependency order;
    and the committed example DAG, which builds every step of the pipeline with the
    fingerprints of a local lowering."""
    from marin_airflow.export import lower_target
    from marin_testing.airflow import AirflowSandbox, AirflowServices, session_members

    limit = 3
    root = tmp_path / "services"
    box = AirflowSandbox(str(root), pythonpath=[str(ROOT)])
    dags, prefix = root / "dags", tmp_path / "prefix"
    fan = _export("fanout", dags, max_concurrent=limit)
    # The committed DAG file, deployed with the pipeline at the same relative path.
    (root / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "ngram.py", root / "examples" / "ngram.py")
    shutil.copy(ROOT / "dags" / f"{EXAMPLE_DAG}.py", dags / f"{EXAMPLE_DAG}.py")
    services = AirflowServices(
        box,
        str(dags),
        # The workers' prefix: neither DAG bakes one in.
        env={CALLS_ENV: str(calls), "MARIN_PREFIX": str(prefix)},
        parallelism=16,
    )
    dag_ids = [fan.dag_id, EXAMPLE_DAG]
    with services:
        sessions = [p.pid for p in services._procs.values()]
        services.wait_for_dags(dag_ids)
        runs = {dag_id: services.trigger(dag_id) for dag_id in dag_ids}
        states = {d: services.wait_for_run(d, run_id) for d, run_id in runs.items()}
        assert states == {d: "success" for d in dag_ids}, services.log_tail(6000)
    assert all(not session_members(sid) for sid in sessions), "a component outlived stop()"

    got = read_calls(str(calls))
    starts, ends = _events(got, "start"), _events(got, "end")
    leaves = [f"leaf-{i}" for i in range(FANOUT_WIDTH)]
    assert set(ends) == {"root", "sink", *leaves}
    assert all(ends["root"] <= starts[leaf] for leaf in leaves)
    assert starts["sink"] >= max(ends[leaf] for leaf in leaves)
    timeline = sorted((c["t"], 1 if c["event"] == "start" else -1) for c in got)
    running = peak = 0
    for _, delta in timeline:
        running += delta
        peak = max(peak, running)
    assert peak == limit, f"peak concurrency {peak}, max_active_tasks {limit}"
    assert len({c["pid"] for c in got if c["step"] in leaves}) > 1  # real worker processes

    for spec in lower_target(EXAMPLE):  # the example pipeline, built by the scheduler
        assert _record(prefix, spec.output_path)["fingerprint"] == spec.fingerprint
        assert _status(prefix, spec.output_path) == "SUCCESS"
