"""Storage and logs are untrusted input for remote jobs (issue 53): a file planted under the
prefix is never unpickled, followed or signalled; a ``local`` job's files live in a private
folder outside the prefix; the driver reads a bounded tail of a job's log; a full disk is
named. Every case goes through ``marin run`` in a subprocess, as a user meets it; planted
records point at a decoy process, which must survive."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin.execution.lazy import lower
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.remote.procs import start_time
from marin.execution.remote.protocol import job_owner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.reliability import remote_pipelines
from tests.reliability.conftest import REPO
from tests.reliability.test_remote import TRAIN, setup

PLANTED = "marin-" + "d" * 20


def cli(
    target: str, prefix: str, env: dict[str, str], command: str = "run", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``marin COMMAND`` of a pipeline of ``remote_pipelines.py``, in a subprocess."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "marin.cli", command,
         f"tests/reliability/remote_pipelines.py:{target}", "--prefix", prefix],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"marin {command} never ended:\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def train_spec() -> StepSpec:
    spec = lower(remote_pipelines._model)
    assert spec.step_id == "remote/train@v1"
    return spec


def plant_record(prefix: str, fingerprint: str, data: dict[str, str] | None = None) -> Path:
    """A ``job.json`` for ``remote/train@v1`` naming ``PLANTED``; its metadata folder."""
    meta = Path(prefix) / f"{TRAIN}.marin"
    meta.mkdir(parents=True, exist_ok=True)
    record = {
        "backend": "local", "job_id": PLANTED, "build_id": "planted-build",
        "submitted_at": "2026-01-01T00:00:00+00:00", "data": data or {},
        "fingerprint": fingerprint,
    }  # fmt: skip
    (meta / "job.json").write_text(json.dumps(record))
    return meta


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process group of this user (``sleep``): it must never be signalled."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def assert_survived(decoy: subprocess.Popen[bytes]) -> None:
    """The decoy still runs; ended by this test's SIGTERM, its return code says so (-15)."""
    assert decoy.poll() is None, f"the decoy was killed (rc {decoy.returncode})"
    decoy.terminate()
    assert decoy.wait(timeout=10) == -signal.SIGTERM


def built_by_its_own_job(prefix: str) -> dict[str, object]:
    record = read_record(open_prefix(prefix), TRAIN)
    assert record is not None
    assert record.provenance["job"]["job_id"] not in (PLANTED, "")
    assert isinstance(record.result, dict) and "pid" in record.result  # the real fn's value
    return record.result


@pytest.mark.parametrize(
    "where",
    [
        "prefix pid, same config",  # once reattached to the decoy and waited for it
        "prefix pid, other config",  # once SIGKILLed the decoy's group (rc -9)
        "jobs-root pid of this build",  # a pid reused by the decoy: start time alone matches
    ],
)
def test_a_planted_job_record_never_signals_a_decoy(
    tmp_path: Path, decoy: subprocess.Popen[bytes], where: str
) -> None:
    prefix, env = setup(tmp_path)
    del env["MARIN_TEST_GATE"]
    spec = train_spec()
    pid_info = json.dumps({"pid": decoy.pid, "start_time": start_time(decoy.pid)})
    fingerprint = spec.fingerprint if where == "prefix pid, same config" else "another"
    meta = plant_record(prefix, fingerprint)
    if where.startswith("prefix"):
        planted = meta / PLANTED
        planted.mkdir()
        (planted / "pid.json").write_text(pid_info)
        (planted / "call.pkl").write_bytes(b"")
        plant_record(prefix, fingerprint, {"workdir": str(meta)})
    else:  # the job's own folder vouches for this build; only its pid is the decoy's
        folder = tmp_path / "jobs" / PLANTED
        folder.mkdir(parents=True)
        os.chmod(tmp_path / "jobs", 0o700)
        (folder / "pid.json").write_text(pid_info)
        output = open_prefix(prefix).path(spec.output_path)
        (folder / "owner.json").write_text(job_owner(output, "planted-build"))
    done = cli("chain", prefix, env, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    built_by_its_own_job(prefix)
    assert_survived(decoy)


@pytest.mark.parametrize("workdir", ["none", "elsewhere"])
def test_a_planted_result_is_never_unpickled_nor_followed(tmp_path: Path, workdir: str) -> None:
    """A planted ``job.json`` (this config's fingerprint; no ``workdir``, or another folder)
    naming ``PLANTED``, beside ``result.pkl`` payloads that would create a marker file, in
    the prefix, in ``$MARIN_LOCAL_JOBS`` and elsewhere, and a finished ``result.json`` of a
    job of another step in the jobs root: the step is built by a job of its own, the marker
    never appears, and no planted folder is removed."""
    prefix, env = setup(tmp_path)
    del env["MARIN_TEST_GATE"]
    marker = tmp_path / "marker"
    payload = pickle.dumps(_Touch(str(marker)))
    outcome = pickle.dumps({"ok": True, "result": payload})
    elsewhere = tmp_path / "elsewhere"
    meta = plant_record(prefix, train_spec().fingerprint)
    data = {} if workdir == "none" else {"workdir": str(elsewhere)}
    plant_record(prefix, train_spec().fingerprint, data)
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o700)
    folders = [meta / PLANTED, jobs / PLANTED, elsewhere / PLANTED]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / "result.pkl").write_bytes(outcome)
    # A finished job of another step of this user, in the jobs root: never this step's.
    (jobs / PLANTED / "result.json").write_text(json.dumps({"ok": True, "result": "planted"}))
    (jobs / PLANTED / "owner.json").write_text(job_owner("/another/step/v1", "planted-build"))
    done = cli("chain", prefix, env, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    built_by_its_own_job(prefix)
    assert not marker.exists()
    assert all((folder / "result.pkl").exists() for folder in folders)  # none removed
    assert (jobs / PLANTED / "result.json").exists()


class _Touch:
    """Unpickling this runs ``touch PATH`` (what a planted pickle could do)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.path}",))


def test_local_job_files_live_in_a_private_folder_outside_the_prefix(tmp_path: Path) -> None:
    """Without ``$MARIN_LOCAL_JOBS`` the jobs root is ``~/.cache/marin/jobs`` (mode 700); while
    the job runs, its payload, pid and log are there and nothing of it is under the prefix.
    Submitting prints no ``RuntimeWarning`` (runpy's, of a module imported before ``-m``)."""
    prefix, env = setup(tmp_path, HOME=str(tmp_path / "home"))
    del env["MARIN_LOCAL_JOBS"]
    env.pop("XDG_CACHE_HOME", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", "tests/reliability/remote_pipelines.py:chain",
         "--prefix", prefix],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        started = tmp_path / "started" / "remote_train"
        from tests.reliability.pipelines import wait_for_file

        wait_for_file(str(started), timeout=60)
        root = tmp_path / "home" / ".cache" / "marin" / "jobs"
        (job,) = os.listdir(root)
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        assert {"owner.json", "call.pkl", "pid.json", "log.txt"} <= set(os.listdir(root / job))
        meta = Path(prefix) / f"{TRAIN}.marin"
        assert sorted(p for p in os.listdir(meta) if p.startswith("marin-")) == []
        (tmp_path / "gate").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "RuntimeWarning" not in err, err
    built_by_its_own_job(prefix)
    assert os.listdir(root) == []  # committed: the job's folder is gone


@pytest.mark.parametrize("problem", ["others can write", "a link", "another user's"])
def test_an_unsafe_jobs_root_is_refused_naming_the_fix(tmp_path: Path, problem: str) -> None:
    prefix, env = setup(tmp_path)
    del env["MARIN_TEST_GATE"]
    root = tmp_path / "jobs"
    if problem == "a link":
        (tmp_path / "real").mkdir(mode=0o700)
        root.symlink_to(tmp_path / "real")
    elif problem == "another user's" and os.getuid() != 0:
        root = Path("/usr")  # root's, and only root's to write (this user cannot chown)
        env["MARIN_LOCAL_JOBS"] = str(root)
    else:
        root.mkdir()
        os.chmod(root, 0o777 if problem == "others can write" else 0o700)
        if problem == "another user's":
            os.chown(root, os.getuid() + 4242, -1)
    done = cli("chain", prefix, env, timeout=90)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert f"the local jobs folder {root}" in last and "(step remote/train@v1)" in last, last
    assert f"chmod 700 {root}" in last and "MARIN_LOCAL_JOBS" in last
    assert read_record(open_prefix(prefix), TRAIN) is None
    assert not any(p.name.startswith("marin-") for p in (tmp_path / "real").glob("*"))


def test_a_long_log_is_read_from_its_end(tmp_path: Path) -> None:
    """A job that logged 200 MiB: the driver keeps its last lines (into the step's log) with
    its peak RSS within 40 MiB of a run whose job logged 1 MiB (it once read it all: a 600 MB
    log cost 1.6 GB)."""
    peaks = {}
    for mb in (1, 200):
        (tmp_path / str(mb)).mkdir()
        prefix, env = setup(tmp_path / str(mb), MARIN_TEST_LOG_MB=str(mb))
        del env["MARIN_TEST_GATE"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "marin.cli", "run",
             "tests/reliability/remote_pipelines.py:loud", "--prefix", prefix],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode == 0
        peaks[mb] = usage.ru_maxrss * 1024  # KiB on Linux
        log = (Path(prefix) / "remote/loud/v1.marin/log.txt").read_text()
        assert log.rstrip().endswith("the last line"), log[-500:]
    growth = peaks[200] - peaks[1]
    assert growth < 40 * 2**20, f"peak RSS grew {growth / 2**20:.0f} MiB for a 200 MiB log"


def test_a_memory_prefix_refuses_steps_that_run_in_another_process(tmp_path: Path) -> None:
    """``remote=`` and ``isolate=True`` on ``memory://``: refused when planned, by ``plan``
    and ``run`` alike, naming the step, the option and the fix (once: built "empty")."""
    _, env = setup(tmp_path)
    for target, step, option in (
        ("chain", "remote/train@v1", "remote='local'"),
        ("isolated", "iso/train@v1", "isolate=True"),
    ):
        for command in ("plan", "run"):
            done = cli(target, "memory://trust", env, command, timeout=60)
            assert done.returncode == 2, (command, done.stdout, done.stderr)
            last = done.stderr.strip().splitlines()[-1]
            assert last.startswith(f"error: {option} runs fn in another process"), last
            assert f"(step {step})" in last and "--prefix /tmp/marin" in last, last


def test_a_failed_jobs_error_is_one_line_without_escapes(tmp_path: Path) -> None:
    """The last line of a failed run names the job's error and its log's last lines on one
    line: the newline before the tail is a space, never a literal ``\\x0a``."""
    (tmp_path / "fail").touch()
    prefix, env = setup(tmp_path, MARIN_TEST_FAIL=str(tmp_path / "fail"))
    del env["MARIN_TEST_GATE"]
    done = cli("chain", prefix, env, timeout=90)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "failed: RuntimeError: loss is nan; the last lines of its log: " in last, last
    assert "training diverged" in last and "\\x0a" not in done.stderr


def test_a_job_that_hit_a_full_disk_says_enospc(tmp_path: Path) -> None:
    """``fn`` writes to ``/dev/full`` (the kernel's ENOSPC): the step's error says the disk
    was full (its outcome carries the errno)."""
    prefix, env = setup(tmp_path, MARIN_TEST_FILL="/dev/full")
    done = cli("full", prefix, env, timeout=90)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "failed: the disk was full (ENOSPC): OSError: [Errno 28]" in last, last
    assert "free space on the disk the job writes to" in last


def _in_small_tmpfs(size: str, folder: Path, argv: list[str]) -> list[str]:
    """``argv`` run in a mount namespace of its own where ``folder`` is a ``size`` tmpfs."""
    script = f'mount -t tmpfs -o size={size} tmpfs "$1" && shift && exec "$@"'
    return ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private",
            "sh", "-c", script, "sh", str(folder), *argv]  # fmt: skip


def test_a_job_on_a_disk_that_filled_up_says_enospc(tmp_path: Path) -> None:
    """The prefix and the jobs root on one small tmpfs that ``fn`` fills: even the job's
    outcome cannot be written (it once ended "lost", its log empty); the reserve its
    outcome file keeps says ENOSPC, and the step's error does."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(_in_small_tmpfs("1m", tmp_path, ["true"]), capture_output=True).returncode
    ):
        pytest.skip("needs a mount namespace (unshare --user --mount)")
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "ctl").mkdir()
    env = setup(tmp_path / "ctl")[1]
    env["MARIN_LOCAL_JOBS"] = str(disk / "jobs")
    argv = [sys.executable, "-m", "marin.cli", "run", "tests/reliability/remote_pipelines.py:full",
            "--prefix", str(disk / "prefix")]  # fmt: skip
    done = subprocess.run(
        _in_small_tmpfs("4m", disk, argv), cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "failed: the disk was full (ENOSPC)" in last, last
    assert "ended lost" not in last
