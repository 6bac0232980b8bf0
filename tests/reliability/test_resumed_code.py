"""A partial output resumed across a code change records mixed code (issue 52).

Found by the random-history checker (tests/oracle, seed 6): a resumable step's attempt of old
code failed after a checkpoint; its code was edited; the next run, under ``--on-code-drift
warn``, resumed the checkpoint (as documented) and recorded the *new* code's digest, so the
output, made partly by the old code, was served afterwards as the new code's even under
``--on-code-drift rebuild``. The record now names a mix of both codes: every later plan shows
code drift, and ``rebuild`` rebuilds it (docs/caching.md, "Whose work is it").
"""

from __future__ import annotations

import json
from pathlib import Path

from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.conftest import child_env
from tests.reliability.test_identity_reuse import marin

PIPELINE = """\
import json
import os

from marin.execution.lazy import OUT, apply


def work(out_path: str) -> list:
    os.makedirs(out_path, exist_ok=True)
    seen_file = os.path.join(out_path, "seen.json")
    seen = json.loads(open(seen_file).read()) if os.path.exists(seen_file) else []
    seen.append("{code}")
    with open(seen_file, "w") as f:
        f.write(json.dumps(seen))
    if os.path.exists(os.environ["MARIN_TEST_FAIL"]):
        raise RuntimeError("failed after its checkpoint")
    return seen


pipeline = [apply("mix/step", work, version="v1", out_path=OUT).with_options(resumable=True)]
"""


def _target(tmp_path: Path, code: str) -> str:
    (tmp_path / "mixpipe.py").write_text(PIPELINE.format(code=code))
    return f"{tmp_path / 'mixpipe.py'}:pipeline"


def _step(plan_stdout: str) -> dict[str, object]:
    return next(s for s in json.loads(plan_stdout)["steps"] if s["name"] == "mix/step")


def test_a_checkpoint_of_old_code_resumed_under_warn_shows_code_drift_after(
    tmp_path: Path,
) -> None:
    prefix, fail = str(tmp_path / "p"), tmp_path / "fail"
    env = child_env(MARIN_TEST_FAIL=str(fail))
    fail.touch()
    failed = marin("run", _target(tmp_path, "OLD"), "--prefix", prefix, env=env)
    assert failed.returncode == 1, failed.stderr[-2000:]
    fail.unlink()
    target = _target(tmp_path, "NEW")
    ran = marin("run", target, "--prefix", prefix, env=env)  # --on-code-drift warn: resumed
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "resumed anyway (on_code_drift=warn)" in ran.stderr, ran.stderr[-2000:]
    record = read_record(open_prefix(prefix), "mix/step/v1")
    assert record is not None and record.result == ["OLD", "NEW"]  # made by both codes
    served = _step(marin("plan", target, "--prefix", prefix, "--json", env=env).stdout)
    assert served["action"] == "skip" and served["code_drift"], served  # says so under warn
    strict = marin("plan", target, "--prefix", prefix, "--json", "--on-code-drift", "rebuild",
                   env=env)  # fmt: skip
    assert _step(strict.stdout)["action"] == "build"
    rebuilt = marin("run", target, "--prefix", prefix, "--on-code-drift", "rebuild", env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    record = read_record(open_prefix(prefix), "mix/step/v1")
    assert record is not None and record.result == ["NEW"]
    clean = marin("plan", target, "--prefix", prefix, "--on-code-drift", "error", env=env)
    assert clean.returncode == 0, clean.stdout + clean.stderr
