"""The plan table fits the terminal; ``--json`` keeps the full data (issue 22)."""

from __future__ import annotations

import json

import pytest

from tests.ux.helpers import marin


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_plan_fits_the_terminal(columns: int, built_example: str, drifted_example: str) -> None:
    result = marin(
        "plan", drifted_example, "--prefix", built_example, env={"COLUMNS": str(columns)}
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    too_wide = [line for line in lines[1:-1] if len(line) > columns]  # the table itself
    assert not too_wide, too_wide
    assert lines[0].startswith(f"prefix: {built_example} ")
    # Outputs are relative to the prefix, which is printed once, above the table.
    assert result.stdout.count(built_example) == 1
    # The reason wraps instead of being cut: every word of it is still there.
    text = " ".join(result.stdout.split())
    assert "nothing that runs needs it" in text or "nothing that runs needs" in text


def test_plan_json_keeps_full_paths(built_example: str, drifted_example: str) -> None:
    result = marin(
        "plan", drifted_example, "--prefix", built_example, "--json", env={"COLUMNS": "60"}
    )
    steps = json.loads(result.stdout)["steps"]
    assert all(s["output_path"].startswith(built_example + "/") for s in steps)
    reasons = {s["step"]: s["reason"] for s in steps}
    assert reasons["ngram/dataset@v2"] == (
        "pruned: not built (new: no record yet), and nothing that runs needs it"
    )
