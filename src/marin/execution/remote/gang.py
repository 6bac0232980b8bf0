"""A ``local`` gang job's supervisor: ``python -m marin.execution.remote.gang DIR N GPUS``.

``local_job`` execs this instead of ``isolated_child`` for a step with ``ranks=N``: it is the
job's one process that the backend knows (``pid.json``), in the job's own session. It starts N
ranks, each ``isolated_child`` on the job's one ``DIR/call.pkl`` with its rank's environment
(``rank_env``: what ``jax.distributed.initialize()`` and ``torch.distributed`` read, and
``MARIN_GANG_RANK``/``MARIN_GANG_SIZE``, which put the rank on the context). Each rank writes
its outcome to ``DIR/rank-K/result.json`` and its output to ``DIR/rank-K/log.txt`` (readable on
its own), copied into the job's log with a ``[rank K]`` prefix; ``DIR/ranks.json`` lists each
rank's pid, start time and host (``LocalBackend.ranks``: ``marin plan`` shows their states).
The ranks die with the supervisor (``PR_SET_PDEATHSIG``) and share its process group (a
cancel kills them all).

All or nothing: the first rank to end otherwise than by returning ends every rank (SIGKILL,
then reaped). A rank killed by a signal makes the job *lost* (``DIR/lost.json`` says which
rank and signal, and no outcome is written: the driver resubmits it under ``max_preemptions``);
a rank whose ``fn`` raised (or that exited without an outcome) fails the job with that rank's
outcome. Once every rank returned, rank 0's outcome is the job's (``DIR/result.json``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO

from marin.execution.atomic_file import write_file_atomically
from marin.execution.remote.gang_rules import EXIT_GRACE_S, free_port, judge_rank, rank_env
from marin.execution.remote.job_files import CALL, LOG, LOST, RANKS, RESULT, rank_folder
from marin.execution.remote.procs import GROUP_WAIT_S, end_group, start_time

CHILD_MODULE = "marin.execution.pipeline.isolated_child"


def _devices(rank: int, gpus: int) -> str:
    """Rank ``rank``'s own ``gpus`` devices of those this job sees ("" for none)."""
    if gpus == 0:
        return ""
    given = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    mine = range(rank * gpus, (rank + 1) * gpus)
    return ",".join(given[i] if i < len(given) else str(i) for i in mine)


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_supervisor() -> None:
    _libc.prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


RANK_LINE_MOST = 4 << 20
"""A rank's line is copied into the job's log by pieces of at most this (a progress bar
without a newline never grows the supervisor's memory): each piece a labelled line."""
_write_lock = threading.Lock()


def _copy(source: IO[bytes], rank_log: str, rank: int) -> None:
    """A rank's output: into its own log, and into the job's with its rank, whole lines
    only: a piece without its newline (a long line's, or the rank's partial last line) is
    ended with one there, so two ranks' lines never merge."""
    piece = b""
    with open(rank_log, "ab") as own:
        for piece in iter(lambda: source.readline(RANK_LINE_MOST), b""):
            own.write(piece)
            own.flush()
            line = piece if piece.endswith(b"\n") else piece + b"\n"
            with _write_lock:  # one write per line: the copiers' lines never interleave
                sys.stdout.buffer.write(b"[rank %d] " % rank + line)
                sys.stdout.flush()
        if piece and not piece.endswith(b"\n"):
            own.write(b"\n")  # the rank ended in mid-line: its own log's last line is whole


def _start(folder: str, size: int, gpus: int) -> list[subprocess.Popen[bytes]]:
    ports = (free_port(), free_port())
    ranks = []
    for rank in range(size):
        os.makedirs(rank_folder(folder, rank), exist_ok=True)
        env = {**os.environ, **rank_env(rank, size, "127.0.0.1", ports, rank)}
        env["CUDA_VISIBLE_DEVICES"] = _devices(rank, gpus)
        result = os.path.join(rank_folder(folder, rank), RESULT)
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-P", "-m", CHILD_MODULE, os.path.join(folder, CALL), result],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_supervisor,  # before any thread starts: fork-safe
            )
        )
    return ranks


def _outcome(folder: str, rank: int) -> dict[str, object] | None:
    try:
        with open(os.path.join(rank_folder(folder, rank), RESULT), "rb") as f:
            found = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _judge(folder: str, rank: int, code: int | None) -> dict[str, object] | None:
    return judge_rank(rank, code, _outcome(folder, rank))


def _wait_all(folder: str, ranks: list[subprocess.Popen[bytes]]) -> dict[str, object] | None:
    """Watch the ranks until every one returned (and exited, or had ``EXIT_GRACE_S`` to);
    the first that did not return ends the others. What ended the gang, or None."""
    ended: dict[str, object] | None = None
    all_returned: float | None = None
    while ended is None and any(p.poll() is None for p in ranks):
        verdicts = (_judge(folder, k, p.poll()) for k, p in enumerate(ranks))
        ended = next((v for v in verdicts if v is not None), None)
        if all_returned is None and all(_outcome(folder, k) for k in range(len(ranks))):
            all_returned = time.monotonic()  # JAX's exit may wait on a peer: not forever
        if all_returned is not None and time.monotonic() - all_returned > EXIT_GRACE_S:
            break
        time.sleep(0.05)
    if ended is None:  # every rank exited, or returned: a last look at how they ended
        verdicts = (_judge(folder, k, p.poll()) for k, p in enumerate(ranks))
        ended = next((v for v in verdicts if v is not None), None)
    for proc in ranks:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            proc.wait()
    return ended


def main(argv: list[str]) -> int:
    folder, size, gpus = argv[0], int(argv[1]), int(argv[2])
    ranks = _start(folder, size, gpus)
    host = socket.gethostname()
    listed = [{"rank": k, "pid": p.pid, "start_time": start_time(p.pid), "host": host}
              for k, p in enumerate(ranks)]  # fmt: skip
    write_file_atomically(os.path.join(folder, RANKS), json.dumps(listed).encode())
    print(f"gang of {size}: " + ", ".join(f"rank {k} pid {p.pid}" for k, p in enumerate(ranks)))
    sys.stdout.flush()
    copiers = []
    for rank, proc in enumerate(ranks):
        log = os.path.join(rank_folder(folder, rank), LOG)
        assert proc.stdout is not None
        copiers.append(threading.Thread(target=_copy, args=(proc.stdout, log, rank), daemon=True))
        copiers[-1].start()
    ended = _wait_all(folder, ranks)
    end_group(os.getpid(), folder, GROUP_WAIT_S)  # the ranks' own children: a data loader
    for copier in copiers:
        copier.join(timeout=5)  # a helper a rank started may hold its pipe open: not forever
    if ended is not None and ended.pop("lost", False):
        write_file_atomically(os.path.join(folder, LOST), json.dumps(ended).encode())
        return 1  # no outcome: the job is lost, and the driver submits it again
    if ended is None:
        with open(os.path.join(rank_folder(folder, 0), RESULT), "rb") as f:
            data = f.read()
    else:
        data = json.dumps(ended).encode()
    write_file_atomically(os.path.join(folder, RESULT), data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
