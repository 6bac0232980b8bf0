"""The README's command-line examples and the ``--help`` examples of ``why``, ``diff``,
``--select``/``--exclude`` (on ``run``, ``plan``, ``graph`` and both exporters) and ``ls --json``
run as written (issue 22)."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from marin.cli import build_parser
from tests.ux.helpers import ROOT, marin

NEW = re.compile(r"marin (why|diff|ls)\b|--select|--exclude")
DOC_PREFIX = "/tmp/marin"


def readme_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The command line") :]
    block = section[section.index("```bash") + 7 : section.index("```", section.index("```bash") + 7)]
    return [line.strip() for line in block.splitlines() if NEW.search(line)]


def help_examples() -> list[str]:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[union-attr]
    found = []
    engines = next(a for a in commands["export"]._actions if a.dest == "engine").choices  # type: ignore[union-attr]
    parsers = [commands[n] for n in ("run", "plan", "graph", "why", "diff", "ls")]
    parsers += [engines[n] for n in ("airflow", "prefect")]
    for command in parsers:
        epilog = command.epilog or ""
        found += [line.strip() for line in epilog.splitlines() if line.strip().startswith("marin ")]
    return [line for line in found if NEW.search(line) and "s3://" not in line]


def argv_of(line: str, prefix: str) -> list[str]:
    """The command as a shell would run it, without its comment, pipe or redirection."""
    words = shlex.split(line, comments=True)
    for stop in ("|", "||", ">"):
        if stop in words:
            words = words[: words.index(stop)]
    assert words[0] == "marin"
    return [w.replace(DOC_PREFIX, prefix) for w in words[1:]]


@pytest.fixture(scope="module")
def doc_prefix(
    built_example: str, drifted_example: str, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The built example plus the bumped dataset, so both versions of it can be diffed."""
    prefix = str(tmp_path_factory.mktemp("docs") / "prefix")
    shutil.copytree(built_example, prefix, symlinks=True)
    result = marin("run", drifted_example, "--prefix", prefix, "--select", "ngram/dataset")
    assert result.returncode == 0, result.stderr
    return prefix


def test_the_examples_are_found() -> None:
    readme, helps = readme_examples(), help_examples()
    for needle in ("marin why", "marin diff", "--select", "--exclude", "marin ls"):
        assert any(needle in line for line in readme), needle
        assert any(needle in line for line in helps), needle


@pytest.mark.parametrize("line", readme_examples() + help_examples())
def test_documented_example_runs(line: str, doc_prefix: str, tmp_path: Path) -> None:
    result = marin(*argv_of(line, doc_prefix), env={"MARIN_PREFIX": doc_prefix}, cwd=ROOT)
    expected = (0, 1) if " diff " in f" {line} " else (0,)
    assert result.returncode in expected, (line, result.stderr)
    assert "error:" not in result.stderr, (line, result.stderr)
