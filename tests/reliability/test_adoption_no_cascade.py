"""A reader of an adoption whose source build was rebuilt before the run, under ``--no-cascade``.

Found by the random-history checker (tests/oracle; pinned as
``a-reader-of-a-stale-adoption-builds-under-no-cascade``): ``s0`` adopts ``o/feed/v1/parts``;
its reader's driver was killed mid-build, the feed was rebuilt with other bytes, and every
``marin run --no-cascade`` failed the reader with ``InputChangedError: ... rebuilt or removed
while this step was being built from it``: the builder compared the builds the adoption
recorded with the ones its data lies in now, so a change made before the run read as a race.
The plan serves the stale adoption (docs/caching.md, exception 2) and builds its reader from
the data as it is; only a change while the reader is built discards it. A partial attempt of
the reader made before the change may have read the old data: it is never resumed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from marin.execution.lazy import OUT, ArtifactStep, apply, run
from marin.execution.pipeline.lower import lower_graph
from marin.execution.plan.options import RunOptions
from marin.execution.run.runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.vocabulary import Action

STATE: dict[str, Any] = {"text": "one", "fail": False}


def make_raw(out: str) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, "data").write_text(STATE["text"])


def read_data(path: str) -> str:
    if STATE["fail"]:
        raise RuntimeError("reader: injected failure")
    return Path(path, "data").read_text()


def _pipeline() -> tuple[ArtifactStep, ArtifactStep, ArtifactStep]:
    raw = apply("raw", make_raw, version="v1", out=OUT)
    adopted = ArtifactStep.adopt("data", "v1", "raw/v1")
    reader = apply("read", read_data, version="v1", path=adopted)
    return raw, adopted, reader.with_options(resumable=True)


def _no_cascade(prefix: str) -> StepRunner:
    return StepRunner(RunOptions(cascade=False), prefix=prefix)


@pytest.fixture
def stale(tmp_path: Path) -> str:
    """``raw`` built and adopted as ``data``; the reader never built; ``raw`` then rebuilt
    with other bytes, so the adoption is stale."""
    STATE.update(text="one", fail=False)
    prefix = str(tmp_path / "p")
    raw, adopted, _ = _pipeline()
    run(raw, prefix=prefix)
    run(adopted, prefix=prefix)
    STATE["text"] = "two"
    run(raw, prefix=prefix, force=["raw@v1"])
    return prefix


def test_a_reader_of_a_stale_adoption_builds_under_no_cascade(stale: str) -> None:
    _, adopted, reader = _pipeline()
    location = open_prefix(stale)
    was = read_record(location, "data/v1")
    runner = _no_cascade(stale)
    plan = runner.plan(lower_graph([adopted, reader]))[0]
    assert plan.decisions["data/v1"].stale  # served stale, with a warning
    runner.run(lower_graph([adopted, reader]))
    read = read_record(location, "read/v1")
    assert read is not None and read.result == "two"  # the data as it is now
    assert read_record(location, "data/v1") == was  # the stale adoption, served as it is
    again = _no_cascade(stale).plan(lower_graph([adopted, reader]))[0]
    assert again.decisions["read/v1"].action != Action.BUILD
    run(adopted, reader, prefix=stale)  # with the cascade: adopted anew, its reader rebuilt
    assert read_record(location, "data/v1") != was


def test_an_attempt_made_before_the_source_changed_is_never_resumed(tmp_path: Path) -> None:
    STATE.update(text="one", fail=True)
    prefix = str(tmp_path / "p")
    raw, adopted, reader = _pipeline()
    run(raw, prefix=prefix)
    with pytest.raises(Exception, match="injected failure"):
        run(adopted, reader, prefix=prefix)  # a partial attempt, made from "one"
    assert _no_cascade(prefix).plan(lower_graph(reader))[0].decisions["read/v1"].resume.resume
    STATE.update(text="two", fail=False)
    run(raw, prefix=prefix, force=["raw@v1"])
    decision = _no_cascade(prefix).plan(lower_graph(reader))[0].decisions["read/v1"]
    assert decision.resume is not None and not decision.resume.resume
    assert "adopts data in a build rebuilt since it was adopted" in decision.resume.reason
    _no_cascade(prefix).run(lower_graph(reader))
    read = read_record(open_prefix(prefix), "read/v1")
    assert read is not None and read.result == "two"
    assert not read.provenance["attempt"].get("resumed")
