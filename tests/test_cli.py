"""The ``marin`` command, run as a user runs it: in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "ngram.py") + ":pipeline"


def marin(
    *args: str, cwd: str = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_example_pipeline_builds_then_skips_then_reports_drift(tmp_path: Any) -> None:
    prefix = str(tmp_path / "p")
    first = marin("run", EXAMPLE, "--prefix", prefix)
    assert first.returncode == 0, first.stderr
    assert "built 11 step(s), skipped 0" in first.stdout
    report = open(os.path.join(prefix, "ngram/report/v1")).read()
    assert "| trigram-interpolated |" in report and "| bigram-add-k |" in report
    record = json.load(open(os.path.join(prefix, "ngram/report/v1.marin/record.json")))
    assert record["result"]["best"] in ("trigram-interpolated", "bigram-add-k")
    assert sorted(record["dep_paths"]) == [
        "ngram/eval/bigram-add-k@v1", "ngram/eval/trigram-interpolated@v1",
    ]  # fmt: skip

    second = marin("run", EXAMPLE, "--prefix", prefix)
    assert second.returncode == 0 and "built 0 step(s), skipped 11" in second.stdout

    plan = marin("plan", EXAMPLE, "--prefix", prefix, "--json", "--exit-code")
    assert plan.returncode == 0
    assert json.loads(plan.stdout)["summary"]["built"] == 11

    edited = tmp_path / "ngram_edited.py"
    source = open(EXAMPLE.rsplit(":", 1)[0]).read()
    edited.write_text(source.replace("add_k: float = 0.05", "add_k: float = 0.5"))
    drift = marin("plan", f"{edited}:pipeline", "--prefix", prefix)
    assert drift.returncode == 0
    assert "11 steps: 10 built, 1 drift" in drift.stdout
    assert "config.smoothing.k: 0.05 -> 0.5" in drift.stdout
    row = next(
        line for line in drift.stdout.splitlines() if "bigram-add-k@v1" in line and "drift" in line
    )
    assert "ngram/models/bigram-add-k/v1" in row
    gate = marin("plan", f"{edited}:pipeline", "--prefix", prefix, "--exit-code")
    assert gate.returncode == 1


@pytest.mark.parametrize(
    "target, message",
    [
        ("missing.py:pipeline", "error: no file missing.py"),
        ("examples/ngram.py:nothing", "has no attribute 'nothing'"),
        ("examples/ngram.py", "has no ':attr'"),
        ("no_such_module_xyz:pipeline", "cannot import module 'no_such_module_xyz'"),
        ("examples/ngram.py:NUM_SHARDS", "not a step handle"),
    ],
)
def test_bad_targets_give_one_line_and_exit_2(target: str, message: str) -> None:
    result = marin("run", target)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bad_prefix_gives_one_line_and_exit_2(tmp_path: Any) -> None:
    result = marin("run", EXAMPLE, "--prefix", "nosuch://bucket/x")
    assert result.returncode == 2 and "unknown storage protocol 'nosuch'" in result.stderr
    assert "Traceback" not in result.stderr


def test_failed_step_exits_1_naming_the_step(tmp_path: Any) -> None:
    pipeline = tmp_path / "bad.py"
    pipeline.write_text(
        "from marin.execution.lazy import apply, OUT\n"
        "def explode(out_path):\n    raise RuntimeError('kaboom')\n"
        "pipeline = apply('bad/step', explode, version='v0', out_path=OUT)\n"
    )
    result = marin("run", f"{pipeline}:pipeline", "--prefix", str(tmp_path / "p"))
    assert result.returncode == 1
    assert "error: RuntimeError: kaboom (step bad/step@v0)" in result.stderr


def test_max_concurrent_below_one_is_a_usage_error() -> None:
    result = marin("run", EXAMPLE, "--max-concurrent", "0")
    assert result.returncode == 2 and "max_concurrent=0" in result.stderr


@pytest.mark.parametrize("command", [[], ["run"], ["plan"]])
def test_help_has_an_example(command: list[str]) -> None:
    result = marin(*command, "--help")
    assert result.returncode == 0 and "example:" in result.stdout


def test_default_prefix_is_local_folder(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MARIN_PREFIX"}
    result = subprocess.run(
        [sys.executable, "-m", "marin.cli", "run", EXAMPLE, "--dry-run"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        f"would build 11 step(s), skipped 0; artifacts under {tmp_path}/marin-artifacts"
        in result.stdout
    )
    assert not (tmp_path / "marin-artifacts").exists()
    via_env = marin("run", EXAMPLE, "--dry-run", env={"MARIN_PREFIX": "memory://from-env"})
    assert "artifacts under memory://from-env" in via_env.stdout


@pytest.mark.parametrize(
    "secret_prefix", ["ftp://alice:hunter2@host/p", "s3://key:hunter2@bucket/p"]
)
@pytest.mark.parametrize(
    "args",
    [
        ("plan", EXAMPLE),
        ("run", EXAMPLE),
        ("show", "ngram/dataset@v1"),
        ("plan", "--json", EXAMPLE),
    ],
)
def test_a_prefix_with_credentials_is_refused_without_showing_them(
    args: tuple[str, ...], secret_prefix: str
) -> None:
    for given in (("--prefix", secret_prefix), ()):
        result = marin(*args, *given, env={"MARIN_PREFIX": secret_prefix})
        assert result.returncode == 2, result.stderr
        assert "hunter2" not in result.stdout + result.stderr
        assert "holds credentials" in result.stderr and "credential settings" in result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("engine, out", [("airflow", "dags"), ("prefect", "prefect.yaml")])
def test_an_export_refuses_a_prefix_with_credentials(engine: str, out: str, tmp_path: Any) -> None:
    pytest.importorskip(engine)
    where = str(tmp_path / out)
    result = marin("export", engine, EXAMPLE, "--prefix", "s3://k:hunter2@b/p", "-o", where)
    assert result.returncode == 2, result.stderr
    assert "hunter2" not in result.stdout + result.stderr and "holds credentials" in result.stderr
    assert not os.path.exists(where)  # nothing written with the secret in it


def test_an_ftp_prefix_to_a_closed_port_is_one_line_and_exit_2() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = marin("plan", EXAMPLE, "--prefix", f"ftp://127.0.0.1:{port}/p")
    assert result.returncode == 2, result.stderr
    assert f"storage for ftp://127.0.0.1:{port}/p cannot be reached" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
