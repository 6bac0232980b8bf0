"""What a reader of a dependency gets through ``ctx.resolved(dep)`` is what early cutoff compares:
the same form in the run that built the dependency and in any later run (red team round 7)."""

from __future__ import annotations

import pathlib
from typing import Any

from marin.execution.lazy import OUT, apply, run
from marin.execution.pipeline.context import current_context


def _constant(out: str, k: int) -> dict[str, int]:
    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    pathlib.Path(out, "d.txt").write_text("same bytes")
    return {"b": 1, "a": 2}


def _read_upstream(dep: str, out: str) -> dict[str, Any]:
    upstream = current_context().resolved("up@v1")  # ``dep`` is its path
    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    return {"keys": list(upstream.result), "k": upstream.record.config["k"]}


def _pipeline(k: int) -> tuple[Any, Any]:
    upstream = apply("up", _constant, version="v1", out=OUT, k=k)
    return upstream, apply("reader", _read_upstream, version="v1", dep=upstream, out=OUT)


def test_a_reader_in_the_same_run_gets_the_result_as_stored(tmp_path: pathlib.Path) -> None:
    """r7-11: a reader built in the upstream's run got the returned dict in ``fn``'s key order,
    a reader built later the stored (sorted) one; cutoff compares the stored one only."""
    _, reader = _pipeline(1)
    same_run = run(reader, prefix=str(tmp_path / "one"))[0].result
    later_run = tmp_path / "two"
    run(_pipeline(1)[0], prefix=str(later_run))
    assert run(reader, prefix=str(later_run))[0].result == same_run
    assert same_run["keys"] == ["a", "b"]


def test_a_config_changed_into_the_same_bytes_is_never_cut_off(tmp_path: pathlib.Path) -> None:
    """r7-8: ``up``'s config changed without a version bump and rebuilt (``on_drift="rebuild"``)
    into the very same bytes and result; its reader, which reads ``record.config``, was served
    ``unchanged`` with the old value."""
    prefix = str(tmp_path / "p")
    assert run(_pipeline(1)[1], prefix=prefix)[0].result["k"] == 1
    again = run(_pipeline(2)[1], prefix=prefix, on_drift="rebuild")[0]
    assert again.result["k"] == 2
