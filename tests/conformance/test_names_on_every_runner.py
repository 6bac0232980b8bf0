"""Property: every step name and prefix the grammar accepts builds on every runner (issue 43, 8).

Hypothesis draws a small graph whose step names are drawn from the grammar itself (any text
``marin.execution.names`` accepts, not a hand-made alphabet), and a local prefix folder name
(spaces and punctuation included); each runner builds it from scratch, and every step must have
run once and committed its record at its own path. The names that broke the compiled Prefect
flow are ``@example``s. Examples are derandomized, as in the other property tests. Airflow runs
(``airflow dags test``, about 10 s each) are ``slow``; few cases are drawn for the engines.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from marin.execution.errors import InvalidStepError
from marin.execution.names import validate_name
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.conformance.conftest import RUNNERS
from tests.conformance.plan_cases import TARGET, output_path
from tests.conformance.random_graph import GRAPH_ENV
from tests.conformance.scenarios import CALLS_ENV, read_calls
from tests.ux.helpers import environ

ODD_NAMES = ["evals/o'brien-0", "sweep/lr=3e-4", "e/café", "e/run#1", "e/50%", "e/a+b", "c{0}"]
ODD_GRAPH = {
    "steps": [
        {"name": name, "deps": ODD_NAMES[i - 1 : i], "value": i} for i, name in enumerate(ODD_NAMES)
    ],
    "targets": ODD_NAMES[-1:],
}


def _accepted(segment: str) -> bool:
    try:
        validate_name(segment)
    except InvalidStepError:
        return False
    return True


# Any character but the separator: the grammar itself decides what is a name.
_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="/")
segments = st.text(_CHARS, min_size=1, max_size=6).filter(_accepted)
names = st.lists(segments, min_size=1, max_size=3).map("/".join)
prefix_folders = st.text(
    st.characters(codec="utf-8", exclude_categories=("C",), exclude_characters="/:~"),
    min_size=1,
    max_size=8,
).filter(lambda s: s not in (".", "..") and s.strip() == s)


def _disjoint(picked: list[str]) -> bool:
    """One folder per step on every disk: no two equal ignoring case, none inside another's
    output (``lower()`` refuses both; that is not what this test is about)."""
    outputs = [output_path(n).casefold() + "/" for n in picked]
    return len(set(outputs)) == len(outputs) and not any(
        a != b and b.startswith(a) for a in outputs for b in outputs
    )


@st.composite
def graphs(draw: st.DrawFn, max_steps: int = 4) -> dict[str, Any]:
    picked = draw(st.lists(names, min_size=1, max_size=max_steps, unique=True).filter(_disjoint))
    steps = []
    for i, name in enumerate(picked):
        deps = draw(st.lists(st.sampled_from(picked[:i]), max_size=2, unique=True)) if i else []
        steps.append({"name": name, "deps": deps, "value": i})
    return {"steps": steps, "targets": [s["name"] for s in steps]}


def build_everything(runner: Any, graph: dict[str, Any], folder: str) -> None:
    """Build ``graph`` under ``<tmp>/<folder>`` from scratch: each step runs once, and its
    record lands at its own path."""
    with tempfile.TemporaryDirectory(prefix="marin-names-") as root:
        prefix, calls = os.path.join(root, folder), os.path.join(root, "calls.jsonl")
        env = {CALLS_ENV: calls, GRAPH_ENV: json.dumps(graph)}
        with environ(env):  # the Airflow export loads the target here, too
            ok = runner.run(TARGET, prefix=prefix, env=env)
        assert ok, getattr(runner, "last_output", "") or getattr(runner, "last_error", None)
        wanted = sorted(s["name"] for s in graph["steps"])
        assert sorted(c["step"] for c in read_calls(calls) if c["event"] == "end") == wanted
        location = open_prefix(prefix)
        for name in wanted:
            record = read_record(location, output_path(name))
            assert record is not None and record.name == f"graph/{name}", name


def _runner(name: str) -> Any:
    module_name, class_name, engine = RUNNERS[name]
    if name == "airflow":  # builds, not scheduling: `airflow dags test` is enough
        class_name = "AirflowDagsTestRunner"
    if engine is not None:
        pytest.importorskip(engine)
    return getattr(importlib.import_module(module_name), class_name)()


def _settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@_settings(40)
@example(graph=ODD_GRAPH, folder="a b")
@given(graph=graphs(), folder=prefix_folders)
def test_every_valid_name_builds_locally(graph: dict[str, Any], folder: str) -> None:
    build_everything(_runner("local"), graph, folder)


@pytest.fixture(scope="module", params=["prefect", pytest.param("airflow", marks=pytest.mark.slow)])
def engine_runner(request: pytest.FixtureRequest) -> Any:
    return _runner(request.param)


@_settings(3)
@example(graph=ODD_GRAPH, folder="a b")
@given(graph=graphs(), folder=prefix_folders)
def test_every_valid_name_builds_on_an_engine(
    engine_runner: Any, graph: dict[str, Any], folder: str
) -> None:
    build_everything(engine_runner, graph, folder)
