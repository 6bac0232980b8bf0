"""Every relative link in the project's Markdown files points at a file that exists, and every
``#anchor`` at a heading of that file (GitHub's slug rules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def markdown_files() -> list[Path]:
    files = [p for p in ROOT.glob("*.md")]
    for folder in ("docs", "benchmarks", "examples", "dags"):
        files += (ROOT / folder).rglob("*.md")
    return sorted(files)


def _prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps only its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in _prose_lines(path):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def test_slug_follows_githubs_rules() -> None:
    assert slug("Threat model: who can choose what to run") == (
        "threat-model-who-can-choose-what-to-run"
    )
    assert slug("`marin run --json`, the report") == "marin-run---json-the-report"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(path: Path) -> None:
    broken = []
    for line in _prose_lines(path):
        for url in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", url):  # http:, https:, mailto: ...
                continue
            file_part, _, anchor = url.partition("#")
            target = (path.parent / file_part).resolve() if file_part else path
            if not target.exists():
                broken.append(f"{url}: no file {target.relative_to(ROOT)}")
                continue
            if anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{url}: no heading #{anchor} in {target.relative_to(ROOT)}")
    assert broken == []
