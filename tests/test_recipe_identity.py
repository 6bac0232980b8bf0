"""The one identity rule (``store/identity.py``) and the step folder it reads (issue 53).

``judge_claim`` on records, attempts and jobs: ours, not ours with a reason, or unknown; the
code drift policy; early cutoff as the same input. ``step_folder``: what is Marin's own in a
folder, and a ``job.json`` that cannot be read is never "no job".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from marin.execution.digest.code import CodeDigest, CodePart, unknown_digest
from marin.execution.digest.output import OutputDigest
from marin.execution.errors import RemoteJobError
from marin.execution.store.identity import (
    Recipe,
    Upstream,
    claim_of,
    judge_claim,
)
from marin.execution.store.location import open_prefix
from marin.execution.store.records import ArtifactRecord
from marin.execution.store.step_folder import (
    Attempt,
    JobRecord,
    UnreadableJob,
    create_job,
    is_marins,
    job_path,
    load_job,
    marins_own,
    read_job,
)
from marin.execution.vocabulary import Claim, Mismatch

OLD = "tree2:" + "a" * 64


def code(*statements: str) -> CodeDigest:
    part = CodePart("train", "p.py", 1, "f" * 64, "0" * 12, tuple(statements))
    return CodeDigest(("".join(statements) or "0").ljust(64, "0")[:64], (part,))


def dep(build_id: str, replaced: dict[str, str] | None = None, digest: str | None = None) -> Any:
    return ArtifactRecord(
        name="a", version="v1", fingerprint="fa", fingerprint_payload="{}", config={},
        dep_paths={}, output_path="/p/a/v1", result=None, provenance={}, started_at="",
        finished_at="", duration_s=0.0, build_id=build_id,
        output=OutputDigest(digest), replaced=replaced or {},
    )  # fmt: skip


RECIPE = Recipe("b@v1", "b/v1", "fb", code("aaaaaaaaaaaa"))


def attempt(**changes: Any) -> Attempt:
    base = Attempt(1, "fb", code("aaaaaaaaaaaa"), "2026-01-01T00:00:00Z", "h",
                   inputs={"a@v1": "build-1"}, placement="b/v1")  # fmt: skip
    return dataclasses.replace(base, **changes)


def reading(*ups: Upstream, repaired: frozenset[str] = frozenset()) -> Recipe:
    return RECIPE.consuming(list(ups), repaired)


def test_the_same_recipe_is_ours_and_each_part_that_differs_is_named() -> None:
    same = reading(Upstream("a@v1", dep("build-1")))
    assert judge_claim(same, claim_of(attempt()), "rebuild").claim == Claim.OURS
    cases = {
        Mismatch.PLACEMENT: (attempt(placement="users/bob/b/v1"), "was made for users/bob/b/v1"),
        Mismatch.CONFIG: (attempt(fingerprint="fx"), "ran another config"),
        Mismatch.INPUTS: (attempt(inputs={"a@v1": "build-0"}), "read other input builds"),
        Mismatch.CODE: (attempt(code=code("bbbbbbbbbbbb")), "ran other code"),
    }
    for differs, (claimed, words) in cases.items():
        verdict = judge_claim(same, claim_of(claimed), "rebuild")
        assert (verdict.claim, verdict.differs) == (Claim.NOT_OURS, differs)
        assert verdict.reason.startswith("attempt 1 ") and words in verdict.reason


def test_code_is_advisory_under_warn_and_unknown_is_never_unchanged() -> None:
    same = reading(Upstream("a@v1", dep("build-1")))
    other = claim_of(attempt(code=code("bbbbbbbbbbbb")))
    warned = judge_claim(same, other, "warn")
    assert warned.claim == Claim.OURS and "reused (on_code_drift=warn)" in warned.note
    blind = claim_of(attempt(code=unknown_digest("written before code digests")))
    assert judge_claim(same, blind, "warn").claim == Claim.OURS  # advisory: served
    strict = judge_claim(same, blind, "rebuild")
    assert (strict.claim, strict.differs) == (Claim.UNKNOWN, Mismatch.CODE_UNKNOWN)
    assert "written before code digests" in strict.reason


def test_an_input_build_not_recorded_is_unknown() -> None:
    verdict = judge_claim(reading(Upstream("a@v1", dep("build-1"))),
                          claim_of(attempt(inputs={})), "warn")  # fmt: skip
    assert (verdict.claim, verdict.differs) == (Claim.UNKNOWN, Mismatch.INPUTS_UNKNOWN)
    static = judge_claim(RECIPE, claim_of(attempt(inputs={})), "warn")  # inputs not known yet
    assert static.claim == Claim.OURS


def test_an_input_rebuilt_into_the_same_bytes_is_the_same_input_unless_forced() -> None:
    """Early cutoff: the new build replaced exactly the build a record read, and verified its
    bytes were the ones it now holds; ``--force`` of that input repairs, so never cut off.
    Red team r10-2: an attempt (or a job) is never cut off: it may have read that input while
    it was being rebuilt, and only a record's commit checked its inputs."""
    new = dep("build-2", replaced={"build-1": OLD}, digest=OLD)
    rebuilt = Upstream("a@v1", new, rebuilt=True, committed=True)
    record = dataclasses.replace(claim_of(attempt()), what="record", url=True)
    cut = judge_claim(reading(rebuilt), record, "rebuild")
    assert cut.claim == Claim.OURS and cut.lineage.unchanged == ("a@v1",)
    partial = judge_claim(reading(rebuilt), claim_of(attempt()), "rebuild")
    assert partial.claim == Claim.NOT_OURS and partial.differs == Mismatch.INPUTS
    forced = judge_claim(reading(rebuilt, repaired=frozenset({"a@v1"})), record, "warn")
    assert forced.differs == Mismatch.INPUTS
    pending = Upstream("a@v1", dep("build-1"), rebuilt=True)  # rebuilt in this run, not yet
    waiting = judge_claim(reading(pending), claim_of(attempt()), "warn")
    assert waiting.claim == Claim.NOT_OURS and waiting.lineage.pending == ("a@v1",)


def test_records_jobs_and_attempts_claim_alike() -> None:
    job = JobRecord("local", "marin-" + "0" * 20, "b1", "now", {}, "fb", code("aaaaaaaaaaaa"),
                    {"a@v1": "build-1"}, "b/v1")  # fmt: skip
    assert JobRecord.from_json(json.loads(json.dumps(job.to_json()))) == job
    old = {k: v for k, v in job.to_json().items() if k not in ("code", "inputs", "placement")}
    legacy = JobRecord.from_json(old)
    assert legacy is not None and legacy.code.digest is None and legacy.inputs == {}
    same = reading(Upstream("a@v1", dep("build-1")))
    assert judge_claim(same, claim_of(job), "rebuild").ours
    assert judge_claim(same, claim_of(legacy), "warn").claim == Claim.UNKNOWN
    record = dataclasses.replace(dep("b-build"), name="b", fingerprint="fb", code=job.code,
                                 output_path="/prefix/b/v1", inputs={"a@v1": "build-1"})  # fmt: skip
    assert judge_claim(same, claim_of(record), "rebuild").ours  # a record's path is a URL
    assert Attempt.parse(attempt(job=job).to_json()) == attempt(job=job)


def test_marins_own_files_make_a_folder_marins() -> None:
    ours = ["lease.json", "lease.json.guard", "log.txt", "attempt.json", "job.json",
            "checkpoints", "record.json.tmp-ab12", ".job.x1y2.tmp", "marin-" + "a" * 20]  # fmt: skip
    for name in ours:
        assert is_marins([name]), name
    assert marins_own([*ours, "notes.txt", "model.bin"]) == sorted(ours)
    assert not is_marins(["notes.txt", "marin-xyz", "job.json.bak", "checkpoints2"])


@pytest.mark.parametrize(
    "content, why",
    [(b'{"job_id": "marin-0123456789abcdef0123', "not JSON"), (b"[1, 2]", "not a job record")],
)
def test_a_job_record_that_cannot_be_read_is_never_no_job(
    tmp_path: Path, content: bytes, why: str
) -> None:
    location = open_prefix(str(tmp_path))
    path = Path(location.path(job_path("s/v1")))
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    found = load_job(location, "s/v1")
    assert isinstance(found, UnreadableJob) and why in found.why
    assert read_job(location, "s/v1") is None
    fresh = JobRecord("local", "marin-" + "1" * 20, "b", "now", {})
    with pytest.raises(RemoteJobError, match="cannot be read") as err:
        create_job(location, "s/v1", fresh, "s@v1")  # never written over: its job may run
    assert err.value.step == "s@v1" and path.read_bytes() == content
    if content.startswith(b'{"job_id"'):
        assert found.job_id == "marin-0123456789abcdef0123"  # a lead to the job


def test_an_attempt_or_a_job_naming_an_input_the_step_lacks_is_not_ours() -> None:
    """Red team round 16: an attempt whose inputs named one more input than the step has
    (planted, or from a version of the step with another dependency) was ours: only the
    step's own inputs were compared. Exact input builds are the same set of inputs. A record
    may name more (the builds its adopted data lies in): still ours."""
    same = reading(Upstream("a@v1", dep("build-1")))
    extra = {"a@v1": "build-1", "ghost@v1": "build-9"}
    job = JobRecord("local", "marin-" + "0" * 20, "b1", "now", {}, "fb", code("aaaaaaaaaaaa"),
                    extra, "b/v1")  # fmt: skip
    for claimed in (claim_of(attempt(inputs=extra)), claim_of(job)):
        verdict = judge_claim(same, claimed, "warn")
        assert (verdict.claim, verdict.differs) == (Claim.NOT_OURS, Mismatch.INPUTS)
        assert "upstream 'ghost@v1' is not an input of this step" in verdict.reason
        assert verdict.lineage.pending == ()  # no commit of an upstream makes it ours
    lone = judge_claim(reading(), claim_of(attempt()), "warn")  # a step without inputs now
    assert lone.differs == Mismatch.INPUTS and "'a@v1' is not an input" in lone.reason
    record = dataclasses.replace(claim_of(attempt(inputs=extra)), what="record", url=True)
    assert judge_claim(same, record, "warn").ours
