"""``marin ls --json`` with filters, for scripts (issue 22; docs/ls-json.md)."""

from __future__ import annotations

import json
import os

import pytest

from tests.ux.helpers import PIPELINES, marin


def steps(prefix: str, *filters: str) -> list[str]:
    result = marin("ls", "--prefix", prefix, "--json", "--no-size", *filters)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    return sorted([a["step"] for a in data["artifacts"]] + [u["step"] for u in data["unfinished"]])


def test_ls_filters(built_example: str, tmp_path) -> None:
    evals = ["ngram/eval/bigram-add-k@v1", "ngram/eval/trigram-interpolated@v1"]
    assert steps(built_example, "--name", "ngram/eval/*") == evals
    assert steps(built_example, "--name", "ngram/report@v1") == ["ngram/report@v1"]
    assert len(steps(built_example, "--after", "2000-01-01")) == 11
    assert steps(built_example, "--before", "2000-01-01") == []
    record = json.loads(marin("show", "ngram/report", "--prefix", built_example, "--json").stdout)
    user, commit = record["provenance"]["user"], record["provenance"].get("git_commit")
    assert len(steps(built_example, "--by", user)) == 11
    assert steps(built_example, "--by", "nobody-at-all") == []
    if commit:
        assert len(steps(built_example, "--git-commit", commit[:7])) == 11
    assert steps(built_example, "--git-commit", "0000000") == []
    # The table takes the same filters.
    table = marin("ls", "--prefix", built_example, "--name", "ngram/eval/*", "--no-size")
    assert "2 artifact(s)" in table.stdout


def test_ls_status_filter_finds_failed_attempts(tmp_path) -> None:
    prefix = str(tmp_path / "p")
    marin("run", f"{PIPELINES}:failing", "--prefix", prefix, env={"MARIN_TEST_SLEEP": "0"})
    assert steps(prefix, "--status", "failed") == ["demo/bad@v1"]
    assert steps(prefix, "--status", "unfinished") == ["demo/bad@v1"]
    assert "demo/bad@v1" not in steps(prefix, "--status", "built")
    assert "demo/source@v1" in steps(prefix, "--status", "built")


@pytest.mark.parametrize("option", ["--after", "--before"])
def test_a_bad_time_is_bad_input(option: str, tmp_path) -> None:
    result = marin("ls", "--prefix", os.fspath(tmp_path), option, "last tuesday")
    assert result.returncode == 2
    assert f"error: {option} 'last tuesday' is not a date or time" in result.stderr
