"""The ``local`` backend: a remote step's job is a detached process on this machine.

Each job has a folder of its own (the step's metadata folder on a local prefix, else one under
``$MARIN_LOCAL_JOBS`` or the temporary folder): ``call.pkl`` in; ``pid.json``, ``log.txt`` and
``result.pkl`` out; ``cancelled`` once cancelled. The process is started by ``local_job`` in a
session of its own, so it outlives the driver (a closed terminal, a SIGKILL); any later driver
on this machine finds it through ``job.json`` and asks here. Promises: one process per
submission key (a folder that holds a started job is never started again); a job that died
without a result is ``LOST``; ``cancel`` kills the job's whole process group; ``release``
removes an ended job's folder once the core is done with it (``cleanup.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

from marin.execution.atomic_file import write_file_atomically
from marin.execution.pipeline.remote.job_record import JOB_ID
from marin.execution.pipeline.remote.local_job import start_time
from marin.execution.pipeline.remote.protocol import JobHandle, JobSpec, JobStatus
from marin.execution.vocabulary import JobState

JOBS_ENV = "MARIN_LOCAL_JOBS"
_KILL_WAIT_S = 5.0


def jobs_root() -> str:
    return os.environ.get(JOBS_ENV) or os.path.join(tempfile.gettempdir(), "marin-jobs")


def _folder(key: str, workdir: str | None) -> str:
    return os.path.join(workdir or jobs_root(), key)


def _folder_of(handle: JobHandle) -> str:
    """The job's folder, where ``submit`` put it: from its id and the ``workdir`` the core
    checked (``job.json`` is untrusted: a recorded folder is never followed)."""
    return _folder(handle.job_id, handle.data.get("workdir"))


class LocalBackend:
    """Detached processes on this machine; see the module docstring."""

    name = "local"

    def submit(self, job: JobSpec, idempotency_key: str) -> JobHandle:
        folder = _folder(idempotency_key, job.workdir)
        os.makedirs(folder, exist_ok=True)
        handle = JobHandle(self.name, idempotency_key, {})
        try:  # the key's folder is claimed once: a second submit of one key starts nothing
            fd = os.open(os.path.join(folder, "call.pkl"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return handle
        with os.fdopen(fd, "wb") as f:
            f.write(job.call)
        env = {**os.environ, **job.env, "PYTHONUNBUFFERED": "1"}
        subprocess.run(
            [sys.executable, "-m", "marin.execution.pipeline.remote.local_job", folder],
            env=env,
            stdin=subprocess.DEVNULL,
            check=True,
        )
        return handle

    def status(self, handle: JobHandle) -> JobStatus:
        folder = _folder_of(handle)
        if not folder or not os.path.isdir(folder):
            return JobStatus(JobState.LOST, detail="its folder is gone")
        done = self._result(folder)
        if done is not None:
            return done
        if os.path.exists(os.path.join(folder, "cancelled")):
            return JobStatus(JobState.STOPPED, detail="cancelled")
        if self._alive(folder):
            return JobStatus(JobState.RUNNING)
        return self._result(folder) or JobStatus(  # it may have ended between the two looks
            JobState.LOST, detail="its process ended without a result"
        )

    @staticmethod
    def _result(folder: str) -> JobStatus | None:
        """``fn`` ended (returned or raised): ``isolated_child`` wrote its outcome."""
        try:
            with open(os.path.join(folder, "result.pkl"), "rb") as f:
                return JobStatus(JobState.SUCCEEDED, result=f.read())
        except FileNotFoundError:
            return None

    def logs(self, handle: JobHandle, tail: int = 40) -> str:
        try:
            with open(os.path.join(_folder_of(handle), "log.txt"), "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:])

    def cancel(self, handle: JobHandle) -> None:
        folder = _folder_of(handle)
        pid = self._pid(folder)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # its own session: pid is its group's id
            deadline = time.monotonic() + _KILL_WAIT_S
            while self._alive(folder) and time.monotonic() < deadline:
                time.sleep(0.01)  # a killed process is gone in milliseconds
        if os.path.isdir(folder):  # after the kill: STOPPED means nothing of it runs any more
            write_file_atomically(os.path.join(folder, "cancelled"), b"")

    def release(self, handle: JobHandle) -> None:
        """Remove an ended job's folder (``cleanup.py``): only a real folder (not a link) named
        by a Marin job id, holding a result, whose process has exited; ``rmtree`` follows no
        link inside."""
        folder = _folder_of(handle)
        if not JOB_ID.fullmatch(handle.job_id) or not os.path.isdir(folder):
            return
        if stat.S_ISLNK(os.lstat(folder).st_mode) or self._result(folder) is None:
            return  # a link is not the job's folder; a job without a result may still run
        deadline = time.monotonic() + _KILL_WAIT_S
        while self._alive(folder):  # it wrote its result: it exits within milliseconds
            if time.monotonic() > deadline:
                return  # still running: its files are in use
            time.sleep(0.01)
        shutil.rmtree(folder)

    def _pid(self, folder: str) -> int | None:
        """The job's pid while that very process lives (a reused pid is not it)."""
        try:
            with open(os.path.join(folder, "pid.json"), "rb") as f:
                info = json.loads(f.read())
        except (OSError, ValueError):
            return None
        pid, started = info.get("pid"), info.get("start_time")
        if not isinstance(pid, int) or started is None or start_time(pid) != started:
            return None
        return pid

    def _alive(self, folder: str) -> bool:
        return self._pid(folder) is not None
