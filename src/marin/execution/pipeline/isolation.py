"""Running a step's ``fn`` in a fresh subprocess (``isolate=True``), or under a timeout in-thread.

Lowering wraps ``spec.run`` in one of these calls; everything else about a build is unchanged:
``build_step`` still takes the lease, writes the status, and commits the record in the runner's
process. Only the ``fn`` call moves:

- ``IsolatedCall`` starts ``python -P -m marin.execution.pipeline.isolated_child`` (a fresh
  interpreter, as multiprocessing's spawn does; ``-P``: nothing is imported from its working
  folder, which may be anyone's ``/tmp``, before the runner's ``sys.path`` is restored), sends
  it ``fn`` *by reference*, its config (made by ``build_config`` here, in the runner: paths
  and plain data) and the run-time context, which the child binds for ``current_context()``,
  and copies the child's stdout and stderr into the step's log.
  The child's ``CUDA_VISIBLE_DEVICES`` names exactly the devices assigned to the build. The
  child runs in its own process group, which is killed when the step ends (``fn`` returned,
  raised or ran past its timeout): helper processes ``fn`` started end with it, and the runner
  never waits for them. The result comes back through a file (JSON: ``isolated_child``), not
  through the output pipe.
- ``TimedCall`` (a timeout without isolation) runs ``fn`` on a helper thread and fails the build
  when the time is up. A Python thread cannot be killed: the abandoned call keeps running in the
  background until it returns on its own, holding the step's lease (nothing it writes late can
  mix into another build). Use ``isolate=True`` when a step must really stop.
"""

from __future__ import annotations

import builtins
import codecs
import contextvars
import dataclasses
import inspect
import io
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, cast

from marin.execution.digest.instance import unwrapped
from marin.execution.errors import InvalidStepError, LeaseLostError, MarinError, _restore_error
from marin.execution.pipeline.canonical import Canonical
from marin.execution.pipeline.context import StepContext
from marin.execution.pipeline.resources import visible_gpus

CHILD_MODULE = "marin.execution.pipeline.isolated_child"
_CHUNK = 65536
_DRAIN_READS = 64  # after the step ended: at most 4 MiB more, then the pipe is closed


class StepTimeoutError(MarinError, TimeoutError):
    """A step's ``fn`` ran longer than its ``timeout``."""

    still_running: threading.Event | None = None
    """Set when an abandoned in-thread ``fn`` returns; ``build_step`` holds the step's lease
    until then (kept in this process: not pickled)."""

    def __reduce__(self) -> tuple[object, ...]:
        state = {k: v for k, v in self.__dict__.items() if k != "still_running"}
        return (_restore_error, (type(self), self.args, state))


def _function_of(run: Callable[..., Any]) -> Callable[..., Any]:
    """The user's function inside a lowered ``run`` (``apply``'s call names it), else ``run``."""
    fn = getattr(run, "wrapped_fn", run)
    return fn if callable(fn) else run


def check_importable(run: Callable[..., Any], step_id: str) -> None:
    """Raise unless a fresh process can import ``run``'s function by module and name."""
    fn = _function_of(run)
    fix = (
        "isolate=True runs fn in a fresh process, which imports it by name: define it with def "
        "at the top level of a module (not a lambda, a nested function or a closure)"
    )
    if inspect.isfunction(fn) or inspect.isbuiltin(fn):
        qualname = getattr(fn, "__qualname__", "")
        module_name = getattr(fn, "__module__", None)
        if "<lambda>" in qualname or "<locals>" in qualname or not module_name:
            raise InvalidStepError(
                f"fn {qualname or fn!r} cannot be imported by reference", fix, step_id
            )
        found: Any = sys.modules.get(module_name)
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if found is not fn:
            raise InvalidStepError(
                f"fn {module_name}.{qualname} is not reachable by that name in its module",
                fix,
                step_id,
            )
        return
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise InvalidStepError(
            f"fn {fn!r} cannot be sent to a subprocess ({type(exc).__name__}: {exc})", fix, step_id
        ) from None


def _module_files(fn: Callable[..., Any], inputs: tuple[Any, ...] = ()) -> dict[str, str]:
    """Files of the modules ``fn`` and its ``inputs`` live in that a fresh interpreter may not
    find by name: a ``functools.partial``'s function and arguments, a bound method's object,
    the config's values (red team r30-3: a partial of a file-loaded pipeline's function).

    Pipelines loaded from a file (``marin run path/to/file.py:attr``) are registered under a
    made-up module name; the child loads such a module from its file under the same name.
    """
    names: set[str] = set()
    todo: list[Any] = [fn, *inputs]
    for _ in range(1000):  # a partial bound to a partial ends somewhere
        if not todo:
            break
        obj = todo.pop()
        layers, inner = unwrapped(obj)
        todo += [v for layer in layers for _, v in layer.arguments]
        todo += [layer.owner for layer in layers if layer.is_method]
        names.update((type(obj).__module__, type(inner).__module__))
        if inspect.isfunction(inner) or inspect.isclass(inner):
            names.add(inner.__module__)
    files: dict[str, str] = {}
    for name in names:
        module = sys.modules.get(name) if isinstance(name, str) else None
        path = getattr(module, "__file__", None)
        if path:
            files[name] = os.path.abspath(path)
    return files


def _child_env(ctx: StepContext, gpus_requested: int) -> dict[str, str]:
    env = dict(os.environ)
    if ctx.devices:
        names = visible_gpus()
        env["CUDA_VISIBLE_DEVICES"] = ",".join(
            names[i] if i < len(names) else str(i) for i in ctx.devices
        )
    elif gpus_requested == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a step that asked for no GPU sees none
    # else: the step asked for GPUs that no local pool assigned (Airflow, Prefect, Kubernetes
    # placed it): keep what the worker was given.
    env["PYTHONUNBUFFERED"] = "1"
    return env


def call_payload(
    run: Callable[[StepContext], Any],
    ctx: StepContext,
    step_id: str,
    placement: str = "isolate=True",
    die_with: int | None = None,
) -> bytes:
    """What ``isolated_child`` reads: plain data first (``sys.path``, module files), then the
    call (``fn`` by reference, its config made here, and the run-time context). ``die_with``:
    the pid whose death ends the child (a resumable isolated step's runner; never a job's)."""
    parts = getattr(run, "parts", None)
    args: tuple[Any, ...] = ()
    if callable(parts):  # lowering's run(build_config(ctx)): the config is made here
        target, args, kwargs = parts(ctx)
    else:
        target, args, kwargs = run, (ctx,), {}
    # The child's context: no storage loader (ctx.resolved belongs in build_config, which
    # runs here), so that nothing but plain data crosses the process boundary; and its
    # devices as the child numbers them (its CUDA_VISIBLE_DEVICES lists exactly these).
    # A resumable step's lease check goes along (it pickles): the child asks storage.
    child_ctx = dataclasses.replace(
        ctx,
        loader=None,
        _loaded={},
        runtime_args=dict(ctx.runtime_args),
        devices=tuple(range(len(ctx.devices))),
        lease_check=ctx.lease_check if ctx.checkpoint_path is not None else None,
        code_check=None,
    )
    meta = {
        "sys_path": list(sys.path),
        "module_files": _module_files(target, (*args, *kwargs.values())),
        "die_with": die_with,
    }
    buffer = io.BytesIO()
    pickle.dump(meta, buffer)
    try:
        pickle.dump(
            {"target": target, "args": args, "kwargs": kwargs, "context": child_ctx},
            buffer,
            protocol=pickle.HIGHEST_PROTOCOL,
        )
    except Exception as exc:
        raise InvalidStepError(
            f"cannot send fn and its inputs to a subprocess ({type(exc).__name__}: {exc})",
            f"{placement} needs fn importable by name and inputs that pickle",
            step_id,
        ) from None
    return buffer.getvalue()


@dataclass(frozen=True)
class IsolatedCall:
    """``spec.run`` for an ``isolate=True`` step: ``fn`` runs in a fresh subprocess."""

    run: Callable[[StepContext], Any]
    step_id: str
    timeout: float | None = None
    gpus: int = 0

    @property
    def fn(self) -> Callable[..., Any]:
        return _function_of(self.run)

    def __call__(self, ctx: StepContext) -> Any:
        # The child, and what it started, dies with this process (isolated_child._die_with).
        payload = call_payload(self.run, ctx, self.step_id, die_with=os.getpid())
        if ctx.code_check is not None:  # the child imports fn now: the code the run lowered?
            payload += pickle.dumps({"before_fn": [ctx.code_check]}, pickle.HIGHEST_PROTOCOL)
        with tempfile.TemporaryDirectory(prefix="marin-isolated-") as tmp:
            payload_path = os.path.join(tmp, "call.pkl")
            result_path = os.path.join(tmp, "result.json")
            # Only this user may write what the child unpickles (it checks: _open_payload).
            fd = os.open(payload_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            return self._spawn(ctx, payload_path, result_path)

    def _spawn(self, ctx: StepContext, payload_path: str, result_path: str) -> Any:
        proc = subprocess.Popen(  # -P: never a module of the working folder (anyone's /tmp)
            [sys.executable, "-P", "-m", CHILD_MODULE, payload_path, result_path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_child_env(ctx, self.gpus),
            start_new_session=True,  # its own process group: ended with the step
        )
        assert proc.stdout is not None
        copier = _OutputCopier(proc.stdout, self.step_id)
        # A resumable step's child is watched: once its attempt no longer holds the lease, it is
        # killed, so it never writes over the checkpoints of the attempt that took over.
        check = None
        if ctx.checkpoint_path is not None and ctx.lease_check is not None:
            check = getattr(ctx.lease_check, "watcher", ctx.lease_check)
        try:
            exited = _wait_watched(proc, self.timeout, check)
        finally:
            # Success, failure, timeout or interrupt: whatever fn started ends with the step.
            # (The result comes from a file, never from the pipe, which a helper process fn
            # started may hold open forever.)
            _kill_group(proc)
            copier.stop()
        if exited is None:
            raise LeaseLostError(
                "lost the lease while fn ran in its isolated process, which was killed",
                "nothing was committed by this attempt; the runner that took over resumes",
                self.step_id,
            )
        if not exited:
            raise StepTimeoutError(
                f"fn ran longer than its timeout of {self.timeout:g}s; its process was killed",
                "raise the step's timeout (with_options(timeout=...)) or make it faster",
                self.step_id,
            ) from None
        return _read_result(result_path, cast(int, proc.returncode), self.step_id)


def _wait_watched(
    proc: subprocess.Popen[bytes], timeout: float | None, check: Callable[[], bool] | None
) -> bool | None:
    """``_wait_exit``, asking ``check`` every ``check.interval`` seconds meanwhile: None as soon
    as it says the lease is lost."""
    if check is None:
        return _wait_exit(proc, timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = float(getattr(check, "interval", 1.0))
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
            if wait <= 0:
                return False
        if _wait_exit(proc, wait):
            return True
        if not check():
            return None


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float | None) -> bool:
    """Wait at most ``timeout`` for the child to exit; whether it did.

    Through a pidfd the child is not reaped, so its pid, and with it its process group's id,
    stays reserved until ``_kill_group`` has signalled the group: the kill can reach no one
    else's processes. Without pidfds (not Linux), ``wait`` reaps it first.
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


class _OutputCopier:
    """Copies the child's output into the step's log until told to stop.

    Never waits for the pipe to close: a process ``fn`` started (and put in its own session,
    out of reach of the group kill) may hold it open forever. ``stop`` copies what is buffered
    already, then closes the pipe.
    """

    def __init__(self, stream: IO[bytes], step_id: str) -> None:
        self._stream = stream
        self._wake_read, self._wake_write = os.pipe()
        # It runs in this build's context, so what it writes lands in the step's log.
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._copy,),
            name=f"marin-output-{step_id}",
            daemon=True,
        )
        self._thread.start()

    def _copy(self) -> None:
        fd = self._stream.fileno()
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        wait: float | None = None  # until there is output or stop() is called
        reads_left = _DRAIN_READS
        while reads_left > 0:
            ready, _, _ = select.select([fd, self._wake_read], [], [], wait)
            if fd in ready:
                data = os.read(fd, _CHUNK)
                if not data:
                    break  # every writer has closed the pipe
                sys.stdout.write(decoder.decode(data))
                if wait == 0:  # stopping: only what is buffered, and boundedly
                    reads_left -= 1
            elif wait == 0:
                break
            else:
                wait = 0  # stop() called: copy what is readable at once, then end
        sys.stdout.write(decoder.decode(b"", final=True))
        sys.stdout.flush()

    def stop(self) -> None:
        os.write(self._wake_write, b"x")
        self._thread.join()
        for fd in (self._wake_read, self._wake_write):
            os.close(fd)
        self._stream.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _read_result(path: str, returncode: int, step_id: str) -> Any:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        raise RuntimeError(
            f"error: the isolated process of step {step_id} ended with {how} before fn "
            "returned (see the step's log)"
        ) from None
    return decode_outcome(data, step_id)


@dataclass(frozen=True)
class Outcome:
    """What ``isolated_child`` wrote (JSON, never a pickle): ``fn``'s value in its canonical
    form, or its error as text (type name, message, traceback, the ``errno`` of an
    ``OSError`` in its chain)."""

    ok: bool
    result: Any = None
    type: str = ""
    message: str = ""
    traceback: str = ""
    errno: int | None = None

    @classmethod
    def parse(cls, data: bytes) -> Outcome:
        """The outcome in ``data``.

        Raises:
            ValueError: ``data`` is not an outcome ``isolated_child`` writes.
        """
        raw = json.loads(data)
        if not isinstance(raw, dict) or not isinstance(raw.get("ok"), bool):
            raise ValueError("not an outcome")
        if raw["ok"]:
            return cls(True, raw.get("result"))
        texts = [raw.get(key, "") for key in ("type", "message", "traceback")]
        if not all(isinstance(text, str) for text in texts):
            raise ValueError("an error outcome without its text")
        errno = raw.get("errno")
        errno = errno if isinstance(errno, int) and not isinstance(errno, bool) else None
        return cls(False, None, texts[0], texts[1], texts[2], errno)

    def summary(self) -> str:
        """``Type: message`` of an error outcome."""
        return f"{self.type}: {self.message}" if self.message else self.type

    def error(self, step_id: str, where: str) -> Exception:
        """The error, rebuilt from its text: a built-in exception type by its name (nothing
        else is looked up by a name read back), any other as a ``RuntimeError`` naming it;
        the traceback as a note."""
        kind = getattr(builtins, self.type, None) if "." not in self.type else None
        error: Exception
        if isinstance(kind, type) and issubclass(kind, Exception):
            try:
                error = kind(self.message)
            except Exception:
                error = RuntimeError(self.summary())
            if isinstance(error, OSError):
                error.errno = self.errno
        else:
            error = RuntimeError(self.summary())
        error.add_note(f"raised in {where} of step {step_id}:\n{self.traceback}")
        return error


def decode_outcome(data: bytes, step_id: str, where: str = "the isolated process") -> Any:
    """``fn``'s value (``Canonical``: the record keeps it as it is) from ``isolated_child``'s
    outcome, or its error raised here."""
    try:
        outcome = Outcome.parse(data)
    except ValueError as exc:
        raise RuntimeError(
            f"error: the outcome of {where} of step {step_id} is not one Marin writes ({exc})"
        ) from None
    if not outcome.ok:
        raise outcome.error(step_id, where)
    return Canonical(outcome.result)


@dataclass(frozen=True)
class TimedCall:
    """``spec.run`` for a step with a timeout but no isolation: fail the build when time is up.

    ``fn`` runs on a helper thread (in the build's context, so its output still reaches the
    step's log); the build waits at most ``timeout`` seconds. The thread cannot be killed: on
    timeout it is abandoned and keeps running until ``fn`` returns, and the step's lease stays
    held until then, so no other build clears or writes that output meanwhile. Lowering refuses
    ``retries`` with such a timeout (a retry in this runner would wait for that lease anyway).
    """

    run: Callable[[StepContext], Any]
    step_id: str
    timeout: float

    @property
    def fn(self) -> Callable[..., Any]:
        return _function_of(self.run)

    def __call__(self, ctx: StepContext) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()

        def call() -> None:
            try:
                box["result"] = self.run(ctx)
            except BaseException as exc:
                box["error"] = exc
            finally:
                done.set()

        worker = threading.Thread(
            target=contextvars.copy_context().run,
            args=(call,),
            name=f"marin-timed-{self.step_id}",
            daemon=True,
        )
        worker.start()
        if not done.wait(self.timeout):
            error = StepTimeoutError(
                f"fn ran longer than its timeout of {self.timeout:g}s; it runs in a thread, "
                "which cannot be killed, so it may still be running in the background",
                "raise the timeout, or use with_options(isolate=True) so a timeout kills fn",
                self.step_id,
            )
            error.still_running = done  # the build keeps its lease until fn returns
            raise error
        if "error" in box:
            raise box["error"]
        return box["result"]


def wrap_run(
    run: Callable[[StepContext], Any],
    step_id: str,
    *,
    isolate: bool,
    timeout: float | None,
    gpus: int = 0,
) -> Callable[[StepContext], Any]:
    """The ``spec.run`` lowering gives a step with these options."""
    if isolate:
        return IsolatedCall(run, step_id, timeout, gpus)
    if timeout is not None:
        return TimedCall(run, step_id, timeout)
    return run
