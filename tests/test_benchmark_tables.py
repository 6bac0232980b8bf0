"""The performance numbers in README.md and benchmarks/README.md come from results.json only.

``benchmarks/run.py --markdown`` writes the tables between marker comments; these tests fail
when the committed README text differs from what ``benchmarks/tables.py`` makes from the
committed ``benchmarks/results.json``, or when prose around the tables carries a measured number.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_tables", ROOT / "benchmarks" / "tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables = _tables()


def test_readme_tables_equal_what_the_script_makes_from_the_committed_results() -> None:
    results = tables.load(str(ROOT / "benchmarks" / "results.json"))
    for path, text in tables.expected(results, str(ROOT)).items():
        on_disk = Path(path).read_text(encoding="utf-8")
        assert on_disk == text, (
            f"{Path(path).relative_to(ROOT)} differs from benchmarks/results.json: run "
            "`.venv/bin/python benchmarks/run.py --tables-only --markdown`"
        )


def test_every_judged_row_of_the_committed_run_is_in_the_readme() -> None:
    """Not vacuous: the committed run has targets, and each one's value is shown."""
    results = tables.load(str(ROOT / "benchmarks" / "results.json"))
    judged = [r for r in results["rows"] if r.get("met") is not None]
    assert len(judged) >= 10
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for row in judged:
        assert f"| {row['metric']} | {row['value']:.4g} {row['unit']} |" in readme, row["metric"]


_MEASURED = re.compile(r"\b\d+(\.\d+)?\s?(ms|us|s|x|MiB|KiB|%)(?![\w-])")


def _performance_prose(text: str, start: str, stop: str | None) -> str:
    section = text[text.index(start) :]
    if stop is not None:
        section = section[: section.index(stop)]
    section = tables.strip_blocks(section)
    return re.sub(r"```.*?```", "", section, flags=re.S)  # commands, not claims


def test_no_measured_number_is_written_by_hand() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bench = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    for name, prose in (
        ("README.md Performance", _performance_prose(readme, "## Performance", "\n## ")),
        (
            "benchmarks/README.md results",
            _performance_prose(bench, "## Latest full run", "## Files"),
        ),
    ):
        found = [m.group(0) for m in _MEASURED.finditer(prose)]
        assert not found, f"{name}: hand-written measurements {found}: generate them instead"


def test_markdown_rewrites_only_the_blocks_and_is_idempotent(tmp_path: Path) -> None:
    """On a copy of the READMEs: a changed result changes exactly its cells, nothing else."""
    for rel in ("README.md", "benchmarks/README.md", "benchmarks/results.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    results = json.loads((tmp_path / "benchmarks" / "results.json").read_text())
    changed = copy.deepcopy(results)
    row = next(r for r in changed["rows"] if r.get("met") is not None)
    row["value"], row["met"] = 123456.0, False
    before = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert tables.write(changed, str(tmp_path))  # something changed
    after = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert f"| {row['metric']} | 1.235e+05 {row['unit']} |" in after
    assert tables.strip_blocks(after) == tables.strip_blocks(before)  # prose untouched
    assert tables.write(changed, str(tmp_path)) == []  # idempotent


def test_a_missing_marker_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no block 'targets'"):
        tables.fill("no markers here", {"targets": "x"}, "README.md")
