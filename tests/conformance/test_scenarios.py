"""The behaviour every runner must share: order, exactly-once, skipping, limits, failure."""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from typing import Any

import pytest

from tests.conformance.scenarios import LIMIT_ENV, WIDE_LEAVES, read_calls

S = "tests.conformance.scenarios"


def events(calls: list[dict[str, Any]], event: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for call in calls:
        if call["event"] == event:
            assert call["step"] not in out, f"{call['step']} {event} twice"
            out[call["step"]] = call["t"]
    return out


def record(prefix: str, name: str) -> dict[str, Any]:
    with open(os.path.join(prefix, "conformance", name, "v1.marin", "record.json")) as f:
        return dict(json.load(f))


def test_chain_runs_in_order_once(
    runner: Any, local_prefix: str, env: dict[str, str], calls_file: str
) -> None:
    assert runner.run(f"{S}:chain", prefix=local_prefix, env=env)
    starts, ends = events(read_calls(calls_file), "start"), events(read_calls(calls_file), "end")
    assert set(starts) == {"a", "b", "c"}
    assert ends["a"] <= starts["b"] and ends["b"] <= starts["c"]
    assert record(local_prefix, "c")["dep_paths"] == {
        "conformance/b@v1": os.path.join(local_prefix, "conformance/b/v1")
    }


def test_diamond_builds_shared_dependency_once(
    runner: Any, local_prefix: str, env: dict[str, str], calls_file: str
) -> None:
    assert runner.run(f"{S}:diamond", prefix=local_prefix, env=env)
    calls = read_calls(calls_file)
    starts, ends = events(calls, "start"), events(calls, "end")
    assert sorted(starts) == ["bottom", "left", "right", "top"]
    assert ends["top"] <= min(starts["left"], starts["right"])
    assert max(ends["left"], ends["right"]) <= starts["bottom"]


def test_rerun_skips_everything(
    runner: Any, local_prefix: str, env: dict[str, str], calls_file: str
) -> None:
    assert runner.run(f"{S}:diamond", prefix=local_prefix, env=env)
    first = len(read_calls(calls_file))
    records = [
        os.path.join(local_prefix, "conformance", n, "v1.marin", "record.json")
        for n in ("top", "left", "right", "bottom")
    ]
    mtimes = [os.stat(p).st_mtime_ns for p in records]
    assert runner.run(f"{S}:diamond", prefix=local_prefix, env=env)
    assert len(read_calls(calls_file)) == first, "a built step ran again"
    assert [os.stat(p).st_mtime_ns for p in records] == mtimes


def test_failure_stops_dependents_and_new_steps(
    runner: Any, local_prefix: str, env: dict[str, str], calls_file: str
) -> None:
    if not runner.supports("fail-fast"):
        pytest.skip(f"{runner.name} has no fail-fast that lets running steps finish")
    assert not runner.run(f"{S}:failing", prefix=local_prefix, max_concurrent=4, env=env)
    calls = read_calls(calls_file)
    starts = events(calls, "start")
    assert "bad" in events(calls, "fail")
    assert "after-bad" not in starts
    assert "after-slow" not in starts, "a new step started after a failure"
    assert "slow" in events(calls, "end"), "a running step was not allowed to finish"
    assert not os.path.exists(
        os.path.join(local_prefix, "conformance", "bad", "v1.marin", "record.json")
    )


def test_keep_going_builds_independent_branches(
    runner: Any, local_prefix: str, env: dict[str, str], calls_file: str
) -> None:
    assert not runner.run(
        f"{S}:failing", prefix=local_prefix, max_concurrent=4, keep_going=True, env=env
    )
    calls = read_calls(calls_file)
    starts = events(calls, "start")
    assert "after-bad" not in starts
    assert "after-slow" in events(calls, "end")


def test_failed_attempt_is_retried(
    runner: Any, local_prefix: str, env: dict[str, str], calls_file: str
) -> None:
    """``with_options(retries=1)``: a step that fails on its first attempt is built by its second,
    on every runner, with the same records and the same calls (the local runner retries in its
    run loop; Prefect and Airflow with their engine's own task retries)."""
    assert runner.run(f"{S}:flaky", prefix=local_prefix, env=env)
    calls = read_calls(calls_file)
    assert Counter((c["step"], c["event"]) for c in calls) == {
        ("root", "start"): 1,
        ("root", "end"): 1,
        ("flaky", "start"): 2,
        ("flaky", "fail"): 1,
        ("flaky", "end"): 1,
        ("after-flaky", "start"): 1,
        ("after-flaky", "end"): 1,
    }
    starts = [c["t"] for c in calls if c["step"] == "after-flaky" and c["event"] == "start"]
    flaky_end = next(c["t"] for c in calls if c["step"] == "flaky" and c["event"] == "end")
    assert flaky_end <= starts[0], "the dependent started before the retry succeeded"
    flaky, after = record(local_prefix, "flaky"), record(local_prefix, "after-flaky")
    assert (flaky["name"], flaky["result"]) == ("conformance/flaky", {"step": "flaky", "inputs": 1})
    assert after["inputs"] == {"conformance/flaky@v1": flaky["build_id"]}
    assert runner.run(f"{S}:flaky", prefix=local_prefix, env=env)
    assert len(read_calls(calls_file)) == len(calls), "a re-run rebuilt a step built by a retry"


def test_every_record_says_who_built_it(
    runner: Any, local_prefix: str, env: dict[str, str], calls_file: str
) -> None:
    """Who built what: each record names the host and the process that ran its step's fn and,
    on an engine, the unit of work that built it: the one the engine itself said was running,
    asked from inside the fn (``observed_engine``), which the engine's own API then confirms
    (Prefect: that task run is this step's, in this flow run; Airflow: that task instance ran
    in this process). The local runner names no engine. Four steps, two of them concurrent:
    each record names its own unit, never a sibling's."""
    assert runner.run(f"{S}:diamond", prefix=local_prefix, env=env)
    ends = {c["step"]: c for c in read_calls(calls_file) if c["event"] == "end"}
    assert sorted(ends) == ["bottom", "left", "right", "top"]
    units = set()
    for name, end in ends.items():
        prov = record(local_prefix, name)["provenance"]
        assert prov["host"] == socket.gethostname() and prov["pid"] == end["pid"], prov
        if runner.engine is None:
            assert end["engine"] is None and "engine" not in prov, prov
            continue
        seen = end["engine"]
        assert seen is not None and seen["name"] == runner.engine, seen
        assert {key: prov["engine"].get(key) for key in seen} == seen, (prov["engine"], seen)
        expected = {"step_id": f"conformance/{name}@v1", "pid": prov["pid"], **prov["engine"]}
        unit = runner.engine_unit(prov["engine"])
        assert unit == {key: expected[key] for key in unit}, (unit, expected)
        units.add(json.dumps(prov["engine"], sort_keys=True))
    assert runner.engine is None or len(units) == 4, units


def test_concurrency_reaches_but_never_exceeds_limit(
    runner: Any, local_prefix: str, env: dict[str, str], calls_file: str
) -> None:
    if not runner.supports("concurrency"):
        pytest.skip(f"{runner.name} runs tasks one at a time here")
    limit = 3
    env = {**env, LIMIT_ENV: str(limit)}  # the leaves meet at the limit by events, not timing
    assert runner.run(f"{S}:wide", prefix=local_prefix, max_concurrent=limit, env=env)
    calls = read_calls(calls_file)
    timeline = sorted((c["t"], 1 if c["event"] == "start" else -1) for c in calls)
    running = peak = 0
    for _, delta in timeline:
        running += delta
        peak = max(peak, running)
    assert peak == limit
    assert len(events(calls, "end")) == WIDE_LEAVES + 2
