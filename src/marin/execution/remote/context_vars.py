"""The caller's context variables, carried to a remote step's job (issue 45, item 7).

A thread that runs a step sees the context variables of the code that started the run (the
executors copy the context); a job is another process, so what travels must be found again
there. At submit time each variable set in the caller's context is looked up **by identity**
among the globals of the modules loaded (``sys.modules``) and the attributes of the classes
they define: one found travels as ``(module, name, pickled value)``, and the job sets it
before ``fn`` runs.
What cannot travel (a variable no module holds, a value that does not pickle) is skipped with
one warning naming it and why; a step never fails for it. Marin's own variables (and the
engines') are skipped silently: the run context travels on its own, and the rest describe the
driver, not the job.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import logging
import pickle
import sys
import threading
import types
from typing import Any

from marin.execution.remote.code_check import check_code

log = logging.getLogger("marin")

ENGINE_PACKAGES = ("marin", "marin_airflow", "marin_prefect", "prefect", "airflow", "ray")
"""Packages whose context variables describe the driver's engine, not the step: not sent."""
QUIET_PACKAGES = (*ENGINE_PACKAGES, "opentelemetry", "decimal")
"""A variable found nowhere whose value comes from one of these is skipped without a warning:
the engine's, tracing's (OpenTelemetry keeps its variable in an object) and ``decimal``'s
(CPython keeps it in C); a job sets up its own."""
QUIET_PREFIXES = ("structlog_",)
"""Names of variables found nowhere skipped without a warning: structlog keeps its variables
in a dict, and Airflow's task runner binds them for its own logs."""

Carried = list[tuple[str, str, bytes]]
"""``(module, name, pickled value)`` of each variable that travels."""

_lock = threading.Lock()
_where: dict[int, tuple[str, str]] = {}
"""id(var) -> (module, name), checked by identity on every use (an id can be reused)."""
_nowhere: dict[int, contextvars.ContextVar[Any]] = {}
"""Variables held by no module (kept alive here, so their ids are not reused): not looked for
again (the search reads every loaded module)."""
_warned: set[str] = set()
"""What was warned about already ("variable (why)"): a pipeline of many steps warns once."""


def _find(var: contextvars.ContextVar[Any]) -> tuple[str, str] | None:
    """Where ``var`` itself is held: ``(module, name)`` for a module global, ``(module,
    "Class.name")`` for an attribute of a class the module defines (how Prefect keeps its
    context's variables); None if neither."""
    with _lock:
        known = _where.get(id(var))
        if _nowhere.get(id(var)) is var:
            return None
    if known is not None and _resolve(known) is var:
        return known
    for module_name, module in list(sys.modules.items()):
        if module_name in ("__main__", "__mp_main__"):  # another module in the job
            continue
        if not issubclass(type(module), types.ModuleType):  # never a proxy's attributes
            continue
        found = _held_by(var, module_name, vars(module))
        if found is not None:
            with _lock:
                _where[id(var)] = (module_name, found)
            return module_name, found
    with _lock:
        _nowhere[id(var)] = var
    return None


def _held_by(var: Any, module_name: str, namespace: dict[str, Any]) -> str | None:
    """The name under which ``namespace`` (a module's globals) holds ``var``, or a class it
    defines does (``Class.name``). Reads only dicts and real types: a global that is a lazy
    proxy is never asked anything (``isinstance`` would read its ``__class__``)."""
    for name, value in list(namespace.items()):
        if value is var:
            return name
        if issubclass(type(value), type) and vars(value).get("__module__") == module_name:
            inner = next((k for k, v in list(vars(value).items()) if v is var), None)
            if inner is not None:
                return f"{name}.{inner}"
    return None


def _resolve(where: tuple[str, str]) -> Any:
    """What ``(module, "name" or "Class.name")`` names in this process (None if nothing)."""
    held: Any = sys.modules.get(where[0])
    for part in where[1].split("."):
        held = getattr(held, part, None)
    return held


def _package_of(module_name: str, packages: tuple[str, ...]) -> bool:
    return module_name.split(".", 1)[0] in packages


def capture(step_id: str) -> Carried:
    """The caller's context variables that can travel to the job; the rest warned about."""
    carried: Carried = []
    skipped: list[str] = []
    for var, value in contextvars.copy_context().items():
        where = _find(var)
        if where is None:
            quiet = var.name.startswith(QUIET_PREFIXES)
            if not quiet and not _package_of(type(value).__module__, QUIET_PACKAGES):
                skipped.append(f"{var.name} (not held by a module or its classes)")
            continue
        if _package_of(where[0], ENGINE_PACKAGES):
            continue
        try:
            carried.append((*where, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)))
        except Exception as exc:
            skipped.append(f"{where[0]}.{where[1]} (its value does not pickle: {exc})")
    with _lock:
        fresh = [s for s in skipped if s not in _warned]
        _warned.update(fresh)
    if fresh:
        log.warning(
            "%s: context variables not sent to its remote job (it sees their defaults): %s",
            step_id,
            "; ".join(fresh),
        )
    return carried


def payload(step_id: str, expect_code: dict[str, Any] | None = None) -> bytes:
    """The third pickle of a job's call file: what ``isolated_child`` calls before ``fn``, with
    the call's target. Set the caller's context variables, then (``expect_code``: the code the
    job is submitted for) check the job runs that code (``code_check.py``). Never fails the
    step: if looking for variables fails (an odd module), none is carried, with a warning."""
    try:
        carried = capture(step_id)
    except Exception as exc:
        log.warning("%s: context variables not sent to its remote job: %s", step_id, exc)
        carried = []
    before: list[Any] = [functools.partial(restore, carried)]
    if expect_code is not None:
        before.append(functools.partial(check_code, expected=expect_code))
    return pickle.dumps({"before_fn": before}, protocol=pickle.HIGHEST_PROTOCOL)


def restore(carried: Carried, target: Any = None, inputs: tuple[Any, ...] = ()) -> None:
    """In the job, before ``fn`` (``target``) runs: set each carried variable; one that cannot
    be found or unpickled here is reported on stderr (the job's log) and skipped."""
    for module_name, name, data in carried:
        try:
            importlib.import_module(module_name)
            var = _resolve((module_name, name))
            if not isinstance(var, contextvars.ContextVar):
                raise TypeError(f"{module_name}.{name} is not a ContextVar here")
            var.set(pickle.loads(data))
        except Exception as exc:
            print(
                f"marin: context variable {module_name}.{name} not restored in the job: "
                f"{type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
