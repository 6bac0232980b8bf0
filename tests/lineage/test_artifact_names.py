"""One source of truth for an artifact's URL, OpenLineage dataset and asset key."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from marin.catalog import show_record
from marin.execution.builder.commit import build_step
from marin.execution.builder.lineage.names import artifact_names, names_for_url
from marin.execution.builder.request import BuildRequest
from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.graph import Graph
from marin.execution.plan.options import RunOptions
from marin.execution.plan.read import plan_run
from marin.execution.store.location import open_prefix
from marin.plan_view import plan_json


def write(out_path: str) -> str:
    with fsspec.open(out_path, "w") as f:
        f.write("x")
    return "ok"


@pytest.mark.parametrize(
    ("url", "namespace", "name", "asset"),
    [
        ("/data/run/lm/v1", "file", "/data/run/lm/v1", "file:///data/run/lm/v1"),
        ("/data/a b#c/v1", "file", "/data/a b#c/v1", "file:///data/a%20b%23c/v1"),
        ("s3://bkt/exp/lm/v1", "s3://bkt", "exp/lm/v1", "s3://bkt/exp/lm/v1"),
        ("gs://bkt/lm/v1", "gs://bkt", "lm/v1", "gs://bkt/lm/v1"),
        ("memory://t-1/lm/v1", "memory", "/t-1/lm/v1", "memory://t-1/lm/v1"),
    ],
)
def test_names_follow_the_openlineage_convention(
    url: str, namespace: str, name: str, asset: str
) -> None:
    names = names_for_url(url)
    assert (names.url, names.dataset_namespace, names.dataset_name, names.asset_uri) == (
        url,
        namespace,
        name,
        asset,
    )


def test_show_and_plan_json_print_the_same_names(tmp_path: Path) -> None:
    spec = apply("names/one", write, version="v1", out_path=OUT).lower()
    location = open_prefix(str(tmp_path / "art"))
    assert build_step(BuildRequest(spec, location)).action == "built"
    names = artifact_names(location, spec.output_path)
    text, code = show_record(location, spec.output_path)
    assert code == 0
    assert f"  dataset      file {tmp_path}/art/names/one/v1 (OpenLineage)" in text
    assert f"  asset        file://{tmp_path}/art/names/one/v1 (Airflow, Prefect)" in text
    data = json.loads(
        json.dumps(plan_json(plan_run(Graph.of([spec]), location, RunOptions()), location))
    )
    assert data["steps"][0]["artifact"] == names.to_json()


def test_show_prints_prefects_own_key_when_it_differs(tmp_path: Path) -> None:
    spec = apply("e/50%", write, version="v1", out_path=OUT).lower()
    location = open_prefix(str(tmp_path / "a b"))
    assert build_step(BuildRequest(spec, location)).action == "built"
    text, _ = show_record(location, spec.output_path)
    assert f"  asset        file://{tmp_path}/a%20b/e/50%25/v1 (Airflow)" in text
    assert f"  asset        file://{tmp_path}/a~20b/e/50~25/v1 (Prefect)" in text
