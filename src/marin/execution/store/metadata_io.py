"""Reading and writing the small JSON files of a step folder: untrusted text in, whole files out.

``parse_json`` parses stored metadata with a depth guard (a document nested 200,000 deep is
corrupt, never a ``RecursionError``); ``write_atomic`` writes a file so that a reader sees the
old content or the new, never a prefix of it. Every reader and writer of ``<version>.marin/``
uses these two (``records``, ``step_folder``, ``lease``).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from marin.execution import faults
from marin.execution.atomic_file import write_file_atomically
from marin.execution.store.location import Location

MAX_JSON_DEPTH = 200
"""Stored JSON nested deeper is corrupt (real configs are far shallower; the JSON encoder and the
pretty printer recurse, so a deeper value would crash ``marin show``)."""


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _depth(text: str) -> int:
    """How deeply brackets nest in JSON text, ignoring those inside strings (no recursion).

    Regular expressions drop the strings and everything but brackets first, so the Python loop
    only sees brackets (two per container).
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def too_deep(text: str) -> bool:
    """Whether JSON ``text`` nests deeper than :data:`MAX_JSON_DEPTH` (what ``parse_json``
    refuses to read): two counts, and a walk only when they allow it."""
    return text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth(text) > MAX_JSON_DEPTH


def parse_json(text: str) -> Any:
    """``json.loads`` for stored metadata.

    Raises:
        ValueError: malformed JSON, or nested deeper than :data:`MAX_JSON_DEPTH` (never a
            ``RecursionError``).
    """
    if too_deep(text):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def write_atomic(
    location: Location, path: str, data: bytes, *, crash_step: str = "", durable: bool = False
) -> None:
    """Write so that readers see the old content or the new, never a prefix of it.

    Object stores and ``memory://`` make a single put atomic. On local disk a crash mid-write
    would leave a truncated file, so we write a temporary sibling and rename it into place (a
    crash leaves only the temporary file, which the next build of the step clears).
    ``crash_step`` names the step for the ``record-write`` / ``record-torn`` fault hooks.
    ``durable`` fsyncs the file (durable mode, ``MARIN_DURABLE=1``, for records).

    Raises:
        SymlinkError: a folder on the way to ``path`` is a symbolic link (local disk; the file
            itself is replaced by a rename, which never follows one).
        StorageError: storage kept failing (object stores).
    """
    fs = location.fs
    if crash_step and faults.should_crash("record-torn", crash_step):
        fs.pipe_file(path, data[: len(data) // 2])  # what a non-atomic store could leave
        faults.crash_now()
    if location.is_local:
        location.check_no_links(os.path.dirname(path))  # a rename never follows the file itself

        def torn_write(fd: int) -> None:
            if crash_step and faults.should_crash("record-write", crash_step):
                os.write(fd, data[: len(data) // 2])
                faults.crash_now()

        # ENOSPC, EIO, an interrupt: the helper never leaves a (possibly huge) temporary file.
        write_file_atomically(path, data, fsync=durable, make_parents=True, on_open=torn_write)
    else:
        if crash_step and faults.should_crash("record-write", crash_step):
            faults.crash_now()  # a single PUT is all or nothing: the crash leaves no record
        location.put_file(path, data)
