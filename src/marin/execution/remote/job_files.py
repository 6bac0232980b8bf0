"""The files of a ``local`` job's folder (``local.py`` says what each holds), named once for the
driver's backend and for the job's own processes (``local_job``, a gang's supervisor), which
start once per job and so import nothing heavier than this."""

from __future__ import annotations

import os

CALL, OWNER, RESULT, LOG, PID, CANCELLED, LOST, RANKS = (
    "call.pkl", "owner.json", "result.json", "log.txt", "pid.json", "cancelled", "lost.json",
    "ranks.json",
)  # fmt: skip


def rank_folder(folder: str, rank: int) -> str:
    """A gang job's rank's own files (its outcome, its log): ``<job folder>/rank-K``."""
    return os.path.join(folder, f"rank-{rank}")
