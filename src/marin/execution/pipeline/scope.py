"""Who runs: the user whose folder a user-scope step writes (Marin's ``identity.py``).

The user is ``$MARIN_USER``, else the OS user. Service accounts (``root``, ``nobody``, ...)
are no user at all: a user-scope step then fails saying how to set ``MARIN_USER``. A name that
is not one safe path segment is an error, never cleaned up into another user's folder.
"""

from __future__ import annotations

import getpass
import os
import re

from marin.execution.errors import InvalidStepError, brief
from marin.execution.names import validate_name
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


def user_named(raw: str, where: str = "user name", fix: str = SET_USER) -> str | None:
    """``raw`` as a user: None for a service account (``NO_USER``); an error naming ``where``
    and ``fix`` when it is not one path segment, or one that collides with Marin's own names
    (``alice.marin`` would be the metadata folder of ``users/alice``, in any letter case)."""
    raw = raw.strip()
    if raw.lower() in NO_USER:
        return None
    if not USER_NAME.fullmatch(raw) or ".." in raw:
        raise InvalidStepError(f"{where} {brief(raw)} is not one path segment", fix)
    try:
        validate_name(raw)  # the name grammar: no '.marin' suffix, no trailing '.', no 'CON'
    except InvalidStepError as exc:
        advice = exc.fix.split(";", 1)[0].split(" (e.g.", 1)[0]
        why = f"{exc.what.removeprefix('name ')}: {advice}"
        raise InvalidStepError(f"{where} {brief(raw)} cannot name a folder ({why})", fix) from None
    return raw


def current_user() -> str | None:
    """``$MARIN_USER``, else the OS user; None for a service account (``NO_USER``)."""
    raw = os.environ.get("MARIN_USER", "").strip()
    if not raw:
        try:
            raw = getpass.getuser().strip()
        except (KeyError, OSError):  # no passwd entry (a container): no user
            return None
    return user_named(raw)


def user_param(param: object, fix: str) -> str | None:
    """A run's ``user`` param (whoever triggered the run's data): the user it names, None when
    unset or a service account; an error (``fix``: how to give one) unless one path segment."""
    if param is None or param == "":
        return None
    if not isinstance(param, str):
        raise InvalidStepError(f"param user={brief(param)} is not a string", fix)
    return user_named(param, "param user", fix)


def run_user(param: object, triggered_by: str | None, fix: str) -> str | None:
    """The user of an engine's run (Airflow, Prefect): its ``user`` param, else the user who
    triggered it (where the engine says), else ``current_user()`` on this worker; None when
    each is a service account. A name that is not one path segment is an error, never cleaned
    up into another user's folder."""
    user = user_param(param, fix)
    if user is None and triggered_by:
        user = user_named(triggered_by, "the triggering user", fix)
    return user or current_user()


def required_user(step: str, user: str | None = None) -> str:
    """``user``, else the current one, for a user-scope ``step``; an error saying how to set
    one when there is none."""
    user = user or current_user()
    if user is None:
        raise InvalidStepError(
            "a user-scope step needs a user, and this process runs as a service account", SET_USER,
            step,
        )  # fmt: skip
    return user
