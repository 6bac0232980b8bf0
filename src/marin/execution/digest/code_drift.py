"""Code drift: whether a step's code changed since its record was built, and what changed.

Reported like config drift (``drift.py``), one line per changed function or class, naming the
file and the line of the first changed statement, and the caller when it is a callee:
``code: tokenize changed (examples/ngram.py, line 17), called by train_model``. Only two known
digests of one scheme are compared: an unknown digest is never drift.
"""

from __future__ import annotations

from marin.execution.digest.code import OBJECT_STATE, CodeDigest, CodePart


def code_drifted(stored: CodeDigest, current: CodeDigest) -> bool:
    """Both digests known, of one scheme, and different: the only case reported as drift."""
    return (
        stored.digest is not None
        and current.digest is not None
        and stored.scheme == current.scheme
        and stored.digest != current.digest
    )


def explain_code_drift(stored: CodeDigest, current: CodeDigest, limit: int = 20) -> list[str]:
    """One line per changed part, ``code: train_model changed (examples/ngram.py, line 42)``;
    a callee says so: ``code: tokenize changed (examples/ngram.py, line 17), called by
    train_model``. Empty when nothing is reported as drift."""
    if not code_drifted(stored, current):
        return []
    before = {p.name: p for p in stored.parts}
    now = {p.name for p in current.parts}
    lines: list[str] = []
    for part in current.parts:
        old = before.get(part.name)
        if old is None:
            lines.append(f"code: {part.via or part.name} now calls {part.name} ({_where(part)})")
        elif part.digest is None and old.digest is not None and part.unknown:
            lines.append(f"code: {part.name} not compared now ({part.unknown})")
        elif old.digest is None or part.digest is None or old.digest == part.digest:
            continue
        elif part.name.endswith(OBJECT_STATE):  # a field of the object a step function carries
            lines.append(f"code: {part.name} changed ({_fields_changed(old, part)}), "
                         f"the object of {part.via}")  # fmt: skip
        elif part.file == _NO_FILE:  # made at run time: no line to name (red team r35-2)
            text = f"code: {part.name} changed ({_where(part)})"
            lines.append(text + (f", called by {part.via}" if part.via else ""))
        else:
            line, why = _changed_line(old, part)
            text = f"code: {part.name} changed ({part.file}, line {line}{why})"
            lines.append(text + (f", called by {part.via}" if part.via else ""))
    for old in stored.parts:
        if old.name in now:
            continue
        if old.digest is None and old.unknown:  # (held from before a reload: red team r55-1)
            lines.append(f"code: {old.name} was not compared when it was built ({old.unknown})")
        else:
            lines.append(f"code: {old.via or current.name} no longer calls {old.name}")
    if not lines:
        lines.append(f"code: {current.name} changed")
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more changed part(s)"]
    return lines


_NO_FILE = "?"
"""A part's file when it has none: the state of an object made at run time."""


def _where(part: CodePart) -> str:
    if part.file == _NO_FILE and part.name.endswith(".<patched>"):
        return "project functions set on a library class"
    if part.file == _NO_FILE:
        return "the state of an object a module-level value holds"
    return f"{part.file}, line {part.line}"


def _fields_changed(old: CodePart, new: CodePart) -> str:
    """Which fields of an object changed, by name: each statement of its part is the hash of a
    field's name, then of its value (no line: the object was made at run time)."""
    half = len(new.statements[0]) // 2 if new.statements else 0
    before = {s[:half]: s for s in old.statements}
    changed = [
        n for s, n in zip(new.statements, new.labels, strict=False) if before.get(s[:half]) != s
    ]
    if len(changed) == 1:
        return f"a field's value: {changed[0]}"
    if changed:
        return f"fields' values: {', '.join(changed)}"
    gone = {s[:half] for s in old.statements} - {s[:half] for s in new.statements}
    return "a field removed" if gone and half else "a field's value"


def _changed_line(old: CodePart, new: CodePart) -> tuple[int, str]:
    """The current line of the first difference, and a note when it is not in the syntax."""
    if old.header != new.header:
        return new.line, ""
    for i, statement in enumerate(new.statements):
        if i >= len(old.statements) or old.statements[i] != statement:
            return (new.statement_lines[i] if i < len(new.statement_lines) else new.line), ""
    if len(old.statements) > len(new.statements):
        last = new.statement_lines[-1] if new.statement_lines else new.line
        return last, ": statements removed at the end"
    return new.line, ": a module- or class-level value it reads"
