"""Issue 25 end to end, on local disk, memory:// and S3: code drift and early cutoff.

Each version of a pipeline's code is a file of its own (``tests/test_code_digest.Project``), as
a user's edit is: the records a run leaves are checked against the code of the next version.
The CLI, the Airflow plan task and the Prefect flow are run on the same files.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from marin.execution.digest.code import clear_cache
from marin.execution.errors import CodeDriftError
from marin.execution.lazy import lower
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.plan_view import plan_table
from marin.progress import served_with_warning_lines
from tests.test_code_digest import Project

from .conftest import REPO, child_env

HELPERS = """\
def tokenize(text):
    words = text.split()
    return [w.lower() for w in words]
"""

PIPELINE = """\
import fsspec
from marin.execution.lazy import OUT, apply
from {helpers} import tokenize

CALLS = []


def make_dataset(text, out_path):
    CALLS.append("dataset")
    with fsspec.open(out_path + "/tokens.txt", "w", auto_mkdir=True) as f:
        f.write(" ".join(tokenize(text)))


def train(data, out_path):
    CALLS.append("model")
    with fsspec.open(data + "/tokens.txt", "r") as f:
        count = len(f.read().split())
    with fsspec.open(out_path + "/model.txt", "w", auto_mkdir=True) as f:
        f.write(str(count))


def evaluate(model, out_path):
    CALLS.append("eval")
    with fsspec.open(model + "/model.txt", "r") as f:
        score = f.read()
    with fsspec.open(out_path + "/score.txt", "w", auto_mkdir=True) as f:
        f.write(score)


def pipeline(text="A b C d"):
    dataset = apply("ngram/dataset", make_dataset, version="v1", text=text, out_path=OUT)
    model = apply("ngram/model", train, version="v1", data=dataset, out_path=OUT)
    return apply("ngram/eval", evaluate, version="v1", model=model, out_path=OUT)
"""


def load(project: Project, helpers: str = HELPERS, pipeline: str = PIPELINE) -> Any:
    return project.load(helpers=helpers, pipe=pipeline)["pipe"]


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path / "code")


def run_steps(module: Any, prefix: str, force: tuple[str, ...] = (), **options: Any) -> Any:
    module.CALLS.clear()
    report = StepRunner(RunOptions(force=force, **options), prefix=prefix).run(
        lower(module.pipeline())
    )
    return list(module.CALLS), report


def plan_of(module: Any, prefix: str, **options: Any) -> dict[str, Any]:
    force = options.pop("force", ())
    plan, _ = StepRunner(RunOptions(force=force, **options), prefix=prefix).plan(
        lower(module.pipeline())
    )
    return {d.spec.name.split("/")[-1]: d for d in plan.decisions.values()}


# --- code drift ---------------------------------------------------------------------------------


def test_a_comment_only_edit_is_not_code_drift(store_prefix: str, project: Project) -> None:
    first = load(project)
    run_steps(first, store_prefix)
    edited = load(
        project,
        helpers="def tokenize(text):\n    # a comment (a docstring is code: red team r24-2)\n"
        "    words = text.split(  )\n    return [w.lower()\n            for w in words]\n",
    )
    plan = plan_of(edited, store_prefix)
    assert {n: d.action for n, d in plan.items()} == {
        "dataset": "skip",
        "model": "skip",
        "eval": "skip",
    }
    assert all(d.code_drift == () for d in plan.values())
    ran, _ = run_steps(edited, store_prefix, on_code_drift="error")
    assert ran == []


def test_a_changed_constant_in_a_helper_is_drift_naming_the_helper(
    store_prefix: str, project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    first = load(project)
    run_steps(first, store_prefix)
    edited = load(project, helpers=HELPERS.replace("text.split()", "text.split()[:3]"))
    plan = plan_of(edited, store_prefix)
    helper_file = str(Path(project.root) / f"v{project.count}" / "helpers.py")
    line = f"code: tokenize changed ({helper_file}, line 2), called by make_dataset"
    assert plan["dataset"].code_drift == (line,)
    assert plan["model"].code_drift == () and plan["eval"].code_drift == ()
    # `marin plan`'s table shows it under the step's reason, as it shows config drift.
    whole, location = StepRunner(prefix=store_prefix).plan(lower(edited.pipeline()))
    assert "code: tokenize changed" in plan_table(whole, location, width=400)
    # warn (the default): served, with the warning naming what changed.
    with caplog.at_level(logging.WARNING, logger="marin"):
        ran, report = run_steps(edited, store_prefix)
    assert ran == []
    assert "code drift ngram/dataset@v1" in caplog.text and line in caplog.text
    assert served_with_warning_lines(report) == [  # repeated where `marin run` ends
        "warning: 1 step(s) served although their code changed since they were built (first: "
        "ngram/dataset@v1); `marin plan` names what changed, --on-code-drift rebuild rebuilds "
        "them in place"
    ]
    # rebuild: in place, at the same path, and what read it is rebuilt as its output changed.
    assert plan_of(edited, store_prefix, on_code_drift="rebuild")["dataset"].reason == (
        "code changed: rebuilding (on_code_drift=rebuild)"
    )
    ran, _ = run_steps(edited, store_prefix, on_code_drift="rebuild")
    assert ran == ["dataset", "model", "eval"]
    record = read_record(open_prefix(store_prefix), "ngram/dataset/v1")
    assert record is not None and record.code.digest is not None
    assert plan_of(edited, store_prefix)["dataset"].code_drift == ()  # the record is current


def test_code_drift_under_error_stops_the_run_before_anything_runs(
    store_prefix: str, project: Project
) -> None:
    first = load(project)
    run_steps(first, store_prefix)
    edited = load(project, helpers=HELPERS.replace("w.lower()", "w.upper()"))
    with pytest.raises(
        CodeDriftError, match=r"code changed since the step was built: code: tokenize changed"
    ):
        run_steps(edited, store_prefix, on_code_drift="error")
    assert edited.CALLS == []
    # Every step whose code changed is named in the one error (the plan finds them all).
    both_drift = HELPERS.replace("w.lower()", "w.upper()")
    both = load(
        project, helpers=both_drift, pipeline=PIPELINE.replace("count = len(", "count = 1 + len(")
    )
    with pytest.raises(
        CodeDriftError,
        match=r"2 steps' code changed since they were built \[ngram/dataset@v1: .*; ngram/model@v1: .*code: train changed",
    ):
        run_steps(both, store_prefix, on_code_drift="error")
    # Config drift keeps its own policy: --on-drift error does not stop on code drift.
    ran, _ = run_steps(edited, store_prefix, on_drift="error")
    assert ran == []


CLI_PIPELINE = PIPELINE.replace("from {helpers} import tokenize\n", "") + "\n\n" + HELPERS


@pytest.mark.parametrize("backend", ["local", "s3"])  # memory:// lives in one process only
def test_the_cli_exits_1_on_code_drift_under_error_and_says_what_changed(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store_prefix = str(tmp_path / "prefix")
    if backend == "s3":
        request.getfixturevalue("s3_server")
        store_prefix = f"s3://marin-tests/cli-{uuid.uuid4().hex[:10]}"
    path = tmp_path / "cli_pipe.py"
    path.write_text(CLI_PIPELINE)
    env = child_env()
    target = f"{path}:pipeline"

    def marin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "marin.cli", *args, "--prefix", store_prefix],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    assert marin("run", target).returncode == 0
    path.write_text(CLI_PIPELINE.replace("w.lower()", "w.upper()"))
    plan = marin("plan", target, "--json")
    assert plan.returncode == 0, plan.stderr
    steps = {s["step"]: s for s in json.loads(plan.stdout)["steps"]}
    drift = steps["ngram/dataset@v1"]["code_drift"]
    # The file as the CLI imported it: relative to the folder it put on sys.path.
    assert drift == ["code: tokenize changed (cli_pipe.py, line 37), called by make_dataset"]
    assert json.loads(plan.stdout)["summary"]["code_drift"] == 1
    # Issue 49: advisory code drift alone is no CI failure (a run would build nothing); it is
    # where the run would rebuild it.
    assert marin("plan", target, "--exit-code").returncode == 0
    assert marin("plan", target, "--exit-code", "--on-code-drift", "rebuild").returncode == 1
    records = {
        p: (
            open_prefix(store_prefix).read_file(
                open_prefix(store_prefix).path(p + ".marin/record.json")
            )
        )
        for p in ("ngram/dataset/v1", "ngram/model/v1", "ngram/eval/v1")
    }
    failed = marin("run", target, "--on-code-drift", "error")
    assert failed.returncode == 1
    assert "code changed since the step was built" in failed.stderr
    assert "code: tokenize changed" in failed.stderr and "--on-code-drift" in failed.stderr
    location = open_prefix(store_prefix)
    for p, raw in records.items():  # nothing ran: every record is as it was
        assert location.read_file(location.path(p + ".marin/record.json")) == raw


# --- early cutoff -------------------------------------------------------------------------------


ALL = ("ngram/dataset", "ngram/model", "ngram/eval")
SAME_TOKENS = HELPERS.replace(
    "    words = text.split()\n    return [w.lower() for w in words]",
    "    return [word.lower() for word in text.split()]",
)


def settled(module: Any, prefix: str) -> None:
    """Built, then rebuilt: every record has an output digest (memory:// digests rebuilds only),
    and each one replaced was checked against the bytes it left."""
    run_steps(module, prefix)
    run_steps(module, prefix, force=ALL)


def test_a_harmless_rebuild_serves_its_readers(store_prefix: str, project: Project) -> None:
    settled(load(project), store_prefix)
    location = open_prefix(store_prefix)
    before = {p: read_record(location, p) for p in ("ngram/model/v1", "ngram/eval/v1")}
    module = load(project, helpers=SAME_TOKENS)  # code drift: the same tokens, written anew
    plan = plan_of(module, store_prefix, on_code_drift="rebuild")
    assert plan["dataset"].action == "build" and plan["model"].action == "build"
    assert plan["model"].unless_unchanged == ("ngram/dataset@v1",)
    ran, report = run_steps(module, store_prefix, on_code_drift="rebuild")
    assert ran == ["dataset"]
    steps = {s["step"]: s for s in report.to_json()["steps"]}
    assert steps["ngram/model@v1"]["action"] == "unchanged"
    assert steps["ngram/model@v1"]["reason"].endswith(
        "upstream ngram/dataset@v1 rebuilt, output unchanged"
    )
    assert steps["ngram/eval@v1"]["action"] == "unchanged"
    for p, record in before.items():  # served: their records are untouched
        assert read_record(location, p) == record
    # Looked at later, the readers are current, not stale, and say why.
    later = plan_of(module, store_prefix)
    assert later["model"].action == "skip" and later["model"].unchanged == ("ngram/dataset@v1",)


def test_a_forced_rebuild_rebuilds_its_readers_and_cuts_off_below(
    store_prefix: str, project: Project
) -> None:
    """``--force`` repairs (issue 43): what read the forced step is rebuilt whatever its new
    bytes; the model's bytes come out the same, so the evaluation is served."""
    module = load(project)
    settled(module, store_prefix)
    plan = plan_of(module, store_prefix, force=("ngram/dataset",))
    assert plan["model"].action == "build" and plan["model"].unless_unchanged == ()
    assert plan["eval"].unless_unchanged == ("ngram/model@v1",)
    ran, report = run_steps(module, store_prefix, force=("ngram/dataset",))
    assert ran == ["dataset", "model"]
    steps = {s["step"]: s for s in report.to_json()["steps"]}
    assert steps["ngram/eval@v1"]["action"] == "unchanged"
    assert steps["ngram/eval@v1"]["reason"].endswith(
        "upstream ngram/model@v1 rebuilt, output unchanged"
    )


def test_one_byte_of_difference_cascades(store_prefix: str, project: Project) -> None:
    settled(load(project), store_prefix)
    changed = load(project, pipeline=PIPELINE.replace('" ".join(', '"  ".join('))
    ran, report = run_steps(changed, store_prefix, on_code_drift="rebuild")
    # The dataset's bytes changed (one more space), the model's count did not: the model is
    # rebuilt, and the evaluation, which read only the model, is cut off there.
    assert ran == ["dataset", "model"]
    steps = {s["step"]: s["action"] for s in report.to_json()["steps"]}
    assert steps == {
        "ngram/dataset@v1": "built",
        "ngram/model@v1": "built",
        "ngram/eval@v1": "unchanged",
    }


def test_records_from_before_this_digest_scheme_give_no_cutoff_once(
    tmp_path: Path, project: Project
) -> None:
    """Old records carry no digest, or one of the older scheme (``tree1``, files only): what
    they consumed cannot be proven unchanged, so the first rebuild cascades (a missed cutoff,
    never a wrong one); the records it writes make the next rebuild cut off."""
    prefix = str(tmp_path / "p")
    module = load(project)
    run_steps(module, prefix)
    for step, older in (
        ("ngram/dataset/v1", True),
        ("ngram/model/v1", False),
        ("ngram/eval/v1", True),
    ):
        path = Path(prefix) / f"{step}.marin" / "record.json"
        data = json.loads(path.read_text())
        if older:
            data["output"]["digest"] = "tree1:" + "0" * 64
            data["input_digests"] = {k: "tree1:" + "0" * 64 for k in data["input_digests"]}
        else:
            for field in ("output", "input_digests", "replaced", "code"):
                data.pop(field, None)
        path.write_text(json.dumps(data))
    harmless = load(project, helpers=SAME_TOKENS)
    ran, _ = run_steps(harmless, prefix, on_code_drift="rebuild")
    assert ran == ["dataset", "model", "eval"]
    record = read_record(open_prefix(prefix), "ngram/dataset/v1")
    assert record is not None and record.replaced == {}
    ran, _ = run_steps(load(project), prefix, on_code_drift="rebuild")
    assert ran == ["dataset"]


# --- the engines --------------------------------------------------------------------------------


AIRFLOW_TOY = """\
import fsspec
from marin.execution.lazy import OUT, apply


def tokenize(text):
    return text.split()


def make(text, out_path):
    with fsspec.open(out_path + "/tokens.txt", "w", auto_mkdir=True) as f:
        f.write(" ".join(tokenize(text)))


pipeline = apply("af/data", make, version="v1", text="a b", out_path=OUT)
"""


def test_the_airflow_plan_task_reports_code_drift_and_fails_under_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("airflow")
    monkeypatch.chdir(tmp_path)  # the task's default prefix is relative to the working folder
    from marin_airflow import runtime
    from marin_airflow.contract import target_reference
    from marin_airflow.export import build_export, write_export

    code = tmp_path / "code"
    code.mkdir()
    path = code / "af_pipe.py"
    path.write_text(AIRFLOW_TOY)
    prefix = str(tmp_path / "p")
    dags = str(tmp_path / "dags")
    result = build_export(f"{path}:pipeline", dags, prefix=prefix)
    write_export(result)
    target = target_reference(f"{path}:pipeline", dags)
    monkeypatch.setattr(runtime, "_airflow_context", lambda: {"params": {}})
    task = result.tasks[0]
    runtime.run_step(target=target, step=task.step_id, fingerprint=task.fingerprint, dag_dir=dags)
    path.write_text(AIRFLOW_TOY.replace("text.split()", "text.split()[::-1]"))
    sys.modules.pop("marin_target_af_pipe", None)  # as a new worker process imports it
    runtime.clear_cache()
    clear_cache()
    planned = runtime.plan_steps(target=target, dag_dir=dags)
    assert planned["build"] == [] and planned["on_code_drift"] == "warn"
    monkeypatch.setattr(runtime, "_airflow_context", lambda: {"params": {"on_code_drift": "error"}})
    runtime.clear_cache()
    with pytest.raises(
        CodeDriftError, match=r"code: tokenize changed \(.*af_pipe.py, line 6\), called by make"
    ):
        runtime.plan_steps(target=target, dag_dir=dags)
    monkeypatch.setattr(
        runtime, "_airflow_context", lambda: {"params": {"on_code_drift": "rebuild"}}
    )
    runtime.clear_cache()
    assert runtime.plan_steps(target=target, dag_dir=dags)["build"] == ["af/data@v1"]
    runtime.clear_cache()


@pytest.mark.slow
def test_the_prefect_flow_reports_code_drift_and_fails_under_error(tmp_path: Path) -> None:
    pytest.importorskip("prefect")
    from marin_prefect.compile import to_prefect_flow

    path = tmp_path / "pf_pipe.py"
    path.write_text(AIRFLOW_TOY)
    prefix = str(tmp_path / "p")
    to_prefect_flow(f"{path}:pipeline", prefix=prefix)()
    path.write_text(AIRFLOW_TOY.replace("text.split()", "text.split()[::-1]"))
    sys.modules.pop("marin_target_pf_pipe", None)  # as a new flow run's process imports it
    clear_cache()
    with pytest.raises(CodeDriftError, match=r"code: tokenize changed"):
        to_prefect_flow(
            f"{path}:pipeline", prefix=prefix, options=RunOptions(on_code_drift="error")
        )()
    record = read_record(open_prefix(prefix), "af/data/v1")
    served = to_prefect_flow(
        f"{path}:pipeline", prefix=prefix, options=RunOptions(on_code_drift="warn")
    )()
    assert read_record(open_prefix(prefix), "af/data/v1") == record
    assert served


def test_an_on_code_drift_that_is_not_a_policy_is_a_clear_error() -> None:
    from marin.execution.errors import OptionError
    from marin.execution.plan.options import RunOptions

    with pytest.raises(
        OptionError, match=r"on_code_drift='ERROR' is not a drift policy.*warn, rebuild, error"
    ):
        RunOptions.from_params({"on_code_drift": "ERROR"})
    with pytest.raises(OptionError, match="on_code_drift="):
        StepRunner(RunOptions(on_code_drift="sometimes"))
    assert RunOptions.from_params({"on_code_drift": ""}).on_code_drift == "warn"
