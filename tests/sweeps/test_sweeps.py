"""Sweeps (issue 57): ``grid`` and ``sweep`` with Marin's names, one build per unique step, and
the counts ``marin plan`` and ``marin run`` print; ``marin results`` side by side and plotted."""

from __future__ import annotations

import collections
import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marin.cli import main
from marin.execution.errors import DuplicateStepError, InvalidStepError
from marin.execution.lazy import OUT, Sweep, apply, grid, lower, point_name, run, sweep
from marin.execution.pipeline.sweep import grid as pipeline_grid
from marin.experiment.sweep import grid as experiment_grid
from tests.reliability.conftest import child_env
from tests.sweeps import pipelines

ROOT = Path(__file__).resolve().parents[2]
TARGET = f"{ROOT}/tests/sweeps/pipelines.py:points"  # absolute: a worker's cwd is its own
LINE = "sweep of 16 points: 35 unique of 80 requested"


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.txt"
    monkeypatch.setenv(pipelines.CALLS_ENV, str(path))
    return path


def ran(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


# --- grid and sweep ---------------------------------------------------------------------------


def test_grid_is_the_product_last_axis_fastest_as_in_marin() -> None:
    assert grid(lr=[1, 2], wd=["a", "b"]) == [
        {"lr": 1, "wd": "a"}, {"lr": 1, "wd": "b"}, {"lr": 2, "wd": "a"}, {"lr": 2, "wd": "b"},
    ]  # fmt: skip
    assert grid() == [{}]
    assert experiment_grid is pipeline_grid is grid  # Marin's import path, the same function


@pytest.mark.parametrize(
    ("axes", "message"),
    [
        ({"lr": "0.1"}, "is not a list of values"),
        ({"lr": 0.1}, "is not a list of values"),
        ({"lr": []}, "has no values"),
        ({"lr": [0.1, 0.2, 0.1]}, "repeats the value 0.1"),
    ],
)
def test_a_bad_axis_is_refused_naming_it(axes: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidStepError, match=message):
        grid(**axes)


def test_each_point_is_a_handle_tagged_with_its_point_and_its_name_says_it() -> None:
    points = pipelines.points()
    assert isinstance(points, Sweep) and isinstance(points, list) and len(points) == 16
    assert points.points == grid(lr=pipelines.LR, wd=pipelines.WD)
    first = points[0]
    assert first.step_id == "sweep/eval/lr=0.0001,wd=0.0@v1"
    assert first.point == {"lr": 0.0001, "wd": 0.0}
    untagged = pipelines.trial(lr=0.0001, wd=0.0)
    assert untagged.point is None
    assert first.fingerprint() == untagged.fingerprint()  # the tag is never identity
    assert len({p.step_id for p in points}) == 16


def test_two_points_of_one_name_version_are_refused() -> None:
    """A sweep never yields two configs under one ``name@version`` (it would be built once and
    served for both): the trial must put the point in the name or the version."""

    def careless(lr: float) -> Any:
        return apply("train", pipelines.train, version="v1", data="d", lr=lr, wd=0, out_path=OUT)

    with pytest.raises(
        InvalidStepError, match="the points .*lr': 0.1.* and .*lr': 0.2.* both make train@v1"
    ) as info:
        sweep(careless, lr=[0.1, 0.2])
    assert "point_name" in info.value.fix

    def deferred(lr: float) -> Any:
        from marin.execution.lazy import DEFER

        return apply("train", pipelines.train, version=DEFER, data="d", lr=lr, wd=0, out_path=OUT)

    with pytest.raises(InvalidStepError, match="both make train@\\?"):
        sweep(deferred, lr=[0.1, 0.2])
    with pytest.raises(InvalidStepError, match="returned a str"):
        sweep(lambda lr: "train", lr=[0.1])


def test_an_upstream_step_that_differs_per_point_under_one_name_is_refused_at_lower() -> None:
    def hidden(lr: float) -> Any:
        model = apply("train", pipelines.train, version="v1", data="d", lr=lr, wd=0, out_path=OUT)
        return apply(point_name("eval", lr=lr), pipelines.evaluate, version="v1", model=model,
                     lr=lr, wd=0, out_path=OUT)  # fmt: skip

    with pytest.raises(DuplicateStepError, match="two different definitions of train@v1"):
        lower(list(sweep(hidden, lr=[0.1, 0.2])))


def test_point_name_says_the_point_and_refuses_what_a_name_cannot_hold() -> None:
    assert point_name("train", lr=3e-4, layers=4, act="gelu") == "train/lr=0.0003,layers=4,act=gelu"
    with pytest.raises(InvalidStepError, match="contains ':'"):
        point_name("train", data="b:x")
    # Red team r8 (minor): x="a,b=c" and (x="a", b="c") were one name.
    with pytest.raises(InvalidStepError, match="holds ',' or '='"):
        point_name("s", x="a,b=c")
    assert point_name("s", x="a", b="c") == "s/x=a,b=c"


# --- one build per unique step, on the local runner --------------------------------------------


def test_plan_counts_the_sweep_and_a_run_builds_each_unique_step_once(
    tmp_path: Path, calls: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = str(tmp_path / "p")
    run(pipelines.prep_only(), prefix=prefix)  # the shared preparation exists already
    assert sorted(ran(calls)) == ["clean", "raw", "tokens"]
    assert main(["plan", TARGET, "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert f"{LINE}; 3 reused" in out
    assert main(["plan", TARGET, "--prefix", prefix, "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["sweep"]
    assert counts == {"points": 16, "requested": 80, "unique": 35, "reused": 3}

    calls.unlink()
    assert main(["run", TARGET, "--prefix", prefix, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "built 32 step(s), skipped 3" in out and f"{LINE}; 3 reused" in out
    assert len(ran(calls)) == 32 and len(set(ran(calls))) == 32  # each point's two, once

    calls.unlink()
    assert main(["run", TARGET, "--prefix", prefix, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sweep"] == {"points": 16, "requested": 80, "unique": 35, "reused": 35}
    assert ran(calls) == []


def test_adding_one_axis_value_builds_exactly_the_new_points(
    tmp_path: Path, calls: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = str(tmp_path / "p")
    run(pipelines.points(), prefix=prefix)
    assert len(ran(calls)) == 35
    calls.unlink()
    monkeypatch.setenv(pipelines.MORE_WD_ENV, "1.0")
    artifacts = run(pipelines.points(), prefix=prefix)
    assert len(artifacts) == 20
    assert sorted(ran(calls)) == sorted(
        f"{kind} lr={lr} wd=1.0" for lr in pipelines.LR for kind in ("train", "eval")
    )


def test_a_selection_is_an_ordinary_step_over_the_points(tmp_path: Path, calls: Path) -> None:
    (best,) = run(pipelines.selection(), prefix=str(tmp_path / "p"))
    assert best.result == {"best": "lr=0.001,wd=0.0", "loss": 0.0}
    assert len(ran(calls)) == 35  # the selection step is not a point, and runs no trial


# --- three drivers on one prefix ----------------------------------------------------------------


@pytest.mark.slow
def test_three_drivers_on_one_prefix_build_each_unique_step_once(tmp_path: Path) -> None:
    prefix, calls = tmp_path / "p", tmp_path / "calls.txt"
    code = "import sys; from marin.cli import main; sys.exit(main(sys.argv[1:]))"
    procs = []
    for i in range(3):
        home = tmp_path / f"driver{i}"
        (home / "tmp").mkdir(parents=True)
        env = child_env(HOME=str(home), TMPDIR=str(home / "tmp"))
        env[pipelines.CALLS_ENV] = str(calls)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env["PYTHONPATH"]])
        args = ["run", TARGET, "--prefix", str(prefix), "--no-progress",
                "--max-concurrent", "4"]  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-c", code, *args], cwd=home, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        assert LINE in out  # each driver plans the same sweep
    counted = collections.Counter(ran(calls))
    assert len(counted) == 35 and set(counted.values()) == {1}, counted  # each fn ran once
    built = [re.search(r"^built (\d+) step\(s\)", out, re.MULTILINE) for out, _ in outs]
    assert sum(int(m[1]) for m in built if m) == 35, [o[-500:] for o, _ in outs]


# --- marin results ----------------------------------------------------------------------------


def test_results_lists_each_point_with_its_values_and_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = str(tmp_path / "p")
    run(pipelines.points()[:3], prefix=prefix)  # 3 of 16 built
    assert main(["results", TARGET, "--prefix", prefix]) == 0
    table = capsys.readouterr().out
    assert "16 points: 3 built, 13 not built" in table
    header = next(line for line in table.splitlines() if line.startswith("step"))
    assert header.split() == ["step", "lr", "wd", "result.loss", "result.steps"]
    assert re.search(r"sweep/eval/lr=0.0001,wd=0.01@v1 +0.0001 +0.01 +0.82 +10\n", table)
    assert "sweep/eval/lr=0.003,wd=0.3@v1 (not built)" in table

    assert main(["results", TARGET, "--prefix", prefix, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["axes"] == ["lr", "wd"] and len(data["points"]) == 16
    assert data["points"][0] == {
        "step": "sweep/eval/lr=0.0001,wd=0.0@v1",
        "status": "built",
        "point": {"lr": 0.0001, "wd": 0.0},
        "config": {},  # lr and wd are the axes; nothing else differs
        "result": {"loss": 0.81, "steps": 10},
    }
    assert main(["results", TARGET, "--prefix", prefix, "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["step", "status", "lr", "wd", "result.loss", "result.steps"]
    assert rows[1] == ["sweep/eval/lr=0.0001,wd=0.0@v1", "built", "0.0001", "0.0", "0.81", "10"]
    assert rows[-1] == ["sweep/eval/lr=0.003,wd=0.3@v1", "not built", "0.003", "0.3", "", ""]
    assert len(rows) == 17


def test_results_of_plain_targets_show_the_config_fields_that_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handles = [pipelines.trial(lr=1e-3, wd=0.1), pipelines.trial(lr=1e-3, wd=0.3)]
    run(handles, prefix=str(tmp_path / "p"))
    target = tmp_path / "plain.py"
    target.write_text(
        "from tests.sweeps.pipelines import trial\n"
        "targets = [trial(lr=1e-3, wd=0.1), trial(lr=1e-3, wd=0.3)]\n"
    )
    assert main(["results", f"{target}:targets", "--prefix", str(tmp_path / "p"), "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["step", "status", "config.wd", "result.loss", "result.steps"]  # lr: same
    assert rows[2][1:] == ["built", "0.3", "0.3", "10"]


def test_results_plot_writes_a_png_of_a_metric_against_an_axis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    prefix, png = str(tmp_path / "p"), tmp_path / "loss.png"
    run(pipelines.points(), prefix=prefix)
    args = ["results", TARGET, "--prefix", prefix, "--plot", "loss", "--x", "lr", "-o", str(png)]
    assert main(args) == 0
    assert (
        "wrote " + str(png) + ": result.loss vs lr, 16 points in 4 line(s)"
        in capsys.readouterr().err
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        image.load()
        assert image.size[0] > 600 and image.size[1] > 400
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50  # axes, text, four coloured lines
    drawn = {c for n, c in colors if n > 30 and len(set(c)) > 1}
    assert len(drawn) >= 4  # one colour per line (wd = 0, 0.01, 0.1, 0.3), not grey

    page = tmp_path / "loss.html"
    assert main([*args[:-1], str(page)]) == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "result.loss vs lr" in text

    assert main([*args[:-4], "--plot", "los"]) == 2  # a misspelt field: usage error
    err = capsys.readouterr().err
    assert "'los' is not a column" in err and "did you mean" in err


def test_a_point_is_named_whole_in_force_select_and_exclude(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team round 13, finding 2: ``--force``, ``--select`` and ``--exclude`` split a value
    at every comma, so a point (``sweep/eval/lr=0.0001,wd=0.0``) could not be named at all,
    and the suggestion was the refused name. A ``key=value`` item continues the point."""
    from marin.execution.plan.options import split_names

    point = point_name("sweep/eval", lr=pipelines.LR[0], wd=pipelines.WD[0])
    assert split_names(f"{point}, sweep/raw,{point}@v1") == [point, "sweep/raw", f"{point}@v1"]

    def plan(*flags: str) -> set[str]:
        argv = ["plan", TARGET, "--prefix", str(tmp_path / "p"), "--json", *flags]
        assert main(argv) == 0
        return {s["step"] for s in json.loads(capsys.readouterr().out)["steps"]}

    assert f"{point}@v1" in plan("--select", point) and len(plan("--select", point)) == 5
    assert f"{point}@v1" not in plan("--exclude", point)
    argv = [
        "plan",
        TARGET,
        "--prefix",
        str(tmp_path / "p"),
        "--json",
        "--force",
        f"sweep/raw,{point}",
    ]
    assert main(argv) == 0
    steps = {s["step"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    forced = {step for step, s in steps.items() if s["reason"] == "forced (--force)"}
    assert forced == {f"{point}@v1", "sweep/raw@v1"}, forced
