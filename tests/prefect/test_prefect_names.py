"""Every name and prefix the grammar accepts builds in the compiled flow, and a flow whose step's
task failed never ends Completed (issue 43, item 8). Against the session's Prefect harness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pytest

import marin_prefect.compile as compile_module
from marin.execution.builder.lineage.names import PREFECT_REFUSED, names_for_url, prefect_asset_key
from marin.execution.lazy import OUT, ArtifactStep, apply
from marin.execution.names import validate_name
from marin_prefect import to_prefect_flow
from tests.prefect.prefect_helpers import flow_run_id, task_runs

pytestmark = pytest.mark.usefixtures("prefect_harness")

ODD_NAMES = (
    "evals/o'brien-0",
    "sweep/lr=3e-4",
    "e/café",
    "e/run#1",
    "e/50%",
    "e/a+b",
    "c{0}",
    "e/a~7E",
    'e/"q"&<x>|^`',
)


def write(out_path: str, tag: str, inputs: list[str]) -> dict[str, Any]:
    with fsspec.open(out_path + "/data.json", "w", auto_mkdir=True) as f:
        json.dump({"tag": tag, "inputs": inputs}, f)
    return {"tag": tag}


def chain(names: tuple[str, ...]) -> list[ArtifactStep]:
    """One step per name, each reading the one before: every name is a dependency too."""
    steps: list[ArtifactStep] = []
    for name in names:
        validate_name(name)
        steps.append(apply(name, write, version="v1", out_path=OUT, tag=name, inputs=steps[-1:]))
    return steps[-1:]


def test_asset_keys_are_injective_and_prefect_accepts_them() -> None:
    from prefect.assets import Asset
    from prefect.types.names import RESTRICTED_ASSET_CHARACTERS

    assert set(RESTRICTED_ASSET_CHARACTERS) == PREFECT_REFUSED  # Prefect's rule, as Marin has it

    urls = [f"/tmp/p q/{n}/v1" for n in ODD_NAMES] + [f"s3://b/{n}/v1" for n in ODD_NAMES]
    urls += ["/tmp/a~25", "/tmp/a%"]  # an escape's own spelling and what it stands for
    keys = [prefect_asset_key(names_for_url(u)) for u in urls]
    assert len(set(keys)) == len(keys)
    for key in keys:
        Asset(key=key)  # Prefect's own validation
    plain = names_for_url("/tmp/p/tok/wiki/v1")
    assert prefect_asset_key(plain) == plain.asset_uri == "file:///tmp/p/tok/wiki/v1"


def test_every_odd_name_and_a_prefix_with_a_space_build_and_the_flow_completes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = tmp_path / "a b"
    flow = to_prefect_flow(chain(ODD_NAMES), prefix=str(prefix), name="odd-names")
    with caplog.at_level("WARNING", logger="marin"):
        state = flow(return_state=True)
    assert state.is_completed(), state
    runs = task_runs(flow_run_id(state), expected=len(ODD_NAMES))
    assert {name: run.state.type.value for name, run in runs.items() if run.state} == {
        f"{name}@v1": "COMPLETED" for name in ODD_NAMES
    }
    for name in ODD_NAMES:
        assert json.loads((prefix / name / "v1" / "data.json").read_text())["tag"] == name
    assert "lineage:" not in caplog.text  # every asset was accepted


def test_a_task_that_fails_after_its_build_fails_the_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = compile_module._step_result

    def fails_for_b(step_id: str, *args: Any) -> Any:
        if step_id.startswith("f/b@"):
            raise RuntimeError("injected after the build")
        return real(step_id, *args)

    monkeypatch.setattr(compile_module, "_step_result", fails_for_b)
    a = apply("f/a", write, version="v1", out_path=OUT, tag="a", inputs=[])
    # f/b is a target nothing reads: no downstream task notices its failure for the flow.
    b = apply("f/b", write, version="v1", out_path=OUT, tag="b", inputs=[a])
    flow = to_prefect_flow([b], prefix=str(tmp_path))
    state = flow(return_state=True)
    assert state.is_failed(), state
    assert "f/b@v1" in str(state.message)
