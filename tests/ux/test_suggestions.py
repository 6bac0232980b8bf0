"""Every fix a message suggests is itself valid, and did-you-mean comes from the actual names
wherever a name is taken (issue 22).

The tables below are bad inputs; each test collects the values the error message suggests
(a quoted example after "such as" / "e.g." / "pass field=", or a did-you-mean name) and applies
them where the bad value was. Written against the messages' shape, not their words, so it keeps
checking when the messages are reworded.
"""

from __future__ import annotations

import re

import pytest

from marin.cli import build_parser
from marin.execution.errors import InvalidStepError
from marin.execution.lazy import apply
from marin.execution.names import validate_name, validate_version
from tests.ux.helpers import EXAMPLE, marin

SUGGESTED = re.compile(r"(?:such as|e\.g\.|pass \w+=)\s*'([^']+)'")
DID_YOU_MEAN = re.compile(r"did you mean (.+?)\?")

BAD_NAMES = ["", "a b", "tok\\wiki", "grid[0]", "a/**", "gs://bucket/x", "/abs", "a/../b",
             "x.marin/y", "zero\u200bwidth", "cafe\u0301"]  # fmt: skip
BAD_VERSIONS = ["", "v 1", "v1\t", "a/b", "v[1]", "..", "v1.marin", "x" * 300, "b@v1"]


def suggestions(message: str) -> list[str]:
    return SUGGESTED.findall(message)


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_suggested_names_are_valid(bad: str) -> None:
    with pytest.raises(InvalidStepError) as info:
        validate_name(bad)
    for value in suggestions(info.value.fix):
        validate_name(value)


@pytest.mark.parametrize("bad", BAD_VERSIONS)
def test_suggested_versions_are_valid(bad: str) -> None:
    with pytest.raises(InvalidStepError) as info:
        validate_version(bad, "tokenized/wiki")
    found = suggestions(info.value.fix)
    for value in found:
        validate_version(value, "tokenized/wiki")  # 'tokenized/wiki' was suggested here once


def test_apply_without_version_names_the_step_and_a_valid_fix() -> None:
    with pytest.raises(InvalidStepError) as info:
        apply("tokenized/wiki", lambda: None)  # type: ignore[call-arg]
    error = info.value
    assert error.step == "tokenized/wiki" and "version=" in error.what
    (value,) = suggestions(error.fix)
    apply("tokenized/wiki", lambda: None, version=value)


@pytest.mark.parametrize(
    ("command", "typo"),
    [
        (["plan", EXAMPLE, "--force"], "ngram/datset"),
        (["plan", EXAMPLE, "--force"], "ngram/datset@v1"),
        (["plan", EXAMPLE, "--select"], "ngram/eval/bigram-addk"),
        (["plan", EXAMPLE, "--exclude"], "ngram/reprt"),
        (["why", EXAMPLE], "ngram/datset"),
        (["show", "--prefix", "{prefix}"], "ngram/datset"),
        (["show", "--prefix", "{prefix}"], "ngram/datset@v1"),
        (["show", "--prefix", "{prefix}"], "ngram/dataset@v2"),
        (["diff", "ngram/report@v1", "--prefix", "{prefix}"], "ngram/reprot@v1"),
    ],
)
def test_did_you_mean_everywhere_a_name_is_taken(
    command: list[str], typo: str, built_example: str
) -> None:
    args = [a.replace("{prefix}", built_example) for a in command]
    extra = [] if "--prefix" in args else ["--prefix", built_example]
    bad = marin(*args, typo, *extra)
    assert bad.returncode == 2, bad.stderr
    match = DID_YOU_MEAN.search(bad.stderr)
    assert match, bad.stderr
    for name in match.group(1).split(" or "):
        fixed = marin(*args, name, *extra)
        assert fixed.returncode in (0, 1), fixed.stderr  # diff: 1 means "they differ"


def test_show_of_a_version_that_does_not_exist_says_which_do(built_example: str) -> None:
    bad = marin("show", "ngram/dataset@v2", "--prefix", built_example)
    assert bad.returncode == 2, bad.stderr
    assert "v1 of ngram/dataset exists here: did you mean ngram/dataset@v1?" in bad.stderr


@pytest.mark.parametrize(
    ("typed", "typo", "meant"),
    [
        (["plan", EXAMPLE, "--prefx", "/tmp/p"], "--prefx", "--prefix"),
        (["plan", EXAMPLE, "--on-drift", "warm"], "warm", "warn"),
        (["pln", EXAMPLE], "pln", "plan"),
        (["ls", "--stauts", "built"], "--stauts", "--status"),
        (["export", "airflw", EXAMPLE], "airflw", "airflow"),
        (["export", "airflow", EXAMPLE, "--exectuor", "celery"], "--exectuor", "--executor"),
        (["run", EXAMPLE, "--max-concurent=3"], "--max-concurent", "--max-concurrent"),
    ],
)
def test_argparse_mistakes_get_a_did_you_mean_too(
    typed: list[str], typo: str, meant: str
) -> None:
    """Issue 55: a misspelled option, sub-command or choice (argparse's, not a step name) gets
    the same did-you-mean, and what it suggests parses."""
    bad = marin(*typed)
    assert bad.returncode == 2 and "usage:" in bad.stderr, bad.stderr
    match = DID_YOU_MEAN.search(bad.stderr.splitlines()[-1])
    assert match and match.group(1) == meant, bad.stderr
    fixed = [word.replace(typo, meant) for word in typed]
    assert build_parser().parse_args(fixed).command == fixed[0]


def test_an_argument_with_nothing_close_gets_no_guess(built_example: str) -> None:
    bad = marin("ls", "--wat", "--prefix", built_example)
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1] == "marin ls: error: unrecognized arguments: --wat"
