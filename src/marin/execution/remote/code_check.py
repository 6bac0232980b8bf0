"""A remote job runs the code it was submitted for, or fails saying so.

A job imports the pipeline's source when it starts, not when it is submitted: a ``local`` job a
moment later, a queued cluster job hours later. If the source was edited in between, the job
would run other code than its ``job.json`` (and the record it commits) names. So the submit
sends the code digest of the build's recipe (``expected_code``), and the job, once its modules
are imported and before ``fn`` runs, digests ``fn`` and its config's objects again
(``check_code``, called by ``isolated_child``): a function or class whose digest differs fails
the job with an error naming the step and the fix. Only what both sides can see is compared: a
part that one side cannot digest (no source there, or a module the job's host installs as a
library) is not, and a job whose ``fn`` has no digest at all runs unchecked, with a line in its
log.

The same rule holds wherever ``fn`` runs in a process that imports the pipeline itself: an
``isolate=True`` step's child (the build hands its check to ``isolated_child``) and a Prefect
build on a Dask worker (``marin_prefect.dask``). Each fails with ``CodeChangedError`` there.

A process that keeps running (a Dask worker) keeps the modules it imported, while the digest
reads the files as they are now: an edit that leaves a definition where it was would digest as
the driver's new code while the old one runs. So each part's file is also compared with the
file as this process's first check of it found it (``_edited_since_first_check``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from marin.execution.digest.code import OBJECT_STATE, SOURCE_EDITED, CodeDigest, code_digest
from marin.execution.errors import CodeChangedError, MarinError, RemoteJobError


def expected_code(step_id: str, code: CodeDigest) -> dict[str, Any] | None:
    """What a job checks (None when the digest is unknown: nothing to check against)."""
    if code.digest is None:
        return None
    parts = {p.name: p.digest for p in code.parts if p.digest is not None}
    return {"step": step_id, "digest": code.digest, "root": code.name, "parts": parts}


def check_code(
    target: Any, inputs: tuple[Any, ...] = (), *, expected: Any, where: str = "job"
) -> None:
    """In the job, before ``fn`` runs: raise unless ``target``, with the objects of the config
    it is called with (``inputs``: their classes' methods are the step's code too, red team
    r29-3), is the code it was submitted for (see the module docstring). ``expected`` comes
    from the call file, as sent; ``where`` names the process that checks (``job``, or
    ``isolated process``, ``Dask worker``).

    Raises:
        RemoteJobError: a function or class of the step's code changed since the submit.
        CodeChangedError: the same, in a process other than a job.
    """
    if not isinstance(expected, dict) or not isinstance(expected.get("parts"), dict):
        return
    now = code_digest(target, inputs)
    edited = [name for name in _edited_since_first_check(now) if name in expected["parts"]]
    if edited:
        raise _changed(", ".join(edited), where, str(expected.get("step", "?")), seen_edited=True)
    if now.digest is None:
        # A part known at lowering whose file no longer holds the code this process runs: it
        # imported the code before an edit the run lowered after, or the other way round.
        edited = [p.name for p in now.parts if p.unknown == SOURCE_EDITED]
        if any(name in expected["parts"] for name in edited):
            raise _changed(
                ", ".join(edited), where, str(expected.get("step", "?")), seen_edited=True
            )
        print(f"marin: the {where}'s code was not checked ({now.unknown})", file=sys.stderr)
        return
    if now.digest == expected.get("digest"):
        return
    seen = {p.name: p.digest for p in now.parts if p.digest is not None}
    changed = [
        name
        for name, digest in expected["parts"].items()
        if name in seen and seen[name] != digest and not name.endswith(OBJECT_STATE)
    ]  # an object's fields travel with the call, as they were at submit: not a source edit
    if now.name != expected.get("root"):
        changed.insert(0, f"{expected.get('root')} (now {now.name})")
    if not changed:
        return  # only parts one side cannot see differ (a library on the job's host)
    raise _changed(", ".join(changed), where, str(expected.get("step", "?")))


_FIRST_CHECKED: dict[str, tuple[int, int]] = {}
"""Each source file's modification time (ns) and size when this process first checked code
in it: a process imports a module once, so a later change is code it does not run."""


def _edited_since_first_check(code: CodeDigest) -> list[str]:
    """The parts of ``code`` whose file changed since this process's first check of it."""
    changed = []
    for part in code.parts:
        path = part.source  # ``file`` is relative to the project, not to this working folder
        if not path:
            continue
        try:
            stat = os.stat(path)
        except OSError:
            continue
        seen = (stat.st_mtime_ns, stat.st_size)
        if _FIRST_CHECKED.setdefault(path, seen) != seen:
            changed.append(part.name)
    return changed


_SAME_VALUE = (
    "; if nothing was edited, a module-level value it reads differs between processes (a set's "
    "order: run with PYTHONHASHSEED=0; data read at import): make it the same in every process "
    "or pass it in the config"
)
"""Said with a code check failure no file edit explains: such a value fails every attempt
(red team r30-4)."""


def _changed(changed: str, where: str, step: str, seen_edited: bool = False) -> MarinError:
    """The error of a process that imported other code than the run lowered (``seen_edited``:
    a file of that code was seen to change, so no value differing between processes is)."""
    hint = "" if seen_edited else _SAME_VALUE
    if where == "job":
        return RemoteJobError(
            f"the job runs other code than it was submitted for: {changed} changed after the "
            "run lowered the pipeline (the source was edited before the job imported it)",
            "run again: the run submits a job of the code as it is now (leave the source as it "
            f"is while a run submits jobs){hint}",
            step,
        )
    also = ""
    if where == "Dask worker":  # a worker keeps the pipeline module it loaded first
        also = "; every worker needs the driver's code: restart workers that loaded an older copy"
    return CodeChangedError(
        f"the {where} runs other code than the run lowered: {changed} changed between the "
        f"run's lowering and the {where}'s import of it, or since that import; nothing was "
        "committed",
        f"run again: the run lowers the code as it is now (leave the source as it is while a "
        f"run runs{also}){hint}",
        step,
    )
