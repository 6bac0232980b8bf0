"""Issue 53: work is reused only for the recipe it was made for, through the CLI.

A resumable step's partial attempt and a remote step's job record the recipe they ran for
(placement, config, code, the input builds they read); the one identity rule
(``store/identity.py``) decides whether the next build may resume or collect them. Also: a job
checks it runs the code it was submitted for, and a ``job.json`` that cannot be read never makes
a run clear the output its job may be writing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from marin.execution.remote.local_job import start_time
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability.conftest import REPO, child_env
from tests.reliability.pipelines import wait_for_file
from tests.reliability.test_remote import wait_for_text
from tests.reliability.test_resumable import wait_gone

TARGET = "tests/reliability/identity_pipelines.py"


def marin(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin.cli", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def start(err: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``marin ARGS`` in a session of its own (its stderr to ``err``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "marin.cli", *args],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err.open("w"), text=True,
        start_new_session=True,
    )  # fmt: skip


def killed_while_its_job_runs(err: Path, started: Path, *args: str, env: dict[str, str]) -> int:
    """Run ``marin run ARGS``; SIGKILL the driver once its job has started; the job's pid."""
    driver = start(err, "run", *args, env=env)
    wait_for_file(str(started), timeout=60)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    return int(started.read_text())


def remote_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return child_env(
        MARIN_TEST_STARTED=str(tmp_path / "started"),
        MARIN_TEST_GATE=str(tmp_path / "gate"),
        MARIN_REMOTE_POLL_MAX_S="0.2",
        **extra,
    )


# --- finding 5: a partial attempt is resumed only from the input builds it read -----------------


def test_a_partial_attempt_made_from_a_replaced_input_is_cleared(tmp_path: Path) -> None:
    """b (resumable) fails after reading a's OLD-DATA; ``--force a`` writes NEW-DATA: b's
    partial output was made from a build that is gone, so b starts over instead of committing
    ``['OLD-DATA', 'NEW-DATA']`` under a record naming a's new build."""
    prefix, env, fail = str(tmp_path / "p"), child_env(), tmp_path / "fail"
    fail.touch()
    failed = marin("run", f"{TARGET}:resumed", "--prefix", prefix,
                   env={**env, "MARIN_TEST_FAIL": str(fail)})  # fmt: skip
    assert failed.returncode == 1, failed.stderr[-2000:]
    new = {**env, "MARIN_TEST_DATA": "NEW-DATA"}
    plan = marin("plan", f"{TARGET}:resumed", "--prefix", prefix, "--force", "id/a", env=new)
    assert "clear: partial output from attempt 1 (" in plan.stdout, plan.stdout + plan.stderr
    assert "read other input builds: upstream id/a@v1 is rebuilt in this run" in plan.stdout
    ran = marin("run", f"{TARGET}:resumed", "--prefix", prefix, "--force", "id/a", env=new)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads((tmp_path / "p/id/b/v1/seen.json").read_text()) == ["NEW-DATA"]
    location = open_prefix(prefix)
    a, b = read_record(location, "id/a/v1"), read_record(location, "id/b/v1")
    assert a is not None and b is not None and b.inputs == {"id/a@v1": a.build_id}
    assert b.result == ["NEW-DATA"] and b.provenance["attempt"]["resumed"] is False


def test_a_partial_attempt_of_the_same_input_builds_is_resumed(tmp_path: Path) -> None:
    """The control: with a unchanged, b's second attempt resumes from its first."""
    prefix, env, fail = str(tmp_path / "p"), child_env(), tmp_path / "fail"
    fail.touch()
    marin("run", f"{TARGET}:resumed", "--prefix", prefix, env={**env, "MARIN_TEST_FAIL": str(fail)})
    ran = marin("run", f"{TARGET}:resumed", "--prefix", prefix, env=env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "resume id/b@v1: partial output from attempt 1" in ran.stderr
    assert json.loads((tmp_path / "p/id/b/v1/seen.json").read_text()) == ["OLD-DATA"] * 2


# --- finding 6: a job is reattached or collected only for the recipe it was submitted for -------

CODE_PIPELINE = """\
import os

from marin.execution.lazy import OUT, apply
from tests.reliability.pipelines import wait_for_file


def train(out_path: str) -> str:
    started = os.environ["MARIN_TEST_STARTED"]
    with open(started + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(started + ".tmp", started)
    wait_for_file(os.environ["MARIN_TEST_GATE"], timeout=120)
    return "{code}"


pipeline = [apply("code/train", train, version="v1", out_path=OUT).with_options(remote="local")]
"""


def code_pipeline(tmp_path: Path, code: str) -> str:
    """The pipeline file, its ``train`` returning ``code``; the CLI target."""
    (tmp_path / "codepipe.py").write_text(CODE_PIPELINE.format(code=code))
    return f"{tmp_path / 'codepipe.py'}:pipeline"


def test_a_running_job_of_old_code_is_replaced_once_the_code_is_fixed(tmp_path: Path) -> None:
    """The driver dies while its job runs; the user fixes the code. ``--on-code-drift error``
    stops, the job untouched; ``--on-code-drift rebuild`` cancels the old job, a job of the new
    code builds the step, and ``plan --on-code-drift error`` then calls the step clean."""
    prefix, env, started = str(tmp_path / "p"), remote_env(tmp_path), tmp_path / "started"
    target = code_pipeline(tmp_path, "OLD-CODE")
    old = killed_while_its_job_runs(tmp_path / "first.err", started, target, "--prefix", prefix,
                                    env=env)  # fmt: skip
    started.unlink()
    target = code_pipeline(tmp_path, "NEW-CODE")  # the fix
    plan = marin("plan", target, "--prefix", prefix, "--on-code-drift", "rebuild", env=env)
    assert "cancel (other code): local job marin-" in plan.stdout, plan.stdout + plan.stderr
    stopped = marin("run", target, "--prefix", prefix, "--on-code-drift", "error", env=env)
    assert stopped.returncode == 1 and "code changed since local job marin-" in stopped.stderr
    assert start_time(old) is not None  # under error, the job is left as it is
    second = start(tmp_path / "second.err", "run", target, "--prefix", prefix,
                   "--on-code-drift", "rebuild", env=env)  # fmt: skip
    wait_for_text(tmp_path / "second.err", "submit code/train@v1")
    err = (tmp_path / "second.err").read_text()
    assert "ran other code (code: train changed" in err, err
    wait_gone(old)  # cancelled before its output was cleared
    (tmp_path / "gate").touch()
    assert second.wait(timeout=90) == 0, (tmp_path / "second.err").read_text()
    record = read_record(open_prefix(prefix), "code/train/v1")
    assert record is not None and record.result == "NEW-CODE"
    clean = marin("plan", target, "--prefix", prefix, "--on-code-drift", "error", env=env)
    assert clean.returncode == 0 and "skip" in clean.stdout, clean.stdout + clean.stderr


def test_a_job_of_old_code_reattached_under_warn_records_the_old_code(tmp_path: Path) -> None:
    """Under ``--on-code-drift warn`` (the default) code is advisory: the old job is reattached,
    with a warning; its record names the code the job ran, so the next plan reports the drift
    (``--on-code-drift error`` stops) instead of calling old code's output the new code's."""
    prefix, env, started = str(tmp_path / "p"), remote_env(tmp_path), tmp_path / "started"
    target = code_pipeline(tmp_path, "OLD-CODE")
    killed_while_its_job_runs(tmp_path / "first.err", started, target, "--prefix", prefix, env=env)
    target = code_pipeline(tmp_path, "NEW-CODE")
    plan = marin("plan", target, "--prefix", prefix, env=env)
    assert "reattach: local job marin-" in plan.stdout and "runs other code" in plan.stdout
    (tmp_path / "gate").touch()
    ran = marin("run", target, "--prefix", prefix, env=env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "reattach code/train@v1" in ran.stderr and "reused (on_code_drift=warn)" in ran.stderr
    assert read_record(open_prefix(prefix), "code/train/v1").result == "OLD-CODE"  # type: ignore[union-attr]
    strict = marin("plan", target, "--prefix", prefix, "--on-code-drift", "error", env=env)
    assert strict.returncode == 1 and "code changed since the step was built" in strict.stderr


def test_force_with_rebuild_never_collects_a_finished_job_of_old_code(tmp_path: Path) -> None:
    """The orphaned job finished (with OLD-CODE) after its driver died; ``--force X
    --on-code-drift rebuild`` of the fixed code builds X anew instead of collecting it."""
    prefix, env, started = str(tmp_path / "p"), remote_env(tmp_path), tmp_path / "started"
    target = code_pipeline(tmp_path, "OLD-CODE")
    old = killed_while_its_job_runs(tmp_path / "first.err", started, target, "--prefix", prefix,
                                    env=env)  # fmt: skip
    (tmp_path / "gate").touch()
    wait_gone(old)  # it finished, with a result
    target = code_pipeline(tmp_path, "NEW-CODE")
    args = ("--prefix", prefix, "--force", "code/train", "--on-code-drift", "rebuild")
    plan = marin("plan", target, *args, env=env)
    assert "replace (forced): local job marin-" in plan.stdout, plan.stdout + plan.stderr
    unforced = marin("plan", target, *args[:2], *args[4:], env=env)
    assert "replace (other code): local job marin-" in unforced.stdout, unforced.stdout
    ran = marin("run", target, *args, env=env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "submit code/train@v1" in ran.stderr
    assert read_record(open_prefix(prefix), "code/train/v1").result == "NEW-CODE"  # type: ignore[union-attr]


def test_a_finished_job_that_read_a_replaced_input_is_not_collected(tmp_path: Path) -> None:
    """The driver dies; its job finishes reading a's OLD-DATA; a is then rebuilt (NEW-DATA) by
    another run. The next run submits a job reading the new a instead of committing the old
    job's output under a record naming a's new build."""
    prefix, env, started = str(tmp_path / "p"), remote_env(tmp_path), tmp_path / "started"
    job = killed_while_its_job_runs(tmp_path / "first.err", started, f"{TARGET}:remote",
                                    "--prefix", prefix, env=env)  # fmt: skip
    (tmp_path / "gate").touch()
    wait_gone(job)
    new = {**env, "MARIN_TEST_DATA": "NEW-DATA"}
    assert (
        marin("run", f"{TARGET}:data", "--prefix", prefix, "--force", "id/a", env=new).returncode
        == 0
    )
    plan = marin("plan", f"{TARGET}:remote", "--prefix", prefix, env=new)
    assert "replace (other input builds): local job marin-" in plan.stdout, plan.stdout
    ran = marin("run", f"{TARGET}:remote", "--prefix", prefix, env=new)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "read other input builds: upstream id/a@v1 was rebuilt after this step" in ran.stderr
    location = open_prefix(prefix)
    a, record = read_record(location, "id/a/v1"), read_record(location, "id/job/v1")
    assert a is not None and record is not None and record.result == ["NEW-DATA"]
    assert record.inputs == {"id/a@v1": a.build_id}


RACE_PIPELINE = """\
import os
import sys

if not sys.argv[0].endswith(os.path.join("marin", "cli.py")):  # in the job, not the driver
    open(os.environ["MARIN_TEST_IMPORTING"], "w").close()
    from tests.reliability.pipelines import wait_for_file

    wait_for_file(os.environ["MARIN_TEST_GATE"], timeout=120)  # the source is edited meanwhile

from racehelper import version

from marin.execution.lazy import OUT, apply


def train(out_path: str) -> str:
    return version()


pipeline = [apply("race/train", train, version="v1", out_path=OUT).with_options(remote="local")]
"""


def test_a_job_that_would_run_code_edited_after_its_submit_fails_clearly(tmp_path: Path) -> None:
    """A ``local`` job imports the pipeline's source when it starts: the source edited between
    the submit and that import would make the job run other code than the run lowered (and its
    record names). The job checks its code digest before ``fn`` runs and fails, naming the step
    and the fix; the next run builds the new code."""
    (tmp_path / "racepipe.py").write_text(RACE_PIPELINE)
    helper = tmp_path / "racehelper.py"
    helper.write_text('def version() -> str:\n    return "OLD"\n')
    prefix, importing = str(tmp_path / "p"), tmp_path / "importing"
    env = remote_env(tmp_path, MARIN_TEST_IMPORTING=str(importing))
    target = f"{tmp_path / 'racepipe.py'}:pipeline"
    driver = start(tmp_path / "err", "run", target, "--prefix", prefix, env=env)
    wait_for_file(str(importing), timeout=60)  # the job started; it has not imported train yet
    helper.write_text('def version() -> str:\n    return "NEW"\n')
    (tmp_path / "gate").touch()
    assert driver.wait(timeout=90) == 1
    err = (tmp_path / "err").read_text()
    assert "the job runs other code than it was submitted for: version changed" in err, err
    assert "(step race/train@v1)" in err and "run again" in err
    assert read_record(open_prefix(prefix), "race/train/v1") is None
    again = marin("run", target, "--prefix", prefix, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert read_record(open_prefix(prefix), "race/train/v1").result == "NEW"  # type: ignore[union-attr]


# --- finding 7: a torn job.json never clears the output its job may be writing ------------------


def test_a_torn_job_record_stops_the_build_and_clears_nothing(tmp_path: Path) -> None:
    """``job.json`` is torn while its job runs: ``run`` refuses the step, naming the file and
    how to stop the job first; the job's output and the job itself are untouched, and no second
    job starts. Following the advice then builds the step."""
    prefix, env, started = str(tmp_path / "p"), remote_env(tmp_path), tmp_path / "started"
    job = killed_while_its_job_runs(tmp_path / "first.err", started, f"{TARGET}:remote",
                                    "--prefix", prefix, env=env)  # fmt: skip
    record_file = tmp_path / "p/id/job/v1.marin/job.json"
    raw = record_file.read_text()
    job_id = re.search(r"marin-[0-9a-f]{20}", raw).group(0)  # type: ignore[union-attr]
    record_file.write_text(raw[: len(raw) // 2])  # torn
    plan = marin("plan", f"{TARGET}:remote", "--prefix", prefix, env=env)
    assert f"refuse: {record_file} cannot be read" in plan.stdout, plan.stdout + plan.stderr
    ran = marin("run", f"{TARGET}:remote", "--prefix", prefix, env=env)
    assert ran.returncode == 1
    assert f"{record_file} cannot be read" in ran.stderr and "nothing was cleared" in ran.stderr
    assert "stop that job first" in ran.stderr and f"pgrep -af {job_id}" in ran.stderr
    assert (tmp_path / "p/id/job/v1/partial.txt").exists()  # the job's output stays
    assert start_time(job) is not None and started.read_text() == str(job)  # one job, running
    os.killpg(job, signal.SIGKILL)  # the advice: stop the job, delete the file, run again
    wait_gone(job)
    record_file.unlink()
    (tmp_path / "gate").touch()
    again = marin("run", f"{TARGET}:remote", "--prefix", prefix, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert read_record(open_prefix(prefix), "id/job/v1").result == ["OLD-DATA"]  # type: ignore[union-attr]
