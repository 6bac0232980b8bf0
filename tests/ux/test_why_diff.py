"""``marin why STEP`` and ``marin diff A B`` (issue 22)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.ux.helpers import EXAMPLE, marin


def build_id(prefix: str, step: str) -> str:
    record = json.loads(marin("show", step, "--prefix", prefix, "--json").stdout)
    return str(record["build_id"])


def test_why_follows_the_chain_of_causes(built_example: str, drifted_example: str) -> None:
    result = marin(
        "why", drifted_example, "ngram/eval/bigram-add-k", "--prefix", built_example,
        "--on-drift", "rebuild",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("ngram/eval/bigram-add-k@v1: build (drift)\n")
    assert "because: config changed without a version bump: rebuilding" in out
    # The model it reads drifted (which field), and the bumped dataset it needs is new.
    chain = out[out.index("chain of causes:") :]
    assert "<- ngram/models/bigram-add-k@v1: build (drift)" in chain
    assert "config.smoothing.k: 0.05 -> 0.5" in chain
    assert "<- ngram/dataset@v2: build (run): new: no record yet" in chain
    own = build_id(built_example, "ngram/eval/bigram-add-k@v1")
    model = build_id(built_example, "ngram/models/bigram-add-k@v1")
    report = build_id(built_example, "ngram/report@v1")
    assert f"made from: build {own[:12]}" in out
    assert f"ngram/models/bigram-add-k@v1: build {model[:12]}" in out
    assert "this record read that build" in out
    assert f"ngram/report@v1: build {report[:12]}, build (stale)" in out  # downstream


def test_why_a_served_step_and_a_typo(built_example: str) -> None:
    served = marin("why", EXAMPLE, "ngram/report@v1", "--prefix", built_example)
    assert served.returncode == 0, served.stderr
    assert served.stdout.startswith("ngram/report@v1: skip (built)\n")
    assert "chain of causes" not in served.stdout
    typo = marin("why", EXAMPLE, "ngram/reprot", "--prefix", built_example)
    assert typo.returncode == 2
    assert "did you mean ngram/report?" in typo.stderr


def test_diff_two_versions_and_two_siblings(
    built_example: str, drifted_example: str, tmp_path: Path
) -> None:
    prefix = str(tmp_path / "copy")
    shutil.copytree(built_example, prefix, symlinks=True)
    assert marin("run", drifted_example, "--prefix", prefix, "--on-drift", "rebuild").returncode == 0
    versions = marin("diff", "ngram/dataset@v1", "ngram/dataset@v2", "--prefix", prefix)
    assert versions.returncode == 1  # they differ
    assert versions.stdout.splitlines()[2:] == ["version: v1 -> v2"]
    siblings = marin(
        "diff", "ngram/models/bigram-add-k@v1", "ngram/models/trigram-interpolated@v1",
        "--prefix", built_example,
    )  # fmt: skip
    assert siblings.returncode == 1
    assert "config.order: 2 -> 3" in siblings.stdout
    assert "config.smoothing.kind: add-k -> interpolated" in siblings.stdout
    same = marin("diff", "ngram/report", "ngram/report@v1", "--prefix", built_example)
    assert same.returncode == 0 and "no difference" in same.stdout
    typo = marin("diff", "ngram/report", "ngram/reprot@v1", "--prefix", built_example)
    assert typo.returncode == 2 and "did you mean ngram/report?" in typo.stderr
