"""The status column agrees with the action, the plan's summary counts one thing at a time, and a
run served with drift says so where it ends (issue 22)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.ux.helpers import EXAMPLE, marin

ACTION_OF = {
    "built": {"skip"},
    "stale": {"build", "skip"},
    "drift": {"build", "skip"},
    "run": {"build"},
    "forced": {"build"},
    "dev": {"build"},
    "failed-before": {"build"},
    "pruned": {"prune"},
}
ROW = re.compile(r"^\S\s+(build|skip|prune)\s+(\S+)\s+(\S+@\S+)")


def rows(out: str) -> dict[str, tuple[str, str]]:
    """step id -> (action, status) of a plan table."""
    found = {}
    for line in out.splitlines():
        match = ROW.match(line)
        if match:
            found[match.group(3)] = (match.group(1), match.group(2))
    return found


def test_pruned_and_stale_steps_say_so(built_example: str, drifted_example: str) -> None:
    pruned = rows(marin("plan", drifted_example, "--prefix", built_example).stdout)
    assert pruned["ngram/dataset@v2"] == ("prune", "pruned")  # was "prune run"
    forced = marin("plan", EXAMPLE, "--prefix", built_example, "--force", "ngram/dataset")
    table = rows(forced.stdout)
    assert table["ngram/dataset@v1"] == ("build", "forced")
    assert table["ngram/models/bigram-add-k@v1"] == ("build", "stale")  # was "build built"
    assert table["ngram/corpus@v1"] == ("skip", "built")
    for action, status in table.values():
        assert action in ACTION_OF[status], (action, status)
    # One count per status, each status belonging to one action: no step counted twice.
    assert forced.stdout.rstrip().endswith(
        "11 steps: 5 built, 5 stale, 1 forced; a run would build 6, skip 5"
    )
    served = marin(
        "plan", EXAMPLE, "--prefix", built_example, "--force", "ngram/dataset", "--no-cascade"
    )
    assert rows(served.stdout)["ngram/models/bigram-add-k@v1"] == ("skip", "stale")


def test_run_summary_repeats_the_drift_warning(
    built_example: str, drifted_example: str, tmp_path: Path
) -> None:
    prefix = str(tmp_path / "copy")
    shutil.copytree(built_example, prefix, symlinks=True)
    result = marin("run", drifted_example, "--prefix", prefix, "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = result.stdout[result.stdout.index("11 steps:") :]
    assert (
        "warning: 4 step(s) served although their config changed without a version bump "
        "(first: ngram/models/bigram-add-k@v1)"
    ) in summary
    clean = marin("run", EXAMPLE, "--prefix", prefix, "--no-progress")
    assert "warning:" not in clean.stdout


def test_graph_shows_the_plans_statuses(built_example: str, drifted_example: str) -> None:
    """``marin graph --prefix`` plans the targets as ``marin plan`` does: the pruned dataset
    is "pruned" (it was "to run"), and the report it does not touch stays "built"."""
    plan = rows(marin("plan", drifted_example, "--prefix", built_example).stdout)
    graph = marin("graph", drifted_example, "--format", "text", "--prefix", built_example)
    assert graph.returncode == 0, graph.stderr
    labels = {"run": "to run", "failed-before": "failed before"}
    for line in graph.stdout.splitlines():
        step = next(w for w in line.split() if "@" in w)
        _, status = plan[step]
        assert line.split(step)[0].split(None, 1)[1].strip() == labels.get(status, status), line
    assert "· pruned            ngram/dataset@v2" in graph.stdout
