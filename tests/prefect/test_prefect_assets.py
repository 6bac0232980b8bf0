"""Prefect assets: the compiled flow records a materialization per built step, none when cached.

Against the session's real Prefect server on loopback; the open-source server keeps
materializations as ``prefect.asset.materialization.*`` events, read through its events API.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.events import emit_event

from marin.execution.builder import lineage
from marin.execution.builder.lineage.names import artifact_names
from marin.execution.lazy import lower
from marin.execution.pipeline.graph import collect_steps
from marin.execution.pipeline.targets import load_target
from marin.execution.store.location import open_prefix
from marin_prefect import to_prefect_flow
from tests.lineage.helpers import EXAMPLE, check_event, file_transport, fresh_sender, read_events

pytestmark = pytest.mark.usefixtures("prefect_harness")
__all__ = ["fresh_sender"]
MATERIALIZED = "prefect.asset.materialization.succeeded"


def _events(since: str) -> list[dict[str, Any]]:
    """Every event the server holds since ``since`` (ISO time), all pages."""
    body = {"filter": {"occurred": {"since": since}, "order": "ASC"}, "limit": 50}
    out: list[dict[str, Any]] = []
    with get_client(sync_client=True) as client:
        page = client._client.post("/events/filter", json=body).json()
        while True:
            out.extend(page["events"])
            if not page.get("next_page"):
                return out
            page = client._client.get(page["next_page"]).json()


def _settled(since: str, marker: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The server's events once our own ``marker`` event, emitted last, has arrived: every
    event the flow run sent before it has been stored by then."""
    emit_event(event="marin.test.marker", resource={"prefect.resource.id": marker})
    deadline = time.monotonic() + timeout
    while True:
        events = _events(since)
        if any(e["resource"]["prefect.resource.id"] == marker for e in events):
            return events
        if time.monotonic() > deadline:
            raise TimeoutError(f"the marker event {marker} never reached the server")
        time.sleep(0.3)


def _materialized(events: list[dict[str, Any]], under: Path) -> dict[str, list[dict[str, Any]]]:
    """The materializations of assets under ``under``, by asset: the session's server also holds
    those of other tests' flows, which may have ended within the time window read."""
    own = under.as_uri() + "/"
    out: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        asset = event["resource"]["prefect.resource.id"]
        if event["event"] == MATERIALIZED and asset.startswith(own):
            out.setdefault(asset, []).append(event)
    return out


def test_a_materialization_per_built_step_with_its_upstream_assets_none_when_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_sender: lineage.LineageSender
) -> None:
    ol_events = file_transport(tmp_path, monkeypatch)
    prefix = tmp_path / "art"
    specs = list(lower(load_target(EXAMPLE), memo={}))
    steps = collect_steps(specs)
    location = open_prefix(str(prefix))
    since = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 5))
    flow = to_prefect_flow(EXAMPLE, prefix=str(prefix), name="ngram-assets")
    flow()
    first = _materialized(_settled(since, f"marin.test.{uuid.uuid4().hex}"), prefix)
    keys = {spec.step_id: artifact_names(location, spec.output_path).asset_uri for spec in steps}
    assert set(first) == set(keys.values())
    for spec in steps:
        (event,) = first[keys[spec.step_id]]
        upstream = {
            r["prefect.resource.id"]
            for r in event["related"]
            if r["prefect.resource.role"] == "asset"
        }
        assert upstream == {keys[dep.step_id] for dep in spec.deps}
        assert event["resource"]["prefect.resource.name"] == spec.step_id
        assert event["payload"]["url"] == str(prefix / spec.name / spec.version)
        assert event["payload"]["fingerprint"] == spec.fingerprint

    flow()  # every step cached now
    again = _materialized(_settled(since, f"marin.test.{uuid.uuid4().hex}"), prefix)
    assert {key: len(found) for key, found in again.items()} == {k: 1 for k in keys.values()}

    # The same builds sent OpenLineage events, children of the Prefect flow run, whose own
    # START and COMPLETE (the first run's; the cached one built nothing) come first and last.
    assert lineage.flush(30)
    everything = read_events(ol_events)
    for event in everything:
        check_event(event)
    assert [e["eventType"] for e in everything if e["job"]["name"] == "ngram-assets"] == [
        "START",
        "COMPLETE",
    ]
    flow_start, *sent, flow_end = everything
    assert flow_start["job"]["name"] == flow_end["job"]["name"] == "ngram-assets"
    assert flow_start["run"]["runId"] == flow_end["run"]["runId"]
    assert flow_start["run"]["facets"]["marinPipeline"]["runner"] == "prefect"
    assert len(sent) == 2 * len(steps)
    parents = {json.dumps(e["run"]["facets"]["parent"]["job"]) for e in sent}
    assert len(parents) == 1 and json.loads(parents.pop())["name"] == "ngram-assets"
    parent_runs = {e["run"]["facets"]["parent"]["run"]["runId"] for e in sent}
    assert parent_runs == {flow_start["run"]["runId"]}
    assert {e["run"]["facets"]["marin"]["runner"] for e in sent} == {"prefect"}


def test_an_output_url_prefect_cannot_key_builds_without_an_asset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from prefect.tasks import MaterializingTask

    from marin_prefect.assets import materializing_task

    steps = collect_steps(list(lower(load_target(EXAMPLE), memo={})))
    spec = next(s for s in steps if s.step_id == "ngram/dataset@v1")
    ok = open_prefix(str(tmp_path / "ok"))
    fine = materializing_task(spec, ok, lambda: None)
    assert isinstance(fine, MaterializingTask)
    assert [a.key for a in fine.assets] == [artifact_names(ok, spec.output_path).asset_uri]
    assert {a.key for a in fine.asset_deps} == {
        artifact_names(ok, dep.output_path).asset_uri for dep in spec.deps
    }
    # A space in the prefix: the file URI has "%20", which Prefect refuses; the key escapes it.
    spaced = materializing_task(spec, open_prefix(str(tmp_path / "a b")), lambda: None)
    assert isinstance(spaced, MaterializingTask)
    assert [a.key for a in spaced.assets] == [f"file://{tmp_path}/a~20b/{spec.output_path}"]
    with caplog.at_level("WARNING", logger="marin"):
        # Prefect allows at most 512 characters in a key.
        refused = materializing_task(spec, open_prefix(str(tmp_path / ("a" * 500))), lambda: None)
    assert refused is None
    assert f"no Prefect asset for {spec.step_id}" in caplog.text
