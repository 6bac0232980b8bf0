"""``marin export prefect``: a prefect.yaml deployment entry, written or updated in place."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marin_prefect.cli import ENTRYPOINT, register
from tests.prefect.prefect_helpers import HERE

TARGET = f"{HERE / 'prefect_pipelines.py'}:pipeline"


def _marin_export(*argv: str) -> int:
    """Parse like the core CLI does: `marin export <engine> ...` -> args.func(args)."""
    parser = argparse.ArgumentParser(prog="marin export")
    register(parser.add_subparsers(dest="engine", required=True))
    args = parser.parse_args(list(argv))
    return int(args.func(args))


def test_export_writes_a_deployment_of_the_entry_flow(tmp_path: Path) -> None:
    out = tmp_path / "prefect.yaml"
    assert (
        _marin_export("prefect", TARGET, "--name", "toy", "--work-pool", "pool", "-o", str(out))
        == 0
    )
    doc = yaml.safe_load(out.read_text())
    [entry] = doc["deployments"]
    assert entry["name"] == "toy"
    assert entry["entrypoint"] == ENTRYPOINT == "marin_prefect.flows:marin_pipeline"
    assert entry["parameters"] == {"target": TARGET, "max_concurrent": 8, "on_drift": "warn"}
    assert entry["work_pool"] == {"name": "pool"}


def test_export_is_idempotent_and_updates_in_place(tmp_path: Path) -> None:
    out = tmp_path / "prefect.yaml"
    out.write_text(
        yaml.safe_dump(
            {
                "name": "existing-project",
                "pull": [{"prefect.deployments.steps.set_working_directory": {"directory": "/x"}}],
                "deployments": [
                    {"name": "other", "entrypoint": "flows.py:other", "work_pool": {"name": "p"}},
                    {
                        "name": "toy",
                        "entrypoint": "old.py:flow",
                        "tags": ["nightly"],
                        "parameters": {"target": "old.py:x", "keep_going": True},
                        "work_pool": {"name": "old", "job_variables": {"env": {"A": "1"}}},
                    },
                ],
            },
            sort_keys=False,
        )
    )
    argv = ["prefect", TARGET, "--name", "toy", "--work-pool", "pool", "-o", str(out)]
    assert _marin_export(*argv, "--max-concurrent", "4") == 0
    first = out.read_text()
    assert _marin_export(*argv, "--max-concurrent", "4") == 0
    assert out.read_text() == first, "re-running the export changed the file"

    doc = yaml.safe_load(first)
    assert doc["name"] == "existing-project" and doc["pull"]
    other, toy_entry = doc["deployments"]
    assert other == {"name": "other", "entrypoint": "flows.py:other", "work_pool": {"name": "p"}}
    assert toy_entry["entrypoint"] == ENTRYPOINT
    assert toy_entry["tags"] == ["nightly"]
    assert toy_entry["parameters"] == {
        "target": TARGET,
        "max_concurrent": 4,
        "on_drift": "warn",
        "keep_going": True,
    }
    assert toy_entry["work_pool"] == {"name": "pool", "job_variables": {"env": {"A": "1"}}}

    assert _marin_export(*argv, "--on-drift", "rebuild") == 0
    updated = yaml.safe_load(out.read_text())["deployments"]
    assert len(updated) == 2 and updated[1]["parameters"]["on_drift"] == "rebuild"


def test_export_makes_project_file_targets_relative(tmp_path: Path) -> None:
    (tmp_path / "pipes").mkdir()
    pipeline_file = tmp_path / "pipes" / "toy.py"
    pipeline_file.write_text((HERE / "prefect_pipelines.py").read_text())
    out = tmp_path / "prefect.yaml"
    assert _marin_export("prefect", f"{pipeline_file}:pipeline", "-o", str(out)) == 0
    [entry] = yaml.safe_load(out.read_text())["deployments"]
    assert entry["parameters"]["target"] == "pipes/toy.py:pipeline"
    assert entry["name"] == "toy-pipeline"
    assert str(tmp_path) not in out.read_text()


def test_export_bad_target_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prefect.yaml"
    assert _marin_export("prefect", f"{tmp_path}/nope.py:pipeline", "-o", str(out)) == 2
    assert _marin_export("prefect", "no-attr", "-o", str(out)) == 2
    assert _marin_export("prefect", TARGET, "--name", "a/b", "-o", str(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error:") for line in err), err
    assert not out.exists()


def test_cli_module_does_not_import_prefect() -> None:
    code = (
        "import sys, argparse, marin_prefect, marin_prefect.cli as c\n"
        "c.register(argparse.ArgumentParser().add_subparsers())\n"
        "assert 'prefect' not in sys.modules, 'marin_prefect.cli imported prefect'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_marin_export_prefect_command(tmp_path: Path) -> None:
    """Through the real `marin` console script and its `marin.exporters` entry point."""
    marin = Path(sys.executable).parent / "marin"
    out = tmp_path / "prefect.yaml"
    cmd = [str(marin), "export", "prefect", TARGET, "--work-pool", "p", "-o", str(out)]
    first = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    assert "created deployment 'prefect_pipelines-pipeline'" in first.stdout
    written = out.read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert again.returncode == 0 and "unchanged" in again.stdout
    assert out.read_text() == written
    bad = subprocess.run(
        [str(marin), "export", "prefect", "missing.py:x", "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error:"), bad.stderr
