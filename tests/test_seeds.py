"""The code examples of the two Marin articles the project started from, run as written.

The articles leave a few helpers undefined (load_data, train, build_a/b/c); they are defined here
with the signatures the examples call them with.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from marin.execution.lazy import OUT, apply, lower, resolve, run
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner


def test_lazy_article_examples(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path))

    def write_json(data, out_path):  # type: ignore[no-untyped-def]
        import json
        import pathlib

        pathlib.Path(out_path).write_text(json.dumps(data))

    json_step = apply(
        name="example/json", fn=write_json, version="v0", data={"hello": "world"}, out_path=OUT
    )
    spec = json_step.lower()
    assert list(tmp_path.iterdir()) == [], "lower() wrote something"
    assert len(spec.fingerprint) == 64
    artifact = resolve(json_step)
    assert artifact.path() == f"{tmp_path}/example/json/v0"
    assert json.loads(pathlib.Path(artifact.path()).read_text()) == {"hello": "world"}

    loads: list[str] = []

    def load_data(src):  # type: ignore[no-untyped-def]
        loads.append(src)
        return {"rows": 3}

    def train(data, out_path):  # type: ignore[no-untyped-def]
        pathlib.Path(out_path).write_text(data)

    dataset = apply(name="dataset", fn=load_data, version="v1", src="gs://bucket/data")
    model_a = apply(name="model_a", fn=train, version="v0", data=dataset, out_path=OUT)
    model_b = apply(name="model_b", fn=train, version="v0", data=dataset, out_path=OUT)
    memo: dict[Any, Any] = {}
    spec_a = model_a.lower(memo=memo)
    spec_b = model_b.lower(memo=memo)
    assert spec_a.deps[0] is spec_b.deps[0]
    run(model_a, model_b)
    assert loads == ["gs://bucket/data"]
    assert pathlib.Path(tmp_path / "model_a" / "v0").read_text() == f"{tmp_path}/dataset/v1"


def test_step_runner_article_examples(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path))
    order: list[str] = []

    def make(name: str):  # type: ignore[no-untyped-def]
        def fn(deps, out_path):  # type: ignore[no-untyped-def]
            assert all(os.path.exists(d) for d in deps)
            order.append(name)
            pathlib.Path(out_path).write_text(name)

        return fn

    def build_a(deps=()):  # type: ignore[no-untyped-def]
        return apply("a", make("a"), version="v0", deps=list(deps), out_path=OUT)

    def build_b(deps=()):  # type: ignore[no-untyped-def]
        return apply("b", make("b"), version="v0", deps=list(deps), out_path=OUT)

    def build_c(deps=()):  # type: ignore[no-untyped-def]
        return apply("c", make("c"), version="v0", deps=list(deps), out_path=OUT)

    step_a = lower(build_a())
    step_b = lower(build_b(deps=[step_a]))
    step_c = lower(build_c(deps=[step_b]))
    StepRunner(RunOptions(max_concurrent=2)).run([step_c])
    assert order == ["a", "b", "c"]
    steps = [step_c]
    StepRunner(RunOptions(max_concurrent=8)).run(steps)
    assert order == ["a", "b", "c"]
