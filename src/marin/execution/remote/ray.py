"""The ``ray`` backend: a remote step's job goes through Ray's Jobs API (the ``[ray]`` extra).

The cluster's address comes from ``RAY_ADDRESS`` (the dashboard's ``http://host:port``). The
submission id is the build's idempotency key, so Ray itself refuses a second submission of one
build. The call travels base64-encoded in the job's environment; the job runs
``isolated_child`` and prints its outcome (JSON) as its last line, marked with a secret of its
submission: a random nonce the driver puts in the job's environment, which ``ray_entry``
removes before ``fn`` runs, and whose SHA-256 the driver keeps in the job's Ray metadata beside
the job's owner (``JobSpec.owner``). So what ``fn`` prints can never pass for the outcome, an
outcome is read only from a job Ray reports SUCCEEDED (a killed or failed job is never built),
and a job is vouched for (``owner``) by what its submitter set in Ray, never by ``job.json``.
Logs are read from their end, by lines, bounded (``_log_stream``, ``log_tail``). The
pipeline's modules must be importable on the cluster (on one machine: the same environment).
Promises: at most one job per key; ``cancel`` is Ray's ``stop_job``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

from marin.execution.remote.log_tail import LastLines
from marin.execution.remote.procs import signal_name
from marin.execution.remote.protocol import JobHandle, JobSpec, JobStatus
from marin.execution.vocabulary import JobState

ADDRESS_ENV = "RAY_ADDRESS"
CALL_ENV, NONCE_ENV, GANG_ENV = "MARIN_CALL", "MARIN_OUTCOME_NONCE", "MARIN_GANG"
OWNER_KEY, NONCE_KEY = "marin_owner", "marin_outcome_sha256"
BEGIN, END = "<<<marin-outcome ", "<<<end-marin-outcome>>>"
_OUTCOME = re.compile(re.escape(BEGIN) + r"([0-9a-f]{32})>>>([A-Za-z0-9+/=]*)" + re.escape(END))
_OUTCOME_START = re.compile(re.escape(BEGIN) + r"[0-9a-f]{32}>>>")
"""An outcome's line, whole or cut (``marin logs`` never shows it)."""
_ENTRY = "python -m marin.execution.remote.ray_entry"
_RANK_ACTOR = re.compile(r"rank-(\d{1,6})")
"""A gang's rank's actor's name in its Ray job (``ray_gang``)."""
OUTCOME_MAX_BYTES = 64 * 1024 * 1024
"""The most of a job's log kept while looking for its outcome (its last line)."""
TAIL_BUFFER_BYTES = 4 * 1024 * 1024
"""The most of a followed job's log held between two reads (older text is dropped, said)."""
AGENT_WAIT_S = 60.0
"""How long a submit waits for a cluster's job agent (Ray refuses jobs until it is up)."""
_NO_AGENT = "No available agent to submit job"
SETTLE_S = 3.0
"""How long a job's end waits for its log stream to end (its last lines)."""

log = logging.getLogger("marin")


def outcome_line(nonce: str, outcome: bytes) -> str:
    """The line ``ray_entry`` prints last: the outcome, marked with the submission's nonce."""
    return f"{BEGIN}{nonce}>>>{base64.b64encode(outcome).decode()}{END}"


_KILLED = re.compile(r"exit code (?:-\d+|137)\b|node .* (?:died|was terminated)|worker died", re.I)
"""What Ray says of a job whose entrypoint a signal killed (``-9``; ``137`` where a shell ran
it: 128 + SIGKILL, an out-of-memory kill), or whose node went away."""


def _by(message: str) -> str:
    """`` (SIGKILL)`` when Ray's message gives the exit code of a signal (``-9``, ``137``)."""
    code = re.search(r"exit code (-\d{1,2}|137)\b", message)
    return f" ({signal_name(abs(int(code.group(1))) % 128)})" if code else ""


def _lost(outcome: bytes) -> JobStatus | None:
    """A gang's outcome that says a rank was lost (``gang_rules``): the job is lost."""
    try:
        found = json.loads(outcome)
    except ValueError:
        return None
    if not isinstance(found, dict) or found.get("lost") is not True:
        return None
    rank, how = str(found.get("rank", "?"))[:10], str(found.get("signal", "?"))[:40]
    return JobStatus(JobState.LOST, detail=f"rank {rank} was lost ({how})")


def _digest(nonce: str) -> str:
    return hashlib.sha256(nonce.encode()).hexdigest()


class RayBackend:
    """Ray's Jobs API; see the module docstring."""

    name = "ray"

    def _client(self) -> Any:
        """The client of the cluster at ``$RAY_ADDRESS`` (never an address read from
        ``job.json``, which is untrusted)."""
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise ImportError(
                "remote='ray' needs Ray's job client: pip install 'marin-execution[ray]'"
            ) from exc
        return JobSubmissionClient(os.environ.get(ADDRESS_ENV))

    def submit(self, job: JobSpec, idempotency_key: str) -> JobHandle:
        handle = JobHandle(self.name, idempotency_key, {})
        nonce = secrets.token_hex(16)
        env = {**job.env, CALL_ENV: base64.b64encode(job.call).decode(), NONCE_ENV: nonce}
        if job.ranks > 1:  # a gang: its ranks in one placement group (ray_gang.py)
            env[GANG_ENV] = f"{job.ranks} {job.gpus} {job.rank_placement} {job.placement_timeout}"
            env["RAY_DEDUP_LOGS"] = "0"  # ranks print alike: Ray would fold all but one away
        metadata = {OWNER_KEY: job.owner, NONCE_KEY: _digest(nonce)}
        deadline = time.monotonic() + AGENT_WAIT_S
        while True:
            try:
                self._client().submit_job(
                    entrypoint=_ENTRY,
                    submission_id=idempotency_key,
                    runtime_env={"env_vars": env},
                    metadata=metadata,
                )
            except RuntimeError as exc:  # Ray refuses a submission id it has seen: ours, or raise
                if self.owner(handle) == job.owner:
                    return handle
                if _NO_AGENT not in str(exc) or time.monotonic() > deadline:
                    raise exc
                time.sleep(1.0)  # a cluster just started: its job agent is not up yet
                continue
            return handle

    def _info(self, job_id: str) -> Any | None:
        """Ray's record of the job (its status, message and metadata), or None if unknown."""
        try:
            return self._client().get_job_info(job_id)
        except RuntimeError:
            return None

    def owner(self, handle: JobHandle) -> str | None:
        info = self._info(handle.job_id)
        if info is None:
            return None
        return str((info.metadata or {}).get(OWNER_KEY, ""))

    def status(self, handle: JobHandle) -> JobStatus:
        info = self._info(handle.job_id)
        if info is None:
            return JobStatus(JobState.LOST, detail="Ray does not know it")
        state = str(info.status).rsplit(".", 1)[-1]
        if state in ("PENDING", "RUNNING"):
            return JobStatus(JobState.RUNNING)
        if state == "STOPPED":
            return JobStatus(JobState.STOPPED, detail="stopped in Ray")
        if state != "SUCCEEDED":  # killed, failed: whatever its log says, it built nothing
            # Ray's message ("... failed with exit code -9, last available logs: ..."), without
            # the logs: the step's error shows their tail once.
            message = str(info.message or "").split(", last available logs", 1)[0]
            message = " ".join(message.split())[:300]
            lost = _KILLED.search(message)  # killed by a signal: lost, not failed
            detail = f"Ray job {state}: {message}".strip(": ") + _by(message)
            return JobStatus(JobState.LOST if lost else JobState.FAILED, detail=detail)
        expected = (info.metadata or {}).get(NONCE_KEY, "")
        text = self._tail(handle.job_id, info, 64, OUTCOME_MAX_BYTES)
        for found in reversed(list(_OUTCOME.finditer(text))):
            if expected and secrets.compare_digest(_digest(found.group(1)), expected):
                with contextlib.suppress(binascii.Error, ValueError):
                    data = base64.b64decode(found.group(2), validate=True)
                    ended = info.end_time / 1000 if isinstance(info.end_time, int) else None
                    return _lost(data) or JobStatus(JobState.SUCCEEDED, result=data,
                                                    ended_at=ended)  # fmt: skip
        return JobStatus(JobState.FAILED, detail="Ray job SUCCEEDED without Marin's outcome")

    def _tail(self, job_id: str, info: Any, lines: int, most: int) -> str:
        """The last ``lines`` lines of the job's log, at most ``most`` bytes of them (the
        outcome's search: its last line whole)."""
        kept = bytearray()
        with self._log_stream(job_id, info, lines) as chunks:
            for chunk in chunks:
                kept += chunk
                if len(kept) > most:
                    del kept[: len(kept) - most]
        return kept.decode(errors="replace")

    @contextlib.contextmanager
    def _log_stream(self, job_id: str, info: Any, lines: int) -> Iterator[Iterator[bytes]]:
        """The job's last ``lines`` lines as the dashboard streams them, in chunks: found from
        the end of the log by Ray's log API (``/api/v0/logs/file``, which Ray's ``get_log``
        asks, but with a bootstrap address where ``$RAY_ADDRESS`` is the dashboard's). Not
        ``get_job_logs`` (the whole log in one answer) nor ``tail_job_logs`` (the log from its
        start, which never ends while the job runs)."""
        if not getattr(info, "driver_node_id", None):
            yield iter(())  # its driver never started: no log
            return
        params = {"submission_id": job_id, "node_id": info.driver_node_id, "lines": lines}
        response = self._client()._do_request(
            "GET", "/api/v0/logs/file", params={**params, "timeout": 30}, stream=True
        )
        with response:
            if response.status_code != 200:
                raise RuntimeError(f"Ray's log API answered {response.status_code}")
            yield response.iter_content(chunk_size=1 << 16)

    def ranks(self, handle: JobHandle) -> list[dict[str, object]]:
        """A gang job's ranks as Ray's state API knows its actors (``rank-K``, ``ray_gang``):
        each one's host (its node's address) and state (``running`` while its actor lives,
        else ``ended``); none for another job, or a job Ray no longer knows."""
        info = self._info(handle.job_id)
        if info is None or not getattr(info, "job_id", None):
            return []
        from ray.util.state import list_actors, list_nodes

        address = os.environ.get(ADDRESS_ENV)
        mine: list[tuple[str, str, str | bool | int | float]] = [
            ("job_id", "=", str(info.job_id)),
            ("class_name", "=", "GangRank"),
        ]
        actors = list_actors(address=address, filters=mine, raise_on_missing_output=False)
        listed = list_nodes(address=address, raise_on_missing_output=False)
        nodes = {n.node_id: n.node_ip for n in listed}
        found: list[dict[str, object]] = []
        for actor in actors:
            named = _RANK_ACTOR.fullmatch(actor.name or "")
            if named is not None:
                state = "running" if actor.state == "ALIVE" else "ended"
                host = str(nodes.get(actor.node_id or "", "?"))[:100]
                found.append({"rank": int(named.group(1)), "host": host, "state": state})
        return sorted(found, key=lambda r: int(str(r["rank"])))

    def logs(self, handle: JobHandle, tail: int = 40) -> str:
        info = self._info(handle.job_id)
        found = LastLines(tail + 4)  # by lines, a huge one cut: never hides those before it
        try:
            with self._log_stream(handle.job_id, info, tail + 4) as chunks:
                found.feed(chunks)
        except Exception:  # no log (yet), an outage: nothing to show
            return ""
        lines = [line for line in found.result() if not _OUTCOME_START.search(line)]
        return "\n".join(lines[-tail:])

    def log_location(self, handle: JobHandle) -> str:
        """How to read the job's log with Ray's own tools (``marin show``)."""
        return f"ray job logs {handle.job_id} --address {os.environ.get(ADDRESS_ENV, '?')}"

    def follow(self, handle: JobHandle) -> _RayTail:
        """The job's log from its start, as Ray's ``tail_job_logs`` streams it (``follow.py``)."""
        return _RayTail(self._client(), handle.job_id)

    def cancel(self, handle: JobHandle) -> None:
        with contextlib.suppress(RuntimeError):  # ended or unknown: nothing of it runs
            self._client().stop_job(handle.job_id)


_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _tail_loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop for Ray's log streams (on a daemon thread of its own)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="marin-ray-logs", daemon=True).start()
        return _loop


class _RayTail:
    """One job's log as Ray streams it (``JobSubmissionClient.tail_job_logs``, from the start
    until the job ends), buffered up to ``TAIL_BUFFER_BYTES`` between two reads."""

    def __init__(self, client: Any, job_id: str) -> None:
        self._client, self._job_id = client, job_id
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = self._dropped = 0
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._future: Any = None
        """The stream, started by the first read: a job nobody follows costs no connection."""

    async def _pump(self, client: Any, job_id: str) -> None:
        try:
            async for text in client.tail_job_logs(job_id):
                self._put(text.encode(errors="replace"))
        except Exception as exc:  # the stream broke: the job's tail is still copied at its end
            log.debug("the log stream of Ray job %s ended: %s", job_id, exc)
        finally:
            self._ended.set()

    def _put(self, data: bytes) -> None:
        with self._lock:
            self._chunks.append(data)
            self._size += len(data)
            while self._size > TAIL_BUFFER_BYTES and len(self._chunks) > 1:
                dropped = self._chunks.popleft()
                self._size -= len(dropped)
                self._dropped += len(dropped)

    def read(self, most: int) -> bytes:
        if self._future is None:
            self._future = asyncio.run_coroutine_threadsafe(
                self._pump(self._client, self._job_id), _tail_loop()
            )
        out = bytearray()
        with self._lock:
            if self._dropped:
                out += b"\n[%d bytes of the job's log skipped]\n" % self._dropped
                self._dropped = 0
            while self._chunks and len(out) < most:
                chunk = self._chunks.popleft()
                self._size -= len(chunk)
                out += chunk
        return bytes(out)

    def settle(self) -> None:
        if self._future is not None:
            self._ended.wait(SETTLE_S)

    def close(self) -> None:
        if self._future is not None:
            self._future.cancel()
