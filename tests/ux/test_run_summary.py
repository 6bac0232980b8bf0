"""The run summary as a person sees it on an 80-column terminal (issue 49): one word for each
thing that happened to a step, the same as ``marin run --json``'s; long names cut in the
middle; and a Ctrl-C summary that a second interrupt cannot cut short."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest

from tests.ux.helpers import COLUMNS, EXAMPLE, PIPELINES, marin, spawn_80, strip_ansi
from tests.ux.pipelines import LONG


def summary_lines(raw: str) -> list[str]:
    """The lines printed from the summary's header on, as the terminal received them."""
    screen = strip_ansi(raw).replace("\r\n", "\n").replace("\r", "\n")
    start = screen.rindex("\nstep ") + 1
    return screen[start:].splitlines()


def assert_fits(lines: list[str]) -> None:
    """The table, its count line and the slowest steps fit (paths printed after may wrap)."""
    end = next(i for i, line in enumerate(lines) if re.match(r"\d+ steps: ", line))
    slowest = [line for line in lines[end:] if re.match(r"  +[\d.]+[smh]", line)]
    too_wide = [line for line in lines[: end + 1] + slowest if len(line) > COLUMNS]
    assert not too_wide, too_wide


def test_a_forced_rebuild_with_the_same_output_reads_unchanged(
    built_example: str, tmp_path: Path
) -> None:
    prefix = str(tmp_path / "p")
    shutil.copytree(built_example, prefix, symlinks=True)
    child = spawn_80(EXAMPLE, "--prefix", prefix, "--force", "ngram/dataset", "--no-step-output")
    raw = child.read()
    child.close()
    assert child.exitstatus == 0, raw
    lines = summary_lines(raw)
    assert_fits(lines)
    table = "\n".join(lines)
    # A forced step's readers are rebuilt (issue 43); the evaluations' bytes come out the same,
    # so the report below them is served by early cutoff.
    for step in ("dataset", "models/bigram-add-k", "eval/trigram-interpolated"):
        assert re.search(rf"^ngram/{step}@v1\s+built\s+\d", table, re.M), table
    assert re.search(r"^ngram/report@v1\s+unchanged\s+-\s+", table, re.M), table
    assert "elsewhere" not in table and "built-by-other" not in table
    assert "11 steps: 5 built, 1 unchanged, 5 skipped in " in table
    assert not re.search(r"^\s+[\d.]+s\s+ngram/report", table, re.M)  # never among the slowest
    assert "built 5 step(s), 1 unchanged, skipped 5; artifacts under" in table
    # --json says the same, in the same word (on a fresh copy: the same first forced rebuild).
    fresh = str(tmp_path / "fresh")
    shutil.copytree(built_example, fresh, symlinks=True)
    again = marin("run", EXAMPLE, "--prefix", fresh, "--force", "ngram/dataset", "--json")
    report = json.loads(again.stdout)
    assert report["summary"]["built"] == 5 and report["summary"]["unchanged"] == 1
    actions = {s["step"]: s["action"] for s in report["steps"]}
    assert actions["ngram/report@v1"] == "unchanged" and actions["ngram/corpus@v1"] == "skipped"


def test_long_names_fit_80_columns_and_stay_whole_in_json(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    child = spawn_80(f"{PIPELINES}:long_names", "--prefix", prefix, "--no-step-output")
    raw = child.read()
    child.close()
    assert child.exitstatus == 0, raw
    lines = summary_lines(raw)
    assert_fits(lines)
    assert re.fullmatch(r"step\s+result\s+duration\s+note", lines[0]), lines[0]
    rows = [line for line in lines if line.startswith("demo/")]
    assert len(rows) == 2 and all("…" in row for row in rows), rows
    # Cut in the middle: where it starts and how it ends still tell the steps apart.
    assert rows[0].split()[0].endswith("/source@v1") and rows[1].split()[1] == "built"
    slowest = [line for line in lines if "s  demo/" in line]
    assert len(slowest) == 2 and all("…" in line for line in slowest), slowest
    assert slowest[0].endswith("@v1") and "long-name@v1" in slowest[0] + slowest[1]
    # marin ls too: its table fits, the names cut the same way.
    ls = spawn_80("--prefix", prefix, command="ls")
    listing = strip_ansi(ls.read()).replace("\r\n", "\n").splitlines()
    ls.close()
    assert ls.exitstatus == 0, listing
    table = listing[: next(i for i, line in enumerate(listing) if "artifact(s)" in line)]
    assert len(table) == 3 and all(len(line) <= COLUMNS for line in table), table
    assert all("…" in line for line in table[1:]), table
    report = json.loads(
        marin("run", f"{PIPELINES}:long_names", "--prefix", prefix, "--json").stdout
    )
    assert {s["step"] for s in report["steps"]} == {
        f"{LONG}/source@v1",
        f"{LONG}/trained-model-with-a-long-name@v1",
    }


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
@pytest.mark.parametrize("attempt", range(5))
@pytest.mark.parametrize("second", ["at once", "as the display stops"])
def test_two_quick_interrupts_never_lose_the_summary(
    second: str, attempt: int, tmp_path: Path
) -> None:
    """``timeout -s INT``: a second SIGINT right after the first, or while the summary is being
    drawn (the live display has just given the terminal back)."""
    child = spawn_80(f"{PIPELINES}:pipeline", "--prefix", str(tmp_path / "p"), sleep="60")
    child.expect(r"demo/source@v1\s+(\x1b\[[\d;]*m)?\d")  # the live display shows it running
    os.kill(child.pid, signal.SIGINT)
    if second == "as the display stops":
        child.expect_exact("\x1b[?25h")  # the cursor is shown again: the summary comes next
    # It may have drawn its summary and exited already (a loaded machine): nothing to lose then.
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signal.SIGINT)
    raw = child.read()
    child.close()
    assert child.exitstatus == 130, raw
    lines = summary_lines(raw)
    table = "\n".join(lines)
    assert re.search(r"^demo/source@v1\s+interrupted", table, re.M), table
    assert re.search(r"^4 steps: (3 not run, 1 interrupted|1 interrupted, 3 not run)", table, re.M)
    assert "error: interrupted" in table
