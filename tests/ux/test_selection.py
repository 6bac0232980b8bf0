"""``--select`` and ``--exclude`` on run, plan, graph and why (issue 22)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ux.helpers import EXAMPLE, marin


def plan_steps(*args: str) -> dict[str, str]:
    result = marin("plan", EXAMPLE, "--json", *args)
    assert result.returncode == 0, result.stderr
    return {s["step"]: s["action"] for s in json.loads(result.stdout)["steps"]}


def test_select_builds_the_matching_steps_and_what_they_need(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    steps = plan_steps("--prefix", prefix, "--select", "ngram/eval/bigram*")
    assert "ngram/eval/bigram-add-k@v1" in steps and "ngram/models/bigram-add-k@v1" in steps
    assert "ngram/report@v1" not in steps and "ngram/eval/trigram-interpolated@v1" not in steps
    result = marin("run", EXAMPLE, "--prefix", prefix, "--select", "ngram/eval/bigram*")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "p" / "ngram" / "eval" / "bigram-add-k" / "v1.marin").is_dir()
    assert not (tmp_path / "p" / "ngram" / "report").exists()
    assert not (tmp_path / "p" / "ngram" / "models" / "trigram-interpolated").exists()


def test_select_matches_name_at_version_and_comma_lists(tmp_path: Path) -> None:
    steps = plan_steps("--prefix", str(tmp_path), "--select", "ngram/corpus@v1,ngram/tokens/*")
    assert sorted(steps) == ["ngram/corpus@v1"] + [f"ngram/tokens/shard-0{i}@v1" for i in range(4)]


def test_exclude_drops_the_steps_and_their_readers(tmp_path: Path) -> None:
    steps = plan_steps("--prefix", str(tmp_path), "--exclude", "ngram/eval/trigram*")
    assert "ngram/eval/trigram-interpolated@v1" not in steps
    assert "ngram/report@v1" not in steps  # it reads the excluded evaluation
    assert "ngram/eval/bigram-add-k@v1" in steps
    assert "ngram/models/trigram-interpolated@v1" in steps


def test_graph_takes_the_selection() -> None:
    result = marin("graph", EXAMPLE, "--select", "ngram/dataset")
    assert result.returncode == 0, result.stderr
    assert "ngram/dataset@v1" in result.stdout and "ngram/models" not in result.stdout


@pytest.mark.parametrize(
    ("option", "pattern", "hint"),
    [
        ("--select", "ngram/evl/*", "did you mean ngram/eval/*?"),
        ("--exclude", "ngram/datset", "did you mean ngram/dataset?"),
    ],
)
def test_a_pattern_that_matches_nothing_is_an_error(option: str, pattern: str, hint: str) -> None:
    result = marin("plan", EXAMPLE, option, pattern)
    assert result.returncode == 2
    assert f"error: {option} {pattern!r} matches no step of this pipeline: {hint}" in (
        result.stderr
    )


def test_an_empty_pattern_is_a_usage_error() -> None:
    result = marin("plan", EXAMPLE, "--select", "ngram/corpus,,ngram/dataset")
    assert result.returncode == 2
    assert "has an empty pattern: give a glob such as 'ngram/eval/*'" in result.stderr
