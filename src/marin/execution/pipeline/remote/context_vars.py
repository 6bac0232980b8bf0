"""The caller's context variables, carried to a remote step's job (issue 45, item 7).

A thread that runs a step sees the context variables of the code that started the run (the
executors copy the context); a job is another process, so what travels must be found again
there. At submit time each variable set in the caller's context is looked up **by identity**
among the globals of the modules loaded (``sys.modules``): one that is a module-level
variable travels as ``(module, name, pickled value)``, and the job sets it before ``fn`` runs.
What cannot travel (a variable no module holds, a value that does not pickle) is skipped with
one warning naming it and why; a step never fails for it. Marin's own variables (and the
engines') are skipped silently: the run context travels on its own, and the rest describe the
driver, not the job.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import pickle
import sys
import threading
from typing import Any

log = logging.getLogger("marin")

ENGINE_PACKAGES = ("marin", "marin_airflow", "marin_prefect", "prefect", "airflow", "ray")
"""Packages whose context variables describe the driver's engine, not the step: not sent."""

Carried = list[tuple[str, str, bytes]]
"""``(module, name, pickled value)`` of each variable that travels."""

_lock = threading.Lock()
_where: dict[int, tuple[str, str]] = {}
"""id(var) -> (module, name), checked by identity on every use (an id can be reused)."""
_warned: set[str] = set()
"""What was warned about already ("variable (why)"): a pipeline of many steps warns once."""


def _find(var: contextvars.ContextVar[Any]) -> tuple[str, str] | None:
    """The ``(module, name)`` of a module global that is ``var`` itself, or None."""
    with _lock:
        known = _where.get(id(var))
    if known is not None and getattr(sys.modules.get(known[0]), known[1], None) is var:
        return known
    for module_name, module in list(sys.modules.items()):
        found = next(
            (k for k, v in list(getattr(module, "__dict__", {}).items()) if v is var), None
        )
        if found is not None and module_name != "__main__":
            with _lock:
                _where[id(var)] = (module_name, found)
            return module_name, found
    return None


def _is_engine(module_name: str) -> bool:
    return module_name.split(".", 1)[0] in ENGINE_PACKAGES


def capture(step_id: str) -> Carried:
    """The caller's context variables that can travel to the job; the rest warned about."""
    carried: Carried = []
    skipped: list[str] = []
    for var, value in contextvars.copy_context().items():
        where = _find(var)
        if where is None:
            if not var.name.startswith("marin_"):
                skipped.append(f"{var.name} (not a global of an importable module)")
            continue
        if _is_engine(where[0]):
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


def payload(step_id: str) -> bytes:
    """The third pickle of a job's call file (``isolated_child`` reads it if present)."""
    return pickle.dumps({"context_vars": capture(step_id)}, protocol=pickle.HIGHEST_PROTOCOL)


def restore(carried: Carried) -> None:
    """In the job, before ``fn`` runs: set each carried variable; one that cannot be found or
    unpickled here is reported on stderr (the job's log) and skipped."""
    for module_name, name, data in carried:
        try:
            var = getattr(importlib.import_module(module_name), name)
            if not isinstance(var, contextvars.ContextVar):
                raise TypeError(f"{module_name}.{name} is not a ContextVar here")
            var.set(pickle.loads(data))
        except Exception as exc:
            print(
                f"marin: context variable {module_name}.{name} not restored in the job: "
                f"{type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
