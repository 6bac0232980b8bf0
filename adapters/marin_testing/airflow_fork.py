"""``airflow <command>`` in a fresh process forked from one that has Airflow loaded.

Most of an ``airflow dags test`` of a small DAG is spent around the DAG, not in it: importing
Airflow (1-4 s on 2 cores), building the in-process execution API its tasks talk to (Cadwyn
generates the API's versioned routes on its first request: 3-10 s) and tearing the interpreter
down. A fork server pays the first two once per sandbox. Run as ``python -m
marin_testing.airflow_fork`` with the sandbox's environment, it imports Airflow's CLI, builds
the execution API that Airflow keeps per process (``supervisor.in_process_api_server``) and
waits. For each command it forks a child, which takes the command's environment, working
directory and output files and runs ``airflow.__main__.main()`` (what ``python -m airflow``
runs) with the command's arguments, then Airflow's exit hooks. Each command so runs in a process
of its own: nothing a DAG run imports, sets or kills reaches the next one.

Only the Airflow settings can differ from a fresh process, so a command whose ``AIRFLOW*`` or
``PYTHON*`` variables differ from the server's runs as a plain subprocess instead
(:meth:`ForkServer.accepts`); the DAGs folder alone may differ, and the child reads it again.

Protocol: one JSON line per command on stdin (``argv``, ``env``, ``cwd``, ``stdout``,
``stderr``); the server answers ``{"pid": N}`` once the child is forked and
``{"returncode": R}`` (negative: killed by that signal) once it has ended.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

DAGS_FOLDER_VAR = "AIRFLOW__CORE__DAGS_FOLDER"
STARTUP_TIMEOUT_S = 300


def _settings_env(env: Mapping[str, str]) -> dict[str, str]:
    """What Airflow reads while it is imported: its settings, and Python's own variables."""
    keys = ("AIRFLOW", "_AIRFLOW", "PYTHON")
    return {k: v for k, v in env.items() if k.startswith(keys) and k != DAGS_FOLDER_VAR}


class ForkServer:
    """The client: a running ``python -m marin_testing.airflow_fork`` and its pipes."""

    def __init__(self, env: Mapping[str, str], cwd: str, log_path: str) -> None:
        """Start the server with ``env`` in ``cwd`` (its own output goes to ``log_path``) and
        wait until it has warmed up."""
        self.env, self.cwd = dict(env), cwd
        self._lock = threading.Lock()
        with open(log_path, "a") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "marin_testing.airflow_fork"],
                env=self.env,
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read_replies, daemon=True).start()
        atexit.register(self.close)
        try:
            if self._reply(STARTUP_TIMEOUT_S) is None:
                raise RuntimeError(f"no answer within {STARTUP_TIMEOUT_S} s")
        except RuntimeError as exc:
            self.close()
            with open(log_path, errors="replace") as f:
                raise RuntimeError(
                    f"the Airflow fork server did not start ({exc}):\n{f.read()[-4000:]}"
                ) from None

    def accepts(self, env: Mapping[str, str], cwd: str) -> bool:
        """Whether a command with this environment runs here as it would in a fresh process."""
        alive = self._proc.poll() is None
        return alive and cwd == self.cwd and _settings_env(env) == _settings_env(self.env)

    def run(
        self, argv: Sequence[str], env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """``airflow <argv>`` in a forked child, as ``subprocess.run(..., capture_output=True,
        text=True, timeout=timeout)`` runs it: a child still running at the timeout is killed
        and ``subprocess.TimeoutExpired`` raised."""
        with self._lock, tempfile.TemporaryDirectory(prefix="airflow-fork-") as out:
            paths = {name: os.path.join(out, name) for name in ("stdout", "stderr")}
            request = {"argv": list(argv), "env": dict(env), "cwd": self.cwd, **paths}
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            forked = self._reply(60)
            if forked is None:
                raise RuntimeError("the Airflow fork server did not fork within 60 s")
            ended = self._reply(timeout)
            if ended is None:  # killed as subprocess.run kills it; its end is still reported
                os.kill(forked["pid"], signal.SIGKILL)
                self._reply(60)
            outputs = {}
            for name, path in paths.items():
                with open(path, errors="replace") as f:
                    outputs[name] = f.read()
            args = [sys.executable, "-m", "airflow", *argv]
            if ended is None:
                raise subprocess.TimeoutExpired(args, timeout, outputs["stdout"], outputs["stderr"])
            return subprocess.CompletedProcess(
                args, ended["returncode"], outputs["stdout"], outputs["stderr"]
            )

    def _read_replies(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._replies.put(dict(json.loads(line)))
        self._replies.put(None)  # the server has exited

    def _reply(self, timeout: float) -> dict[str, Any] | None:
        """The server's next message; None if none came within ``timeout``.

        Raises:
            RuntimeError: the server has exited.
        """
        try:
            message = self._replies.get(timeout=timeout)
        except queue.Empty:
            return None
        if message is None:
            self._replies.put(None)
            raise RuntimeError("the Airflow fork server exited")
        return message

    def close(self) -> None:
        """Stop the server (it exits when its stdin closes); children have all ended by then."""
        if self._proc.poll() is None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


# --- the server ---------------------------------------------------------------------------------


def _warm_up() -> None:
    """Import Airflow's CLI and build the execution API the way ``airflow dags test`` does on
    its first task, so that forked children find them done."""
    import airflow.__main__  # noqa: F401  (imports airflow: its settings and the database engine)
    from airflow.cli.commands import dag_command  # noqa: F401
    from airflow.sdk.execution_time import supervisor

    app = supervisor.in_process_api_server().app  # cached per process (functools.lru_cache)
    # Cadwyn generates the versioned routes on the app's first request; no request is made
    # here (it would start the API's event-loop thread, which a fork does not copy).
    initialize = getattr(app, "_cadwyn_initialize", None)
    if initialize is not None and not getattr(app, "_cadwyn_initialized", True):
        initialize()


def _run_child(request: dict[str, Any]) -> int:
    """In the forked child: become the command's process, run Airflow's CLI; its exit code."""
    import atexit as child_atexit
    import traceback

    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        _reread_dags_folder()
        import airflow.__main__

        sys.argv = [airflow.__main__.__file__, *request["argv"]]
        try:
            airflow.__main__.main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            child_atexit._run_exitfuncs()  # Airflow's exit hooks (the database engine's dispose)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    return code


def _reread_dags_folder() -> None:
    """The DAGs folder is the one setting that may differ from the server's: Airflow binds it
    while importing (``settings.DAGS_FOLDER``, and modules that import that name), so every
    such binding is set again from the command's environment."""
    from airflow import settings

    before = settings.DAGS_FOLDER
    settings.configure_vars()
    after = settings.DAGS_FOLDER
    if after != before:
        for module in list(sys.modules.values()):
            if getattr(module, "DAGS_FOLDER", None) == before:
                setattr(module, "DAGS_FOLDER", after)  # noqa: B010


def _reply(message: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(dict(message)) + "\n")
    sys.stdout.flush()


def serve() -> None:
    """Warm up, then fork one child per request line on stdin until stdin closes."""
    _warm_up()
    if threading.active_count() != 1:  # a fork copies only this thread: refuse to fork
        raise RuntimeError(f"threads running after the warm-up: {threading.enumerate()}")
    _reply({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_run_child(request))
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
