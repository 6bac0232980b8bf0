"""``marin export airflow --select/--exclude`` (issue 22): the DAG file holds the selection and
what it needs, exactly the steps ``marin plan`` shows with the same options, and its
``marin-plan`` task plans that part, not the whole target."""

from __future__ import annotations

import ast
import contextlib
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from marin.execution.errors import OptionError
from marin_airflow import runtime
from marin_airflow.export import build_export, embedded_steps, write_export
from tests.ux.helpers import EXAMPLE, marin

SELECTIONS = [
    ("--select", "ngram/eval/bigram*"),
    ("--exclude", "ngram/eval/trigram*"),
    ("--select", "ngram/models/*", "--exclude", "ngram/models/trigram*"),
]


def planned(prefix: Path, *selection: str) -> set[str]:
    result = marin("plan", EXAMPLE, "--json", "--prefix", str(prefix), *selection)
    assert result.returncode == 0, result.stderr
    return {s["step"] for s in json.loads(result.stdout)["steps"]}


def constants(text: str) -> dict[str, Any]:
    """The DAG file's top-level data constants, read with ``ast`` (never executed)."""
    found: dict[str, Any] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            names, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            names, value = node.targets, node.value
        else:
            continue
        for name in names:
            if isinstance(name, ast.Name):
                with contextlib.suppress(ValueError):  # code, not data (dag = DAG(...))
                    found[name.id] = ast.literal_eval(value)
    return found


@pytest.mark.parametrize("selection", SELECTIONS, ids=" ".join)
def test_the_dag_holds_the_planned_subset_and_check_honours_it(
    tmp_path: Path, selection: tuple[str, ...]
) -> None:
    dags = tmp_path / "dags"
    result = marin("export", "airflow", EXAMPLE, "-o", str(dags), *selection)
    assert result.returncode == 0, result.stderr
    text = (dags / "ngram_pipeline.py").read_text(encoding="utf-8")
    steps = {v["step"] for v in (embedded_steps(text) or {}).values()}
    assert steps == planned(tmp_path / "p", *selection)
    assert 0 < len(steps) < len(planned(tmp_path / "p"))
    values = constants(text)
    flags = dict(zip(selection[::2], selection[1::2], strict=True))
    assert values["SELECT"] == ([flags["--select"]] if "--select" in flags else [])
    assert values["EXCLUDE"] == ([flags["--exclude"]] if "--exclude" in flags else [])

    # --check honours the selection: fresh with it, stale (steps added) without it.
    same = marin("export", "airflow", EXAMPLE, "-o", str(dags), *selection, "--check")
    assert same.returncode == 0, same.stderr
    whole = marin("export", "airflow", EXAMPLE, "-o", str(dags), "--check")
    assert whole.returncode == 1 and "step(s) added" in whole.stderr, whole.stderr
    # The recorded command reproduces the file, selection included.
    argv = shlex.split(values["EXPORT_COMMAND"])
    assert argv[:3] == ["marin", "export", "airflow"]
    where = dags / values["EXPORT_ROOT"]
    again = marin(*argv[1:], "--check", cwd=where)
    assert again.returncode == 0, (values["EXPORT_COMMAND"], again.stderr)


def test_the_selection_s_spelling_never_changes_the_bytes(tmp_path: Path) -> None:
    one = build_export(EXAMPLE, str(tmp_path), select=["ngram/eval/*,ngram/dataset"])
    two = build_export(EXAMPLE, str(tmp_path), select=["ngram/dataset", "ngram/eval/*"])
    assert one.text == two.text
    assert constants(one.text)["SELECT"] == ["ngram/dataset", "ngram/eval/*"]
    # Without a selection the file has no selection constants (committed DAGs keep their bytes).
    assert "SELECT" not in constants(build_export(EXAMPLE, str(tmp_path)).text)


def test_a_pattern_with_quotes_and_braces_stays_data(tmp_path: Path) -> None:
    from tests.airflow.airflow_pipelines import WEIRD_NAME

    pattern = WEIRD_NAME[:-3] + "*"  # quotes, Jinja braces, then a glob
    target = f"{Path(__file__).parent / 'airflow_pipelines.py'}:toy"
    result = build_export(target, str(tmp_path), select=[pattern])
    values = constants(result.text)
    assert values["SELECT"] == [pattern] and values["EXCLUDE"] == []
    assert {t.step_id for t in result.tasks} == {"af/root@v1", f"{WEIRD_NAME}@v1"}
    assert shlex.split(values["EXPORT_COMMAND"])[-2:] == ["--select", pattern]


@pytest.mark.parametrize(
    ("option", "pattern", "hint"),
    [
        ("--select", "ngram/evl/*", "did you mean ngram/eval/*?"),
        ("--exclude", "ngram/datset", "did you mean ngram/dataset?"),
    ],
)
def test_a_pattern_that_matches_nothing_exits_2_and_writes_nothing(
    tmp_path: Path, option: str, pattern: str, hint: str
) -> None:
    result = marin("export", "airflow", EXAMPLE, "-o", str(tmp_path), option, pattern)
    assert result.returncode == 2
    assert f"error: {option} {pattern!r} matches no step of this pipeline: {hint}" in (
        result.stderr
    )
    assert not list(tmp_path.iterdir())


def test_the_plan_task_plans_only_the_selection(
    tmp_path: Path, marin_airflow_log: pytest.LogCaptureFixture
) -> None:
    dags = tmp_path / "dags"
    result = build_export(EXAMPLE, str(dags), select=["ngram/eval/bigram*"])
    values = constants(result.text)
    runtime.clear_cache()
    plan = runtime.plan_steps(
        target=values["TARGET"],
        graph_digest=values["GRAPH_DIGEST"],
        select=values["SELECT"],
        exclude=values["EXCLUDE"],
        prefix=str(tmp_path / "p"),
        dag_dir=str(dags),
    )
    assert set(plan["build"]) == {t.step_id for t in result.tasks}
    assert plan["prune"] == []
    # The digest is of the selected steps, so a selected export is not reported stale.
    assert "stale" not in marin_airflow_log.text


def test_a_bad_selection_in_the_dag_file_is_an_option_error(tmp_path: Path) -> None:
    runtime.clear_cache()
    with pytest.raises(OptionError, match=r"SELECT=\[1\]: use a list of globs"):
        runtime.plan_steps(target=EXAMPLE, select=[1], prefix=str(tmp_path), dag_dir=str(tmp_path))  # type: ignore[list-item]


@pytest.mark.slow
def test_airflow_dags_test_of_a_selected_export_builds_only_the_selection(
    tmp_path: Path, sandbox: Any
) -> None:
    from marin_airflow.export import lower_target

    dags, prefix = tmp_path / "dags", tmp_path / "prefix"
    result = build_export(EXAMPLE, str(dags), exclude=["ngram/eval/trigram*"])
    write_export(result)
    proc = sandbox.dags_test(result.dag_id, str(dags), conf={"prefix": str(prefix)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "DAG file is stale" not in proc.stdout + proc.stderr
    states = sandbox.task_states(result.dag_id)
    assert set(states) == {runtime.PLAN_TASK_ID} | {t.task_id for t in result.tasks}
    assert set(states.values()) == {"success"}, states
    selected = {t.step_id for t in result.tasks}
    everything = lower_target(EXAMPLE)
    assert selected < {s.step_id for s in everything}
    for spec in everything:
        built = (prefix / f"{spec.output_path}.marin" / "record.json").exists()
        assert built == (spec.step_id in selected), spec.step_id
