"""The ``local`` backend: a remote step's job is a detached process on this machine.

Each job has a folder of its own, ``<jobs root>/<job id>``, outside the prefix: the jobs root
is ``$MARIN_LOCAL_JOBS``, else ``$XDG_CACHE_HOME/marin/jobs`` (``~/.cache/marin/jobs``),
created with mode 700 and refused when it is a link, someone else's, or writable by others
(``jobs_root``): what is in it was written by this user's own drivers and jobs, so the payload
a job unpickles and the pid a cancel signals cannot be planted by whoever writes the prefix.
``owner.json`` (what the job is for), ``call.pkl`` in; ``pid.json``, ``log.txt`` and
``result.json`` out; ``cancelled`` once cancelled; a gang's (``gang.py``) also ``ranks.json``,
``rank-K/`` (each rank's outcome and log) and, when a rank was killed, ``lost.json``. The
process is started by ``local_job`` in a session of its own, so it outlives the driver (a
closed terminal, a SIGKILL); any later driver of this user on this machine finds it by its id.
Promises: one process per submission key (a
folder that holds a started job is never started again); a job has ended only once its process
group has (``procs.end_group``: what its ranks started dies with it); one that died without a
result is ``LOST``; ``cancel`` kills the job's whole process group, once its pid is provably
the job's (start time and command line, ``procs.py``); ``release`` removes an ended job's
folder once the core is done with it (``cleanup.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

from marin.execution.atomic_file import write_file_atomically
from marin.execution.errors import RemoteJobError
from marin.execution.remote.job_files import (
    CALL,
    CANCELLED,
    LOG,
    LOST,
    OWNER,
    PID,
    RANKS,
    RESULT,
    rank_folder,
)
from marin.execution.remote.log_tail import tail_lines
from marin.execution.remote.procs import JOB_ENV, end_group, group_members, runs_in
from marin.execution.remote.protocol import JobHandle, JobSpec, JobStatus
from marin.execution.store.step_folder import JOB_ID
from marin.execution.vocabulary import JobState

JOBS_ENV = "MARIN_LOCAL_JOBS"
_KILL_WAIT_S = 5.0
CANCELLING = "cancelling"
"""Written before ``cancel`` kills: a job that dies meanwhile was stopped, never lost (a
driver polling then would take it for a preemption and submit it again)."""
_LAUNCHER = "marin.execution.remote.local_job"

_checked: set[str] = set()
_checked_lock = threading.Lock()


def jobs_root_path() -> str:
    """Where local jobs' folders go (not checked: ``jobs_root``)."""
    given = os.environ.get(JOBS_ENV)
    if given:
        return os.path.abspath(given)
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "marin", "jobs")


def jobs_root(step_id: str | None = None) -> str:
    """The jobs root, created (mode 700) if missing and checked once per process: a real
    folder of this user that no one else can write, under folders that no one else can change
    (owned by this user or root, and not writable by others unless sticky, as ``/tmp``): else
    another user could swap the folder between a submit and the job's start.

    Raises:
        RemoteJobError: it is a link, not a folder, someone else's, or writable by others, or
            a folder above it is someone else's or writable by others without the sticky bit;
            the message names the folder and the fix.
    """
    root = jobs_root_path()
    with _checked_lock:
        if root in _checked:
            return root
    os.makedirs(os.path.dirname(root), exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    info = os.lstat(root)
    problem = ""
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder"
    elif info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    elif info.st_mode & 0o022:
        problem = f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    else:
        problem = _unsafe_parent(root)
    if problem:
        raise RemoteJobError(
            f"the local jobs folder {root} {problem}: another user could plant the payload "
            "a job runs or the pid a cancel kills",
            f"run `chmod 700 {root}` on a real folder of your own, under folders only you or "
            f"root can change, or set {JOBS_ENV} to such a folder (Marin creates it with "
            "mode 700)",
            step_id,
        )
    with _checked_lock:
        _checked.add(root)
    return root


def _unsafe_parent(path: str) -> str:
    """Why a folder on the way to ``path`` (each one a name is looked up in, links followed)
    lets someone else rename or replace what is in it; "" when none does."""
    parts = [p for p in path.split("/") if p]
    here, hops = "/", 0
    while parts:
        info = os.stat(here)
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (os.getuid(), 0):
            return f"is inside {here}, which belongs to uid {info.st_uid} (not you, not root)"
        if mode & 0o022 and not mode & stat.S_ISVTX:
            return f"is inside {here}, which others can write (mode {mode:o}, not sticky)"
        name = parts.pop(0)
        step = os.path.join(here, name)
        if name in (".", ".."):
            here = os.path.normpath(step)
        elif stat.S_ISLNK(os.lstat(step).st_mode):
            hops += 1
            if hops > 40:
                return f"is reached through a loop of links at {step}"
            target = os.readlink(step)
            parts = [p for p in target.split("/") if p] + parts
            here = "/" if target.startswith("/") else here
        else:
            here = step
    return ""


def _folder_of(handle: JobHandle) -> str | None:
    """The job's folder: from its id alone, under the jobs root (``job.json`` is untrusted:
    nothing it holds is followed); None for an id that is not Marin's."""
    if not JOB_ID.fullmatch(handle.job_id):
        return None
    return os.path.join(jobs_root(), handle.job_id)


class LocalBackend:
    """Detached processes on this machine; see the module docstring."""

    name = "local"

    def submit(self, job: JobSpec, idempotency_key: str) -> JobHandle:
        if not JOB_ID.fullmatch(idempotency_key):
            raise ValueError(f"{idempotency_key!r} is not a Marin job id")
        folder = os.path.join(jobs_root(job.step_id), idempotency_key)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        handle = JobHandle(self.name, idempotency_key, {})
        try:  # the key's folder is claimed once: a second submit of one key starts nothing
            fd = os.open(os.path.join(folder, OWNER), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return handle
        with os.fdopen(fd, "w") as f:
            f.write(job.owner)
        fd = os.open(os.path.join(folder, CALL), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(job.call)
        env = {**os.environ, **job.env, "PYTHONUNBUFFERED": "1", JOB_ENV: folder}
        gang = [str(job.ranks), str(job.gpus)] if job.ranks > 1 else []
        subprocess.run(  # -P: never a module of the working folder (anyone's /tmp) first
            [sys.executable, "-P", "-m", _LAUNCHER, folder, *gang],
            env=env,
            stdin=subprocess.DEVNULL,
            check=True,
        )
        return handle

    def scope(self) -> dict[str, str]:
        """Where a later driver sees the jobs this one submits: this host, this user, this
        jobs root (checked); recorded in ``job.json`` before the submit."""
        uid = os.getuid()
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:  # a uid without a name (a container's)
            user = str(uid)
        root = os.path.realpath(jobs_root())
        return {"host": socket.gethostname(), "user": user, "uid": str(uid), "jobs_root": root}

    def running_jobs(self) -> dict[str, str]:
        """Each job of the jobs root that runs now, with its owner (whatever ``job.json``
        files say): a second job for the same output is never started beside one. Only
        looked at (``peek``): ``plan`` asks too, and a dead job's leftovers still write."""
        found = {}
        for name in sorted(os.listdir(jobs_root())):
            if not JOB_ID.fullmatch(name):
                continue
            handle = JobHandle(self.name, name, {})
            owner = self.owner(handle)
            if owner and self.peek(handle).state == JobState.RUNNING:
                found[name] = owner
        return found

    def owner(self, handle: JobHandle) -> str | None:
        folder = _folder_of(handle)
        if folder is None or not os.path.isdir(folder):
            return None
        try:
            with open(os.path.join(folder, OWNER), encoding="utf-8", errors="replace") as f:
                return f.read(64 * 1024)
        except OSError:
            return ""

    def status(self, handle: JobHandle) -> JobStatus:
        """The job's state; a dead job's leftover processes are killed first (the poller of a
        driver waiting for it asks this: a job is not ended while its group runs)."""
        return self._state(handle, reap=True)

    def peek(self, handle: JobHandle) -> JobStatus:
        """``status`` without a signal: leftovers of a dead job count as running (``peek``)."""
        return self._state(handle, reap=False)

    def _state(self, handle: JobHandle, reap: bool) -> JobStatus:
        folder = _folder_of(handle)
        if folder is None or not os.path.isdir(folder):
            return JobStatus(JobState.LOST, detail="its folder is gone")
        alive = self._alive(folder)
        done = self._result(folder)
        if done is None and os.path.exists(os.path.join(folder, CANCELLED)):
            return JobStatus(JobState.STOPPED, detail="cancelled")
        # A plain job's watcher ends the job's process group before it exits; a gang's
        # supervisor does before it writes the result.
        if alive and (done is None or "watcher" in _pid_info(folder)):
            return JobStatus(JobState.RUNNING)
        if not alive and not self._group_ended(folder, reap):
            return JobStatus(JobState.RUNNING)  # a process of its group still runs
        if os.path.exists(os.path.join(folder, CANCELLING)):
            lost = JobStatus(JobState.STOPPED, detail="cancelled")  # nothing of it runs now
        else:
            lost = JobStatus(JobState.LOST, detail=_lost_detail(folder))
        return done or self._result(folder) or lost  # it may have ended between the looks

    @staticmethod
    def _result(folder: str) -> JobStatus | None:
        """``fn`` ended (returned or raised): ``isolated_child`` wrote its outcome."""
        try:
            with open(os.path.join(folder, RESULT), "rb") as f:
                ended = os.fstat(f.fileno()).st_mtime  # written once, as fn ended
                return JobStatus(JobState.SUCCEEDED, result=f.read(), ended_at=ended)
        except FileNotFoundError:
            return None

    def logs(self, handle: JobHandle, tail: int = 40) -> str:
        folder = _folder_of(handle)
        if folder is None:
            return ""
        try:  # by lines, from its end: a huge line is cut, never hides those before it
            with open(os.path.join(folder, LOG), "rb") as f:
                return "\n".join(tail_lines(f, tail))
        except OSError:
            return ""

    def log_location(self, handle: JobHandle) -> str:
        """The job's log file (``marin show``)."""
        folder = _folder_of(handle)
        return "" if folder is None else os.path.join(folder, LOG)

    def follow(self, handle: JobHandle) -> _LogFile:
        """The job's ``log.txt`` from its start, read as it grows (``follow.py``)."""
        folder = _folder_of(handle)
        return _LogFile(None if folder is None else os.path.join(folder, LOG))

    def cancel(self, handle: JobHandle) -> None:
        folder = _folder_of(handle)
        if folder is None:
            return
        pid = self._pid(folder)
        if pid is not None:
            write_file_atomically(os.path.join(folder, CANCELLING), b"")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # its own session: pid is its group's id
            deadline = time.monotonic() + _KILL_WAIT_S
            while self._alive(folder) and time.monotonic() < deadline:
                time.sleep(0.01)  # a killed process is gone in milliseconds
        self._group_ended(folder, reap=True)  # what the job started and its watcher could not end
        if os.path.isdir(folder):  # after the kill: STOPPED means nothing of it runs any more
            write_file_atomically(os.path.join(folder, CANCELLED), b"")

    def ranks(self, handle: JobHandle) -> list[dict[str, object]]:
        """A gang job's ranks: each one's host and state (``running``, ``returned``,
        ``failed``, ``ended``), from the supervisor's ``ranks.json``; none for another job."""
        folder = _folder_of(handle)
        try:
            with open(os.path.join(folder or "", RANKS), "rb") as f:
                listed = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            return []
        found = []
        for entry in listed if isinstance(listed, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("rank"), int):
                continue
            found.append({"rank": entry["rank"], "host": str(entry.get("host", "?"))[:100],
                          "state": _rank_state(str(folder), entry)})  # fmt: skip
        return found

    def release(self, handle: JobHandle) -> None:
        """Remove an ended job's folder (``cleanup.py``): only a real folder (not a link)
        under the jobs root named by a Marin job id, holding a result, whose process has
        exited; ``rmtree`` follows no link inside."""
        folder = _folder_of(handle)
        if folder is None or not os.path.isdir(folder):
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
        """The job's pid while that very process lives: its start time is the recorded one
        (a reused pid is not it) and its command line names the job's folder."""
        info = _pid_info(folder)
        pid = info.get("pid")
        if not isinstance(pid, int) or not runs_in(pid, info.get("start_time"), folder):
            return None
        return pid

    def _group_ended(self, folder: str, reap: bool) -> bool:
        """Kill (``reap``) what is left of the job's process group (its recorded pid is the
        group's id; a member is the job's only while its environment names the job's folder)
        and say whether the group is empty: a job is not ended while a process it started runs."""
        pid = _pid_info(folder).get("pid")
        if not isinstance(pid, int):
            return True
        return end_group(pid, folder, _KILL_WAIT_S) if reap else not group_members(pid, folder)

    def _alive(self, folder: str) -> bool:
        """The job runs, or its watcher (``local_job``) has not yet said how it ended."""
        if self._pid(folder) is not None:
            return True
        watcher = _pid_info(folder).get("watcher")
        watcher = watcher if isinstance(watcher, dict) else {}
        return runs_in(watcher.get("pid"), watcher.get("start_time"), folder)  # type: ignore[arg-type]


def _pid_info(folder: str) -> dict[str, object]:
    """``DIR/pid.json`` as written ({} if it cannot be read)."""
    try:
        with open(os.path.join(folder, PID), "rb") as f:
            info = json.loads(f.read(4096))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


class _LogFile:
    """A local job's log read from an offset: never through a link (``O_NOFOLLOW``)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None

    def read(self, most: int) -> bytes:
        if self._fd is None and self.path is not None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:  # not written yet (or not a file of the job's)
                return b""
        return b"" if self._fd is None else os.read(self._fd, most)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _rank_state(folder: str, entry: dict[str, object]) -> str:
    """A rank's state: its outcome if it wrote one, else whether its process still runs."""
    try:
        with open(os.path.join(rank_folder(folder, int(str(entry["rank"]))), RESULT), "rb") as f:
            outcome = json.loads(f.read(1 << 16))
        return "returned" if isinstance(outcome, dict) and outcome.get("ok") is True else "failed"
    except (OSError, ValueError):
        pass
    pid = entry.get("pid")
    alive = isinstance(pid, int) and runs_in(pid, entry.get("start_time"), folder)
    return "running" if alive else "ended"


def _lost_detail(folder: str) -> str:
    """Why a job ended without a result: the signal that killed it (a gang's: which rank)."""
    try:
        with open(os.path.join(folder, LOST), "rb") as f:
            lost = json.loads(f.read(4096))
        killed = f"was killed by {str(lost['signal'])[:20]}"
        return f"rank {int(lost['rank'])} {killed}" if "rank" in lost else f"its process {killed}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its process ended without a result"
