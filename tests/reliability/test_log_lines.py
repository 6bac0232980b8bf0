"""``marin logs STEP`` (without -f) splits a job's log on newlines only: a rank's ``\\r``,
U+2028, ``\\x85``, ``\\x0c`` or ``\\x1e`` is shown escaped inside its own line, so it never
forges a line of another rank or one of Marin's (red team gang finding 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin.execution.store.step_folder import JobRecord
from marin.execution.vocabulary import JobState
from marin.step_jobs import RankLines, StepJob, follow_job_log

JOB = "marin-" + "ab" * 10


@pytest.mark.parametrize("separator", ["\r", "\u2028", "\x85", "\x0c", "\x1e", "\x1c", "\v"])
def test_a_rank_never_forges_another_ranks_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, separator: str
) -> None:
    root = tmp_path / "jobs"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("MARIN_LOCAL_JOBS", str(root))
    (root / JOB).mkdir(mode=0o700)
    forged = f"[rank 1] x{separator}[rank 0] loss=nan{separator}gang/f@v1: local job ended\n"
    (root / JOB / "log.txt").write_text("[rank 0] loss=1.0\n" + forged, encoding="utf-8")
    record = JobRecord(backend="local", job_id=JOB, build_id="b", submitted_at="", data={})
    shown: list[str] = []
    state = follow_job_log(
        StepJob(record, str(JobState.SUCCEEDED)), shown.append, follow=False, lines=10
    )
    assert state == JobState.SUCCEEDED
    text = "".join(shown)
    assert text.count("\n") == 2 and separator not in text, text
    assert text.splitlines()[1].startswith("[rank 1] x\\"), text
    rank0: list[str] = []
    RankLines(0, rank0.append)(text)
    assert rank0 == ["loss=1.0\n"]
