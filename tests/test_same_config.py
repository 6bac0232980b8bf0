"""What is the same config (one fingerprint) and what is not (issue 49; docs/caching.md)."""

from __future__ import annotations

import collections
import datetime
import pathlib
from typing import Any

import pytest

from marin.execution.lazy import OUT, apply


def take(x: Any = None, out_path: str = "") -> None:
    return None


def fingerprint(value: Any) -> str:
    return apply("same/x", take, version="v0", x=value, out_path=OUT).fingerprint()


WHEN = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)

SAME = {
    "a tuple is the list of its items": ([1, "a"], (1, "a")),
    "a set and a frozenset of the same members": ({1, 2}, frozenset({2, 1})),
    "a set, whatever order it was built in": ({"b", "a", "c"}, {"c", "a", "b"}),
    "a dict, whatever order its keys": ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    "an OrderedDict is a dict": (collections.OrderedDict(a=1), {"a": 1}),
    "a path is its POSIX text": (pathlib.PurePosixPath("/x/y"), "/x/y"),
}

DIFFERENT = {
    "a set is not the list of its members": ({1, 2, 3}, [1, 2, 3]),
    "a set is not the tuple of its members": (frozenset({"a"}), ("a",)),
    "a datetime is not its ISO string": (WHEN, WHEN.isoformat()),
    "a date is not its ISO string": (datetime.date(2026, 11, 30), "2026-11-30"),
    "a date is not midnight of that day": (
        datetime.date(2026, 11, 30),
        datetime.datetime(2026, 11, 30),
    ),
    "a naive datetime is not an aware one": (WHEN.replace(tzinfo=None), WHEN),
    "an int is not a float": (1, 1.0),
    "a bool is not an int": (True, 1),
}


@pytest.mark.parametrize("case", SAME)
def test_the_same_config_has_one_fingerprint(case: str) -> None:
    a, b = SAME[case]
    assert fingerprint(a) == fingerprint(b), case


@pytest.mark.parametrize("case", DIFFERENT)
def test_different_configs_have_different_fingerprints(case: str) -> None:
    a, b = DIFFERENT[case]
    assert fingerprint(a) != fingerprint(b), case
