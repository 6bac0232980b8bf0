"""The subprocess side of ``isolate=True``: ``python -m marin.execution.pipeline.isolated_child IN
OUT``.

``IN`` holds two pickles: first plain data (the parent's ``sys.path`` and the files of modules
a fresh interpreter may not find by name), then the call (``fn`` by reference, its arguments
and the step's run-time context, bound for ``current_context()``); a remote job's (and an
isolated step's whose build checks its code), a third: what to do before ``fn`` runs
(``before_fn``: functions of ``execution/remote/``, called with the call's target: set the
caller's context variables, check this process imported the code the run lowered, which the
record names). ``IN`` is written by the process
that starts this one, in a folder only its user can write; it is opened without following a
link, and unpickled only if it is a regular file of this user that no one else can write
(``_open_payload``). The child makes ``fn``'s module
importable, runs the call, and writes its **outcome** to ``OUT`` as JSON, never a pickle (the
runner reads it back, and a remote job's outcome crosses a folder or a log):
``{"ok": true, "result": <canonical JSON>}`` or ``{"ok": false, "type", "message",
"traceback", "errno"}`` (text, bounded). A disk that fills up still gets an outcome: a reserve
written before ``fn`` runs is overwritten in place with the error and renamed to ``OUT``. What
``fn`` prints goes to this process's stdout/stderr, which the parent copies into the step's log.
Nothing here touches storage: the parent commits the step.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib
import importlib.util
import json
import os
import pickle
import signal
import stat
import sys
import traceback
from typing import Any


def _import_file(name: str, path: str) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as module {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_RUNNER_GONE = signal.SIGRTMIN + 2
"""The signal the kernel sends this process when its runner dies (a real-time one: user code
does not handle it)."""


def _end_group(signum: int, frame: Any) -> None:
    """End this process's group: this child, and the helper processes ``fn`` started in it
    (a data loader, an async writer), which would go on writing the output."""
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _die_with(parent: int) -> None:
    """Die with the runner (Linux ``PR_SET_PDEATHSIG``), and end the helper processes ``fn``
    started too (this child leads its own process group): a killed runner leaves nothing
    writing the output, or the checkpoints, that the next attempt clears or resumes."""
    try:
        signal.signal(_RUNNER_GONE, _end_group)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, _RUNNER_GONE)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError, ValueError):
        return  # not Linux: the lease check (still_holds_lease) is what remains
    if os.getppid() != parent:
        os._exit(1)  # the runner died before the prctl took effect


def _prepare(meta: dict[str, Any]) -> None:
    if meta.get("die_with"):
        _die_with(int(meta["die_with"]))
    sys.path[:] = list(meta["sys_path"])
    for name, path in meta["module_files"].items():
        if name == "__main__":
            # Like multiprocessing's spawn: the parent's script (this process's own __main__ is
            # this module), loaded under another name so its `if __name__ == "__main__":` block
            # does not run again.
            _import_file("__mp_main__", path)
            sys.modules["__main__"] = sys.modules["__mp_main__"]
            continue
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            _import_file(name, path)


def _extra(f: Any) -> dict[str, Any]:
    """The optional third pickle (``before_fn``: a remote job's, an isolated step's code
    check), or nothing."""
    try:
        extra = pickle.load(f)
    except EOFError:
        return {}
    return extra if isinstance(extra, dict) else {}


def _open_payload(path: str) -> Any:
    """``IN``, opened without following a link and refused unless it is a regular file of this
    user that no one else can write: it is unpickled, so a file another user could have put
    or swapped there (a folder above it renamed) never is.

    Raises:
        PermissionError: it is a link, not a regular file, another user's, or writable by
            others.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise PermissionError(f"the call {path} is a symbolic link: never unpickled") from None
    f = os.fdopen(fd, "rb")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        f.close()
        raise PermissionError(
            f"the call {path} is not a file of this user that only it can write (owner uid "
            f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}): never unpickled"
        )
    return f


RANK_ENV, WORLD_ENV = "MARIN_GANG_RANK", "MARIN_GANG_SIZE"
"""Set by a gang's launcher for each rank (``execution/remote/gang.py``)."""


def _ranked(context: Any) -> Any:
    """The call's context with this process's rank and the gang's size, when it is a rank."""
    rank, size = os.environ.get(RANK_ENV), os.environ.get(WORLD_ENV)
    if context is None or rank is None or size is None:
        return context
    import dataclasses

    from marin.execution.pipeline import jax_gang

    jax_gang.install()  # jax.distributed.initialize() finds the gang with no arguments

    return dataclasses.replace(context, rank=int(rank), world_size=int(size))


def _run(call_path: str) -> dict[str, Any]:
    try:
        with _open_payload(call_path) as f:
            _prepare(pickle.load(f))
            call = pickle.load(f)
            extra = _extra(f)
        inputs = (*call["args"], *call["kwargs"].values())  # its config's objects: code too
        for before in extra.get("before_fn", ()):  # set-up and checks (a job's, the code's)
            before(call["target"], inputs)
        context = _ranked(call.get("context"))
        if context is None:
            result = call["target"](*call["args"], **call["kwargs"])
        else:
            from marin.execution.pipeline.context import bound_context

            with bound_context(context):
                result = call["target"](*call["args"], **call["kwargs"])
        return {"ok": True, "result": result}
    except BaseException as exc:
        return {"ok": False, "error": exc}


MESSAGE_MAX = 8 * 1024
TRACEBACK_MAX = 32 * 1024
RESERVE_BYTES = 16 * 1024
"""Written beside ``OUT`` before ``fn`` runs: room for the outcome of a disk that filled up."""


def _errno(exc: BaseException | None) -> int | None:
    """The ``errno`` of the first ``OSError`` in ``exc``'s chain (``ENOSPC`` for a full disk)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and isinstance(exc.errno, int):
            return exc.errno
        exc = exc.__cause__ or exc.__context__
    return None


def _error(exc: BaseException) -> dict[str, Any]:
    """An error as text: its type's name, its message and its traceback (bounded)."""
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    try:
        message, trace = str(exc), "".join(traceback.format_exception(exc))
    except Exception:  # a __str__ that raises: the type still arrives
        message, trace = f"<{name} that cannot be printed>", ""
    return {
        "ok": False,
        "type": name,
        "message": message[:MESSAGE_MAX],
        "traceback": trace[-TRACEBACK_MAX:],
        "errno": _errno(exc),
    }


def _encode(outcome: dict[str, Any]) -> bytes:
    """The outcome as JSON: ``fn``'s value in its canonical form (what the record keeps), or
    its error as text."""
    if "error" in outcome:
        return json.dumps(_error(outcome["error"])).encode()
    from marin.execution.errors import ConfigError
    from marin.execution.pipeline.canonical import to_canonical

    try:
        value = to_canonical(outcome["result"], "result", text_keys=True)
        return json.dumps({"ok": True, "result": value}, allow_nan=False).encode()
    except (ConfigError, ValueError, TypeError, RecursionError) as exc:
        what = exc.what if isinstance(exc, ConfigError) else str(exc)
        failed = ConfigError(
            f"fn returned a value with no JSON form ({what})",
            "return plain data (str, numbers, lists, dicts) or None; write big values to the "
            "output path",
        )
        return json.dumps(_error(failed)).encode()


def _reserve(result_path: str) -> str | None:
    """Room for the outcome on a disk that fills up while ``fn`` runs (None: no room now)."""
    path = result_path + ".reserve"
    try:
        with open(path, "wb") as f:
            f.write(b" " * RESERVE_BYTES)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return path


def _write_reserved(reserve: str, result_path: str, exc: OSError, outcome: dict[str, Any]) -> None:
    """The outcome could not be written (a full disk): the error, written over the reserve
    (its blocks are allocated already) and renamed into place."""
    what = f"the job could not write its outcome ({exc})"
    if "error" in outcome:
        failed = outcome["error"]
        what += f"; fn had raised {type(failed).__name__}: {str(failed)[:1000]}"
    else:
        what += "; fn had returned"
    error = {"ok": False, "type": "OSError", "message": what, "traceback": "", "errno": exc.errno}
    data = json.dumps(error).encode()[:RESERVE_BYTES]
    with open(reserve, "r+b") as f:
        f.write(data)
        f.truncate(len(data))
    os.replace(reserve, result_path)


def main(argv: list[str]) -> int:
    call_path, result_path = argv
    reserve = _reserve(result_path)
    outcome = _run(call_path)
    with contextlib.suppress(OSError):  # a full disk under the log must not lose the outcome
        sys.stdout.flush()
        sys.stderr.flush()
    data = _encode(outcome)
    # Atomic: a remote job's result is read by another process, which must never see half.
    from marin.execution.atomic_file import write_file_atomically

    try:
        write_file_atomically(result_path, data)
    except OSError as exc:
        if reserve is None:
            raise
        _write_reserved(reserve, result_path, exc, outcome)
        return 1
    if reserve is not None:
        with contextlib.suppress(OSError):
            os.unlink(reserve)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
