"""Issue 53.16: a token in an ``https://`` prefix's query or fragment is refused, and never
shown (as credentials before ``@`` are refused), wherever a prefix is taken."""

from __future__ import annotations

import pytest

from tests.ux.helpers import EXAMPLE, marin

SECRET = "hunter2"


@pytest.mark.parametrize(
    "prefix",
    [
        f"https://data.example.com/runs?token={SECRET}",
        f"https://data.example.com/runs#access_token={SECRET}",
        f"HTTP://data.example.com/runs/?sig={SECRET}&x=1",
        f"s3://bucket/runs?versionId={SECRET}",  # refused before too, but echoed
    ],
)
@pytest.mark.parametrize("command", [("plan", EXAMPLE), ("gc", EXAMPLE, "--dry-run"), ("ls",)])
def test_a_token_in_a_prefix_query_is_refused_without_showing_it(
    prefix: str, command: tuple[str, ...]
) -> None:
    for given in (("--prefix", prefix), ()):
        result = marin(*command, *given, env={"MARIN_PREFIX": prefix})
        assert result.returncode == 2, result.stderr
        assert SECRET not in result.stdout + result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert "***" in result.stderr
