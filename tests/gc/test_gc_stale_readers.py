"""``marin gc`` never deletes what keeps a kept build stale (red team r25-1).

``gc/tok@v1`` read ``gc/raw@v1``'s build b1; ``gc/raw`` was then rebuilt alone (b2), so ``tok``
is stale. When a later rebuild of ``raw`` failed (its status names b2, which ``tok`` never
read) or ``raw@v2`` was built, a gc keeping ``tok`` deleted ``raw@v1``: the next plan read it
as a pruned intermediate and served ``tok``, made from the old config, as current. Now every
slot a kept build read an input from is kept, whatever it holds. Real runs on local disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marin.execution.errors import MarinError
from marin.execution.lazy import OUT, ArtifactStep, apply, lower, run
from marin.execution.plan.decide import Action
from marin.execution.store.location import open_prefix
from marin.gc import collect_garbage
from tests.gc.pipelines import other, step


def _boom(text: str, inputs: list[str], out_path: str) -> None:
    raise RuntimeError("boom (an OOM, say)")


def reader(raw: ArtifactStep) -> list[ArtifactStep]:
    return [step("tok", "v1", raw)]


def _a_rebuild_fails(prefix: str) -> None:
    """A later rebuild of ``raw@v1`` fails: its status names b2, the build it replaced."""
    failing = apply("gc/raw", _boom, version="v1", text="raw2", inputs=[], out_path=OUT)
    with pytest.raises(MarinError):
        run([failing], prefix=prefix, force=["gc/raw"])


def _a_newer_version_is_built(prefix: str) -> None:
    """``raw@v2`` is built: b2 is no longer ``raw``'s newest version."""
    run([step("raw", "v2", text="raw2")], prefix=prefix)


def plan_of(handles: Any, prefix: str, output_path: str) -> Any:
    """The decision for ``output_path`` of ``marin plan --on-drift error``'s plan (placed for
    ``$MARIN_USER`` as the command places it)."""
    from marin.execution.pipeline.graph import Graph
    from marin.execution.plan.options import RunOptions
    from marin.execution.plan.read import plan_run
    from marin.execution.plan.scope import resolve_scopes

    location, options = open_prefix(prefix), RunOptions("error")
    graph = Graph.of(lower(handles))
    policy = options.policy(list(graph.steps))
    placed = Graph.of(resolve_scopes(graph.targets, location, policy=policy))
    return plan_run(placed, location, options).decisions[output_path]


@pytest.mark.parametrize("then", [_a_rebuild_fails, _a_newer_version_is_built])
def test_gc_keeps_the_upstream_a_kept_stale_reader_read(
    tmp_path: Path, then: Callable[[str], None]
) -> None:
    prefix = str(tmp_path / "p")
    run(reader(step("raw", "v1")), prefix=prefix)  # tok read raw's build b1
    run([step("raw", "v1", text="raw2")], prefix=prefix, on_drift="rebuild")  # b2: tok stale
    then(prefix)
    report = collect_garbage(other(), prefix, keep_versions=1)
    kept = {k.path: k.why for k in report.kept}
    assert "gc/tok/v1" in kept  # tok's newest build
    assert "gc/tok@v1 read build" in kept.get("gc/raw/v1", ""), kept
    assert "gc/raw/v1" not in {c.output_path for c in report.collected}
    assert any("gc/tok@v1 was built from gc/raw@v1 build" in note for note in report.gone)
    today = reader(step("raw", "v1", text="raw2"))
    decision = plan_of(today, prefix, "gc/tok/v1")
    assert decision.action == Action.BUILD, decision.reason  # stale, never served
    run(today, prefix=prefix, on_drift="error")
    assert Path(prefix, "gc/tok/v1/data.txt").read_text() == "tok<-raw2<-"


def model(raw: ArtifactStep) -> list[ArtifactStep]:
    """A user-scope model (``users/<user>/gc/model/v1``) reading the shared ``raw``."""
    return [step("model", "v1", raw).with_options(scope="user")]


@pytest.mark.parametrize(
    ("bobs", "all_users"),
    [
        ([step("raw", "v2", text="raw2")], False),  # a shared plan: user folders left alone
        (model(step("raw", "v2", text="raw2")), False),  # bob's folder only
        (model(step("raw", "v2", text="raw2")), True),  # alice's placement is served
    ],
)
def test_a_users_stale_reader_keeps_the_shared_upstream_it_read(
    tmp_path: Path, monkeypatch: Any, bobs: list[ArtifactStep], all_users: bool
) -> None:
    """Alice's user-scope model read the shared ``raw@v1`` (b1); Bob rebuilt it (b2), then
    built ``raw@v2`` and ran gc of his pipeline: the shared ``raw@v1`` stays, and Alice's
    model is stale, not served."""
    prefix = str(tmp_path / "p")
    run([step("raw", "v1")], prefix=prefix)  # the team's shared raw (b1)
    monkeypatch.setenv("MARIN_USER", "alice")
    run(model(step("raw", "v1")), prefix=prefix)
    assert not Path(prefix, "users/alice/gc/raw").exists()  # her model read the shared b1
    monkeypatch.setenv("MARIN_USER", "bob")
    run([step("raw", "v1", text="raw2")], prefix=prefix, on_drift="rebuild")
    run([step("raw", "v2", text="raw2")], prefix=prefix)
    report = collect_garbage(bobs, prefix, all_users=all_users)
    assert "gc/raw/v1" not in {c.output_path for c in report.collected}
    monkeypatch.setenv("MARIN_USER", "alice")
    today = model(step("raw", "v1", text="raw2"))
    decision = plan_of(today, prefix, "users/alice/gc/model/v1")
    assert decision.action == Action.BUILD, decision.reason
    run(today, prefix=prefix, on_drift="error")
    text = Path(prefix, "users/alice/gc/model/v1/data.txt").read_text()
    assert text == "model<-raw2<-"
