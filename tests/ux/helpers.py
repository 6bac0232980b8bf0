"""Shared fixtures for the UX tests: the example pipeline built once, and golden-file checks."""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import pexpect

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = f"{ROOT / 'examples' / 'ngram.py'}:pipeline"
PIPELINES = ROOT / "tests" / "ux" / "pipelines.py"
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("MARIN_UPDATE_GOLDEN") == "1"
COLUMNS = 80
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def marin(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess, as a user (or CI: stdout and stderr are pipes) runs it."""
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` set in ``os.environ``, and only those put back after: never the whole
    environment cleared and refilled, which a thread still running (a job's poller) could read
    half-way."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def marin_here(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in this process (``marin.cli.main``), as :func:`marin` runs it in a subprocess:
    exit code, stdout, stderr. A fraction of a subprocess's cost, for the calls a test makes to
    set up or to look, not the call whose process it checks."""
    from marin.cli import main

    out, err = io.StringIO(), io.StringIO()
    # Loading a pipeline file puts its folder first on sys.path for good: a later first import
    # of ``airflow`` or ``prefect`` in this process would find a folder of that name there.
    path = list(sys.path)
    with environ(env or {}), redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: a usage error, or --help
            code = exc.code if isinstance(exc.code, int) else 2
        finally:
            sys.path[:] = path
    return subprocess.CompletedProcess(["marin", *args], code, out.getvalue(), err.getvalue())


def spawn_80(*args: str, sleep: str = "0", command: str = "run") -> pexpect.spawn:
    """``marin COMMAND`` on an 80x40 pseudo-terminal; the width comes from the terminal itself."""
    import pexpect

    env = {**os.environ, "TERM": "xterm-256color", "MARIN_TEST_SLEEP": sleep}
    for name in ("COLUMNS", "LINES", "NO_COLOR"):
        env.pop(name, None)
    return pexpect.spawn(
        sys.executable,
        ["-m", "marin.cli", command, *args],
        cwd=str(ROOT),
        env=env,
        dimensions=(40, COLUMNS),
        encoding="utf-8",
        timeout=90,
    )


def plan_file(
    tmp_path: Path, source: str, name: str = "pipeline_under_test"
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Write ``source`` as ``<name>.py`` and run ``marin plan`` on its ``pipeline``."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path, marin("plan", f"{path}:pipeline", "--prefix", str(tmp_path / "p"))


def normalise(text: str, prefix: str, *, collapse: bool = False) -> str:
    """Replace the temporary prefix by ``<prefix>``; optionally collapse runs of spaces.

    Table columns are as wide as their widest cell, so a temporary path of another length
    shifts the columns after it; collapsing makes the comparison independent of that.
    """
    text = text.replace(prefix, "<prefix>")
    # Build ids are random per commit.
    text = re.sub(r'"build_id": "[0-9a-f]{32}"', '"build_id": "<build id>"', text)
    if collapse:
        text = "\n".join(re.sub(r" {2,}", "  ", line).rstrip() for line in text.splitlines())
        text += "\n"
    return text


def check_golden(name: str, actual: str) -> None:
    """Compare with tests/ux/golden/<name>; MARIN_UPDATE_GOLDEN=1 rewrites the file instead."""
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    if not path.exists():
        pytest.fail(f"golden file {path} is missing: run with MARIN_UPDATE_GOLDEN=1 to create it")
    expected = path.read_text()
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"golden/{name}",
                tofile="actual",
            )
        )
        pytest.fail(
            f"output differs from golden/{name} (if the change is intended, regenerate with "
            f"MARIN_UPDATE_GOLDEN=1 pytest tests/ux):\n{diff}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def built_example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The example pipeline really built once under a temporary prefix."""
    prefix = str(tmp_path_factory.mktemp("example") / "prefix")
    result = marin("run", EXAMPLE, "--prefix", prefix)
    assert result.returncode == 0, result.stderr
    yield prefix


@pytest.fixture(scope="session")
def drifted_example(tmp_path_factory: pytest.TempPathFactory, built_example: str) -> str:
    """A copy of the example with ``add_k`` changed and the dataset's version bumped to v2."""
    source = (ROOT / "examples" / "ngram.py").read_text()
    edited = source.replace("add_k: float = 0.05", "add_k: float = 0.5").replace(
        '"ngram/dataset", build_dataset, version="v1"',
        '"ngram/dataset", build_dataset, version="v2"',
    )
    assert edited.count("0.5") > source.count("0.5") and 'version="v2"' in edited
    path = tmp_path_factory.mktemp("edited") / "ngram_edited.py"
    path.write_text(edited)
    return f"{path}:pipeline"


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def any_path(*parts: Any) -> str:
    return os.path.join(*map(str, parts))
