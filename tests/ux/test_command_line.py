"""The command line a new user meets: flags on either side of the sub-command, --force that
never eats the target, --version, help texts, show without @, ls --prefix checks."""

from __future__ import annotations

import argparse
import io
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from marin.cli import build_parser
from marin.execution.lazy import OUT, apply
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner
from tests.ux.helpers import EXAMPLE, marin


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


# --- the parser -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "plan"])
def test_force_takes_one_name_per_flag_or_a_comma_list(command: str) -> None:
    args = parse(command, "--force", "a", "t.py:p", "--force", "b,c@v1")
    assert args.target == "t.py:p"
    assert args.force == ["a", "b", "c@v1"]
    assert parse(command, "t.py:p").force == []


def test_force_before_the_target_does_not_eat_it(tmp_path: Path) -> None:
    """The issue's command line: `--force NAME TARGET` used to fail with 'target required'."""
    prefix = str(tmp_path / "p")
    assert marin("run", EXAMPLE, "--prefix", prefix).returncode == 0
    again = marin("run", "--force", "ngram/dataset", EXAMPLE, "--prefix", prefix)
    assert again.returncode == 0, again.stderr
    assert "start ngram/dataset@v1" in again.stderr
    assert "start ngram/corpus@v1" not in again.stderr


@pytest.mark.parametrize("bad", ["a,,b", ",", "a,"])
def test_force_with_an_empty_name_is_a_usage_error(bad: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("run", "--force", bad, "t.py:p")
    assert exc.value.code == 2
    assert "empty name" in capsys.readouterr().err


def test_plan_and_run_share_on_drift_and_no_cascade() -> None:
    for command in ("run", "plan"):
        assert parse(command, "t.py:p").on_drift == "warn"
        assert parse(command, "t.py:p", "--on-drift", "rebuild").on_drift == "rebuild"
        assert parse(command, "t.py:p").cascade is True
        assert parse(command, "t.py:p", "--no-cascade").cascade is False
    assert parse("run", "t.py:p", "--json").json is True
    assert parse("run", "t.py:p").json is False
    assert parse("run", "t.py:p", "--no-step-output").step_output is False
    with pytest.raises(SystemExit):
        parse("plan", "t.py:p", "--on-drift", "ignore")


@pytest.mark.parametrize(
    "argv",
    [
        ["-v", "--prefix", "/x", "run", "t.py:p"],
        ["run", "t.py:p", "-v", "--prefix", "/x"],
        ["--prefix", "/y", "run", "-v", "t.py:p", "--prefix", "/x"],  # after wins
        ["-v", "plan", "--prefix", "/x", "t.py:p"],
        ["--verbose", "--prefix", "/x", "ls"],
        ["show", "a@v1", "--verbose", "--prefix", "/x"],
        ["graph", "t.py:p", "-v", "--prefix", "/x"],
    ],
)
def test_verbose_and_prefix_before_or_after_the_sub_command(argv: list[str]) -> None:
    args = parse(*argv)
    assert args.verbose is True and args.prefix == "/x"


def test_without_the_options_the_defaults_hold() -> None:
    args = parse("run", "t.py:p")
    assert args.verbose is False and args.prefix is None


def test_an_empty_prefix_is_an_error_not_the_default() -> None:
    for argv in (["ls", "--prefix", ""], ["--prefix", " ", "ls"], ["run", "t.py:p", "--prefix="]):
        result = marin(*argv)
        assert result.returncode == 2, argv
        assert "--prefix" in result.stderr and "is empty" in result.stderr


def test_version() -> None:
    from importlib.metadata import version

    result = marin("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"marin {version('marin-execution')}"


def test_help_texts() -> None:
    run = marin("run", "--help").stdout
    assert "TARGET" in run and "targets" not in run  # it takes one
    assert "Build every step TARGET needs" in run
    assert "--force a --force b,c" in " ".join(run.split())
    for flag in ("--no-cascade", "--json", "--no-step-output", "--on-drift"):
        assert flag in run
    plan = marin("plan", "--help").stdout
    assert "--on-drift" in plan and "--force" in plan and "--no-cascade" in plan
    show = marin("show", "--help").stdout
    assert "WHAT" not in show and "ARTIFACT" in show
    prefect = marin("export", "prefect", "--help").stdout
    flat = " ".join(prefect.split())
    assert "--max-concurrent N steps one flow run builds at once" in flat
    assert "--on-drift {warn,rebuild,error} a built step whose config changed" in flat
    assert "examples:" in prefect and "marin export prefect examples/ngram.py:pipeline" in flat


# --- show without @ ----------------------------------------------------------------------------


def test_show_a_typo_without_at_is_a_name_and_suggests_the_closest(built_example: str) -> None:
    result = marin("show", "ngram/reprt", "--prefix", built_example)
    assert result.returncode == 2
    assert "ngram@reprt" not in result.stderr
    assert "nothing named ngram/reprt is built" in result.stderr
    assert "did you mean ngram/report" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_show_a_name_shows_its_latest_built_version(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    pipeline = tmp_path / "versions.py"
    pipeline.write_text(
        "import os\n"
        "from marin.execution.lazy import apply, OUT\n"
        "def f(v, out_path):\n    open(out_path, 'w').write(v)\n    return v\n"
        "pipeline = apply('m/model', f, version=os.environ['V'], v=os.environ['V'], "
        "out_path=OUT)\n"
    )
    for v in ("v2", "v10", "v1"):  # v1 is built last: "latest" is by build time, not by name
        assert (
            marin("run", f"{pipeline}:pipeline", "--prefix", prefix, env={"V": v}).returncode == 0
        )
    result = marin("show", "m/model", "--prefix", prefix)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("m/model@v1 ")
    assert marin("show", "m/model@v10", "--prefix", prefix).stdout.startswith("m/model@v10 ")


def test_show_a_name_with_nothing_close_points_at_ls(built_example: str) -> None:
    result = marin("show", "zzz/qqq", "--prefix", built_example)
    assert result.returncode == 2
    assert f"marin ls --prefix {built_example}" in result.stderr


# --- ls --prefix --------------------------------------------------------------------------------


def test_ls_warns_about_a_missing_prefix(tmp_path: Path) -> None:
    result = marin("ls", "--prefix", str(tmp_path / "no" / "such"))
    assert result.returncode == 0
    assert f"warning: the prefix {tmp_path}/no/such does not exist" in result.stderr
    assert "0 artifact(s)" in result.stdout


def test_ls_of_a_file_is_bad_input(tmp_path: Path) -> None:
    some_file = tmp_path / "some-file"
    some_file.write_text("x")
    result = marin("ls", "--prefix", str(some_file))
    assert result.returncode == 2
    assert f"error: --prefix {some_file} is a file" in result.stderr
    assert result.stdout == ""


def test_ls_of_an_existing_empty_prefix_does_not_warn(tmp_path: Path) -> None:
    result = marin("ls", "--prefix", str(tmp_path))
    assert result.returncode == 0 and result.stderr == ""


# --- targets ------------------------------------------------------------------------------------


def test_a_target_function_that_needs_arguments_says_so() -> None:
    result = marin("run", "examples/ngram.py:build_corpus")
    assert result.returncode == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "needs arguments (modules, num_shards, out_path)" in err
    assert "called with no arguments to get the pipeline's handles" in err
    assert "missing 3 required positional arguments" not in err


# --- labelled step output -----------------------------------------------------------------------


def test_concurrent_partial_writes_never_split_a_line_between_steps(
    tmp_path: Path, capsys: Any
) -> None:
    """Two steps write half a line each, wait for each other, then finish their lines."""
    halfway = threading.Barrier(2)

    def half_lines(marker: str, out_path: str) -> None:
        for i in range(20):
            sys.stdout.write(f"{marker}-start-{i} ")
            sys.stdout.flush()
            halfway.wait(timeout=30)  # both steps are mid-line here
            sys.stdout.write(f"{marker}-end-{i}\n")
        sys.stdout.write(f"{marker}-no-newline")
        with open(out_path, "w") as f:
            f.write(marker)

    steps = [
        apply(f"half/{m}", half_lines, version="v1", marker=m, out_path=OUT).lower()
        for m in ("A", "B")
    ]
    StepRunner(RunOptions(max_concurrent=2), prefix=str(tmp_path)).run(steps)
    lines = capsys.readouterr().out.splitlines()
    for m in ("A", "B"):
        mine = [line for line in lines if line.startswith(f"half/{m}@v1 | ")]
        assert mine == [f"half/{m}@v1 | {m}-start-{i} {m}-end-{i}" for i in range(20)] + [
            f"half/{m}@v1 | {m}-no-newline"
        ]
    labelled = [line for line in lines if re.match(r"half/[AB]@v1 \| ", line)]
    assert len(labelled) == 42, lines


def test_step_log_records_carry_the_step_label_on_the_terminal() -> None:
    import logging

    from marin.execution.builder.step_logs import (
        StepLabelFilter,
        capture_step_output,
        terminal_formatter,
    )

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(terminal_formatter())
    handler.addFilter(StepLabelFilter())
    user, marin_log = logging.getLogger("user.labels"), logging.getLogger("marin.labels")
    user.addHandler(handler)
    marin_log.addHandler(handler)
    step_log = io.StringIO()
    try:
        with capture_step_output(step_log, label="x/y@v1"):
            user.warning("from the step")
            marin_log.warning("from marin")
        user.warning("outside")
    finally:
        user.removeHandler(handler)
        marin_log.removeHandler(handler)
    text = out.getvalue()
    assert re.search(r"WARNING x/y@v1 \| from the step$", text, re.M)
    assert re.search(r"WARNING from marin$", text, re.M)
    assert re.search(r"WARNING outside$", text, re.M)
    assert "x/y@v1" not in step_log.getvalue() and "from the step" in step_log.getvalue()


def test_global_prefix_and_verbose_reach_the_exporters(tmp_path: Path) -> None:
    dag = tmp_path / "dag.py"
    result = marin("--prefix", "memory://top", "export", "airflow", EXAMPLE, "-o", str(dag), "-v")
    assert result.returncode == 0, result.stderr
    assert 'DEFAULT_PREFIX = "memory://top"' in dag.read_text()
    yaml_file = tmp_path / "prefect.yaml"
    result = marin(
        "--prefix", "memory://top", "export", "prefect", EXAMPLE, "-o", str(yaml_file), "-v",
        "--no-check",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "prefix: memory://top" in yaml_file.read_text()


# --- errors on one line -------------------------------------------------------------------------

LONG = ("the loss went to NaN at step 1200 " * 8).strip()


def test_a_long_multi_line_error_is_never_wrapped(tmp_path: Path) -> None:
    pipeline = tmp_path / "long.py"
    pipeline.write_text(
        "from marin.execution.lazy import apply, OUT\n"
        "def explode(out_path):\n"
        f"    raise RuntimeError({LONG!r} + '\\n  details: ' + {LONG!r})\n"
        "pipeline = apply('long/step', explode, version='v0', out_path=OUT)\n"
    )
    result = marin("run", f"{pipeline}:pipeline", "--prefix", str(tmp_path / "p"))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: RuntimeError: " + LONG)
    assert "details: " + LONG + " (step long/step@v0): see the step's log" in last
    # The summary: one row per step (the note is cut, never folded), the whole error below.
    rows = [line for line in result.stdout.splitlines() if line.startswith("long/step@v0")]
    assert len(rows) == 1 and "failed" in rows[0]
    assert not any(line.startswith(" " * 20 + "the loss") for line in result.stdout.splitlines())
    error_lines = [line for line in result.stdout.splitlines() if line.startswith("  error: ")]
    assert error_lines == [f"  error: RuntimeError: {LONG} details: {LONG}"], (
        result.stdout
    )
