"""A remote step's job sees the caller's context variables, as a thread would (issue 45,
item 7): the real ``local`` backend, a detached process."""

from __future__ import annotations

import contextvars
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from marin.execution.builder.commit import build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.context import current_context
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record

TAG: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("test_tag")
"""A module global: found in the job by its module and name."""
LOCK: contextvars.ContextVar[Any] = contextvars.ContextVar("test_lock", default=None)
"""A module global whose value (a lock) does not pickle: skipped, with a warning."""


class Holder:
    """A variable kept as a class attribute (as Prefect keeps its own): found too."""

    VAR: contextvars.ContextVar[int] = contextvars.ContextVar("test_in_class", default=0)


class _Proxy:
    """A lazy proxy as some libraries keep in a module global: asking it anything resolves it."""

    resolved = 0

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        _Proxy.resolved += 1
        return dict

    def __getattr__(self, name: str) -> Any:
        _Proxy.resolved += 1
        raise AttributeError(name)


PROXY = _Proxy()
"""Never resolved by the search for the variables to send (no user code runs at submit)."""


def seen(out_path: str) -> dict[str, Any]:
    """What the job sees of the caller's context."""
    return {
        "tag": TAG.get({"run": "unset"}),
        "lock": LOCK.get() is None,
        "in_class": Holder.VAR.get(),
        "out": current_context().output_path == out_path,
    }


def _build(tmp_path: Path, name: str, runner: bool = False) -> Any:
    """Through ``build_step`` in this thread, or (``runner``) a ``StepRunner``'s thread."""
    spec = apply(name, seen, version="v1", out_path=OUT).with_options(remote="local").lower()
    location = open_prefix(str(tmp_path / "prefix"))
    if runner:
        StepRunner(RunOptions(max_concurrent=2), prefix=str(tmp_path / "prefix")).run([spec])
        record = read_record(location, spec.output_path)
        assert record is not None
        return record.result
    return build_step(BuildRequest(spec, location)).record.result


def test_context_variables_reach_the_job_and_what_cannot_travel_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local: contextvars.ContextVar[str] = contextvars.ContextVar("test_local_only")

    def run() -> list[Any]:
        TAG.set({"run": "r1"})
        LOCK.set(threading.Lock())
        Holder.VAR.set(7)
        local.set("not a module global")
        return [_build(tmp_path, "ctx/a"), _build(tmp_path, "ctx/b", runner=True)]

    with caplog.at_level(logging.WARNING, logger="marin"):
        first, second = contextvars.copy_context().run(run)
    assert first == second == {"tag": {"run": "r1"}, "lock": True, "in_class": 7, "out": True}
    warnings = [r.getMessage() for r in caplog.records if "context variables" in r.getMessage()]
    assert len(warnings) == 1, warnings  # one warning, not one per step
    assert "ctx/a@v1" in warnings[0]
    assert "test_local_only (not held by a module or its classes)" in warnings[0]
    assert f"{__name__}.LOCK (its value does not pickle" in warnings[0]


def test_the_search_for_variables_never_resolves_a_lazy_proxy() -> None:
    from marin.execution.remote.context_vars import capture

    _Proxy.resolved = 0  # pytest's collection asked it things
    token = TAG.set({"run": "proxy"})
    try:
        carried = capture("proxy@v1")
    finally:
        TAG.reset(token)
    assert (__name__, "TAG") in [(module, name) for module, name, _ in carried]
    assert _Proxy.resolved == 0
