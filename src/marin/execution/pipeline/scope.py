"""Who runs: the user whose folder a user-scope step writes (Marin's ``identity.py``).

The user is ``$MARIN_USER``, else the OS user. Service accounts (``root``, ``nobody``, ...)
are no user at all: a user-scope step then fails saying how to set ``MARIN_USER``. A name that
is not one safe path segment is an error, never cleaned up into another user's folder.
"""

from __future__ import annotations

import getpass
import os
import re

from marin.execution.errors import InvalidStepError
from marin.execution.vocabulary import OutputScope

USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""One path segment, no ``..``: the same on every file system and object store."""
NO_USER = frozenset({"", "root", "nobody", "runner", "user", "admin", "daemon", "airflow"})
"""Shared service identities: outputs scoped to them would be everybody's."""
SET_USER = (
    "set MARIN_USER to your user name (letters, digits, '_', '-', '.'), e.g. MARIN_USER=alice"
)


def check_scope(value: object, step: str | None = None) -> OutputScope:
    """``value`` as an ``OutputScope``; an error naming the step and the choices otherwise."""
    if isinstance(value, str) and value in OutputScope.__members__.values():
        return OutputScope(value)
    raise InvalidStepError(f"scope={value!r}", f"use one of {', '.join(OutputScope)}", step)


def current_user() -> str | None:
    """``$MARIN_USER``, else the OS user; None for a service account (``NO_USER``)."""
    raw = os.environ.get("MARIN_USER", "").strip()
    if not raw:
        try:
            raw = getpass.getuser().strip()
        except (KeyError, OSError):  # no passwd entry (a container): no user
            return None
    if raw.lower() in NO_USER:
        return None
    if not USER_NAME.fullmatch(raw) or ".." in raw:
        raise InvalidStepError(f"user name {raw!r} is not one path segment", SET_USER)
    return raw


def required_user(step: str) -> str:
    """The user for a user-scope ``step``; an error saying how to set one when there is none."""
    user = current_user()
    if user is None:
        raise InvalidStepError(
            "a user-scope step needs a user, and this process runs as a service account", SET_USER,
            step,
        )  # fmt: skip
    return user
