"""One history's sandbox: its folders, its pipeline file, and how it calls ``marin``.

Everything a history touches lives under one temporary folder::

    <one folder>/<stem>.py  the pipeline file (rewritten by each edit, a new inode each time)
    root/prefix/            the artifact prefix
    root/control/           the steps' control files (fail-, hold-, started-, release-)
    root/counter.jsonl      one line per fn start (outside the prefix)
    root/bystander/         files outside the prefix that nothing may touch
    root/jobs/              $MARIN_LOCAL_JOBS
    root/markers/           files that appear only if planted code ran
    root/outside/s<N>/      data an adoption adopts from outside the prefix (the user's)
    root/outside/moved-<N>/ a user's data moved out of an output path by hand (``userdata``)

``marin`` runs in this process (``marin.cli.main``, fast) or as a subprocess (``python -m
marin.cli``: needed to kill a driver, run two at once, or bound a run that may hang).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.oracle.checks import Hand, snapshot
from tests.oracle.oracle import scratch
from tests.oracle.pipeline import (
    NAME_PREFIX,
    PipelineModel,
    render,
    user_data_files,
    write_files,
)

RUN_TIMEOUT_S = float(os.environ.get("ORACLE_RUN_TIMEOUT_S", "12"))
"""A subprocess run of these small pipelines takes a second or two, even with a remote job:
one still running after this is waiting on something that will not end (a planted job). On a
machine loaded several times over its cores a run can take longer: a long run there sets
``$ORACLE_RUN_TIMEOUT_S`` higher, else it reports such runs as ``run-hung``."""

_serial = itertools.count()


_PIPES = tempfile.mkdtemp(prefix="marin-histories-", dir=scratch())
"""Every history's pipeline file, in one folder: loading a file target puts its folder on
``sys.path``, and a new ``sys.path`` makes the code digest list the installed distributions
again (a second each)."""
atexit.register(shutil.rmtree, _PIPES, True)


def _parser() -> Any:
    """``marin``'s parser, made once: making it loads every exporter's entry point."""
    if not _PARSER:
        from marin import cli

        _PARSER.append(cli.build_parser())
    return _PARSER[0]


_PARSER: list[Any] = []


@dataclass(frozen=True)
class Context:
    """Who runs, and where the run places and versions steps."""

    user: str = "alice"
    scope: str = "shared"
    version: str = "v1"
    override: tuple[int, str] | None = None

    def flags(self, deferred: bool, scope: bool = True) -> list[str]:
        out = ["--scope", self.scope] if scope and self.scope != "shared" else []
        if deferred:
            out += ["--version", self.version]
            if self.override is not None:
                out += ["--override", f"o/s{self.override[0]}={self.override[1]}"]
        return out


@dataclass
class Call:
    """One ``marin`` command and what it did."""

    argv: list[str]
    env: dict[str, str]
    rc: int | None
    out: str
    err: str
    run_id: str
    subprocess: bool
    timed_out: bool = False

    def json(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self.out)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


@dataclass
class World:
    """The sandbox of one history (see the module docstring)."""

    model: PipelineModel
    root: str = field(
        default_factory=lambda: tempfile.mkdtemp(prefix="marin-history-", dir=scratch())
    )
    stem: str = field(default_factory=lambda: f"hist_{os.getpid()}_{next(_serial)}")
    hand: Hand = field(default_factory=Hand)
    """What was damaged by hand (outputs after their commit, records removed)."""
    decoys: list[subprocess.Popen[bytes]] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)
    """Tokens of fns held and not released yet -> their step."""
    planted: bool = False
    """A job file naming a live process was planted: runs go to a subprocess, bounded by
    ``RUN_TIMEOUT_S``."""
    contexts: list[Context] = field(default_factory=list)
    drivers: list[subprocess.Popen[str]] = field(default_factory=list)
    timers: list[threading.Timer] = field(default_factory=list)

    user_data: dict[str, str] = field(default_factory=dict)
    """The adopted user data as the history last wrote it (relative path -> sha256), which
    no run or gc may change: empty without an adoption of the user's data."""
    users_own: dict[str, dict[str, str]] = field(default_factory=dict)
    """A user's data put by hand at an output path beside a metadata folder no attempt left
    (``userdata``): where it lies now -> its files (relative path -> sha256), which no run or
    gc may change."""
    refused_outputs: set[str] = field(default_factory=set)
    """The output paths such data lies at (until moved away): a build there is refused."""

    def __post_init__(self) -> None:
        for sub in ("prefix", "control", "bystander", "jobs", "markers", "tmp", "outside"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        with open(os.path.join(self.root, "bystander", "notes.txt"), "w") as f:
            f.write("not Marin's\n")
        self.write_pipeline(self.model)
        if self.model.adoption is not None and self.model.adoption.user_data:
            self.write_user_data(self.model.adoption.data_rev)

    # --- adopted user data ----------------------------------------------------------------

    @property
    def data_path(self) -> str | None:
        """Where the adopted user data lies (outside the prefix, or at the adopted step's own
        output path ``o/s<N>/v1``); None without such an adoption."""
        a = self.model.adoption
        if a is None or not a.user_data:
            return None
        if a.shape == "outside":
            return self.path("outside", f"s{a.step}")
        return os.path.join(self.prefix, NAME_PREFIX, f"s{a.step}", "v1")

    def write_user_data(self, rev: int) -> dict[str, bytes]:
        """Write the user data of revision ``rev`` by hand (the files it no longer has go);
        the files written."""
        a, where = self.model.adoption, self.data_path
        assert a is not None and where is not None
        files = user_data_files(a.step, rev)
        write_files(where, files)
        self.user_data = snapshot(where)
        return files

    # --- paths ------------------------------------------------------------------------------

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def prefix(self) -> str:
        return self.path("prefix")

    @property
    def pipeline_file(self) -> str:
        return os.path.join(_PIPES, f"{self.stem}.py")

    @property
    def target(self) -> str:
        return f"{self.pipeline_file}:pipeline"

    @property
    def feeder(self) -> str:
        """The feeder's pipeline (``pipeline.FEED``): the build an adoption's data lies in."""
        return f"{self.pipeline_file}:feeder"

    @property
    def teammate(self) -> str:
        """Another pipeline's target (``pipeline.TEAMMATE``): a teammate's gc keeps it."""
        return f"{self.pipeline_file}:teammate"

    def write_pipeline(self, model: PipelineModel) -> None:
        """Replace the file (a new inode: the digest's cache sees the edit at once) and forget
        the module this process imported from it."""
        self.model = model
        tmp = self.pipeline_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(render(model))
        os.replace(tmp, self.pipeline_file)
        sys.modules.pop(f"marin_target_{self.stem}", None)

    def use(self, ctx: Context) -> None:
        if ctx not in self.contexts:
            self.contexts.append(ctx)

    # --- running marin ----------------------------------------------------------------------

    def env(self, user: str, run_id: str) -> dict[str, str]:
        return {
            "MARIN_USER": user,
            "ORACLE_CONTROL": self.path("control"),
            "ORACLE_COUNTER": self.path("counter.jsonl"),
            "ORACLE_RUN": run_id,
            "MARIN_LOCAL_JOBS": self.path("jobs"),
            "MARIN_REMOTE_POLL_MAX_S": "0.1",
            "ORACLE_OUTSIDE": self.path("outside"),
        }

    def marin(
        self,
        argv: list[str],
        user: str,
        *,
        subprocess_: bool = False,
        extra: dict[str, str] | None = None,
    ) -> Call:
        """``marin ARGV --prefix P`` as ``user``, here or in a subprocess (bounded): with
        ``extra`` variables, or once job files were planted (a run may then wait forever)."""
        run_id = f"r{next(_serial)}"
        env = {**self.env(user, run_id), **(extra or {})}
        full = [*argv, "--prefix", self.prefix]
        if subprocess_ or extra or (self.planted and argv[0] == "run"):
            proc = self.start(full, env)
            return self.finish(proc, full, env, run_id)
        return self._in_process(full, env, run_id)

    def _in_process(self, argv: list[str], env: dict[str, str], run_id: str) -> Call:
        from marin import cli
        from tests.ux.helpers import marin_here

        parser = _parser()
        build_parser, cli.build_parser = cli.build_parser, lambda **_: parser  # made once
        try:
            done = marin_here(*argv, env=env)
        finally:
            cli.build_parser = build_parser
        return Call(argv, env, done.returncode, done.stdout, done.stderr, run_id, False)

    def start(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        child = {k: v for k, v in os.environ.items() if not k.startswith(("MARIN_", "ORACLE_"))}
        child.update(env, TMPDIR=self.path("tmp"), PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "marin.cli", *argv],
            cwd=self.root,
            env=child,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.drivers.append(proc)
        return proc

    def finish(
        self, proc: subprocess.Popen[str], argv: list[str], env: dict[str, str], run_id: str
    ) -> Call:
        timed_out = False
        try:
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            out, err = proc.communicate()
        return Call(argv, env, proc.returncode, out, err, run_id, True, timed_out)

    def new_run_id(self) -> str:
        return f"r{next(_serial)}"

    # --- control files ----------------------------------------------------------------------

    def control(self, name: str) -> str:
        return self.path("control", name)

    def hold(self, step: str) -> str:
        token = f"t{next(_serial)}"
        with open(self.control(f"hold-{step}"), "w") as f:
            f.write(token)
        self.held[token] = step
        return token

    def release(self, token: str) -> None:
        with contextlib.suppress(FileNotFoundError), open(self.control(f"release-{token}"), "w"):
            pass  # (FileNotFoundError: a late timer, after the sandbox is gone)
        self.held.pop(token, None)

    def started_pid(self, token: str) -> int | None:
        try:
            with open(self.control(f"started-{token}")) as f:
                return int(f.read().strip())
        except (FileNotFoundError, ValueError):
            return None

    def release_later(self, delay: float) -> None:
        """Release every held fn ``delay`` seconds from now (while the next run waits)."""
        tokens = list(self.held)
        for token in tokens:
            self.held.pop(token, None)
        timer = threading.Timer(delay, lambda: [self.release(t) for t in tokens])
        timer.daemon = True
        timer.start()
        self.timers.append(timer)

    # --- the end ------------------------------------------------------------------------------

    def close(self) -> None:
        for timer in self.timers:
            timer.join()  # its fns are released before the sandbox goes
        for token in list(self.held):
            pid = self.started_pid(token)
            self.release(token)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for proc in [*self.decoys, *self.drivers]:
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        sys.modules.pop(f"marin_target_{self.stem}", None)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.pipeline_file)
        _wait_for_jobs(self.path("control"))
        shutil.rmtree(self.root, ignore_errors=True)


def _wait_for_jobs(control: str, timeout: float = 5.0) -> None:
    """Held jobs were released: let them end before their folders go (bounded)."""
    deadline = time.monotonic() + timeout
    for name in os.listdir(control) if os.path.isdir(control) else []:
        if not name.startswith("started-"):
            continue
        try:
            pid = int(open(os.path.join(control, name)).read().strip())
        except (OSError, ValueError):
            continue
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive: it ended.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False
