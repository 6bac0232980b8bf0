"""OpenLineage run events from builds, through the real client's file and HTTP transports."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openlineage.client")

from marin.execution.builder import lineage
from marin.execution.builder.commit import build_step
from marin.execution.builder.lineage.names import artifact_names
from marin.execution.builder.request import BuildRequest
from marin.execution.lazy import OUT, apply, lower
from marin.execution.pipeline.graph import collect_steps
from marin.execution.pipeline.targets import load_target
from marin.execution.plan.options import Policy, RunOptions
from marin.execution.step_runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from tests.lineage.helpers import (
    EXAMPLE,
    ROOT,
    Sink,
    check_event,
    file_transport,
    fresh_sender,
    read_events,
    write,
)

__all__ = ["fresh_sender"]  # the fixture, imported for pytest


def explode(out_path: str) -> str:
    raise RuntimeError("disk full")


def interrupted(out_path: str) -> str:
    raise KeyboardInterrupt


def _example() -> list[Any]:
    return list(lower(load_target(EXAMPLE), memo={}))


def _by_state(events: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for event in events:
        out.setdefault(event["eventType"], {})[event["job"]["name"]] = event
    return out


def test_the_example_run_emits_valid_events_whose_graph_is_the_lowered_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_sender: lineage.LineageSender
) -> None:
    path = file_transport(tmp_path, monkeypatch)
    specs = _example()
    steps = collect_steps(specs)
    prefix = str(tmp_path / "art")
    with lineage.pipeline_run("ngram", runner="local"):
        StepRunner(RunOptions(max_concurrent=4), prefix=prefix).run(specs)
    assert lineage.flush(30)
    # The steps' runs; the pipeline run's own two are tests/lineage/test_pipeline_events.py's.
    events = [e for e in read_events(path) if e["job"]["name"] != "ngram"]
    assert len(events) == 2 * len(steps)
    for event in events:
        check_event(event)
    states = _by_state(events)
    assert set(states) == {"START", "COMPLETE"}
    location = open_prefix(prefix)
    edges_seen, edges_lowered = set(), set()
    parents = set()
    for spec in steps:
        record = read_record(location, spec.output_path)
        assert record is not None
        start, done = states["START"][spec.step_id], states["COMPLETE"][spec.step_id]
        # run id = build id (in UUID form), the same for the START and the COMPLETE
        assert start["run"]["runId"] == done["run"]["runId"] == str(uuid.UUID(record.build_id))
        assert start["job"]["namespace"] == "marin"
        names = artifact_names(location, spec.output_path)
        assert done["outputs"] == [
            {"namespace": "file", "name": names.dataset_name, "facets": {}, "outputFacets": {}}
        ]
        assert names.dataset_name == str(tmp_path / "art" / spec.name / spec.version)
        marin = done["run"]["facets"]["marin"]
        assert marin["fingerprint"] == spec.fingerprint and marin["version"] == spec.version
        assert marin["runner"] == "local" and marin["host"] == socket.gethostname()
        assert marin["inputBuildIds"] == record.inputs  # the deps' build ids, as committed
        parent = done["run"]["facets"]["parent"]
        parents.add((parent["job"]["name"], parent["run"]["runId"]))
        out = (names.dataset_namespace, names.dataset_name)
        for dataset in done["inputs"]:
            edges_seen.add(((dataset["namespace"], dataset["name"]), out))
        for dep in spec.deps:
            dep_names = artifact_names(location, dep.output_path)
            edges_lowered.add(((dep_names.dataset_namespace, dep_names.dataset_name), out))
    assert edges_seen == edges_lowered and edges_lowered
    assert len(parents) == 1 and next(iter(parents))[0] == "ngram"


def test_a_cached_rerun_emits_no_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_sender: lineage.LineageSender
) -> None:
    path = file_transport(tmp_path, monkeypatch)
    spec = apply("lin/one", write, version="v1", out_path=OUT).lower()
    location = open_prefix(str(tmp_path / "art"))
    assert build_step(BuildRequest(spec, location)).action == "built"
    assert lineage.flush(30)
    assert [e["eventType"] for e in read_events(path)] == ["START", "COMPLETE"]
    assert build_step(BuildRequest(spec, location)).action == "cached"
    assert lineage.flush(30)
    assert len(read_events(path)) == 2  # a cache hit is not a run: nothing is claimed
    assert build_step(BuildRequest(spec, location, policy=Policy(force=frozenset({spec.step_id})))).action == "built"
    assert lineage.flush(30)
    assert [e["eventType"] for e in read_events(path)][2:] == ["START", "COMPLETE"]


def test_a_failed_build_emits_fail_and_an_interrupted_one_abort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_sender: lineage.LineageSender
) -> None:
    path = file_transport(tmp_path, monkeypatch)
    location = open_prefix(str(tmp_path / "art"))
    failing = apply("lin/fails", explode, version="v1", out_path=OUT).lower()
    with pytest.raises(RuntimeError):
        build_step(BuildRequest(failing, location))
    stopped = apply("lin/stopped", interrupted, version="v1", out_path=OUT).lower()
    with pytest.raises(KeyboardInterrupt):
        build_step(BuildRequest(stopped, location))
    assert lineage.flush(30)
    events = read_events(path)
    for event in events:
        check_event(event)
    assert [(e["job"]["name"], e["eventType"]) for e in events] == [
        ("lin/fails@v1", "START"),
        ("lin/fails@v1", "FAIL"),
        ("lin/stopped@v1", "START"),
        ("lin/stopped@v1", "ABORT"),
    ]
    assert "disk full" in events[1]["run"]["facets"]["errorMessage"]["message"]
    assert events[0]["run"]["runId"] == events[1]["run"]["runId"]


def test_http_transport_to_a_loopback_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_sender: lineage.LineageSender
) -> None:
    sink = Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OPENLINEAGE_URL", sink.url)
        monkeypatch.setenv("OPENLINEAGE_NAMESPACE", "team-lm")
        first = apply("lin/a", write, version="v1", out_path=OUT)
        second = apply("lin/b", write, version="v1", out_path=OUT, text=first)
        StepRunner(prefix=str(tmp_path / "art")).run([second.lower()])
        assert sink.wait_for(4, 30)
        for event in sink.events:
            check_event(event)
        done = {e["job"]["name"]: e for e in sink.events if e["eventType"] == "COMPLETE"}
        assert {e["job"]["namespace"] for e in sink.events} == {"team-lm"}
        assert [d["name"] for d in done["lin/b@v1"]["inputs"]] == [str(tmp_path / "art/lin/a/v1")]
        # No pipeline_run() around a library run: the process's own parent run, runner library.
        assert done["lin/b@v1"]["run"]["facets"]["marin"]["runner"] == "library"
    finally:
        sink.shutdown()
        sink.server_close()


def _refusing_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again: connections are refused


@pytest.mark.parametrize("endpoint", ["refuses", "hangs"])
def test_a_dead_lineage_endpoint_costs_a_build_a_bounded_time_and_one_warning(
    endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_sender: lineage.LineageSender,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)  # accepts into the backlog and never answers
    url = _refusing_url() if endpoint == "refuses" else f"http://127.0.0.1:{hang.getsockname()[1]}"
    config = tmp_path / "openlineage.yml"
    config.write_text(
        f"transport:\n  type: http\n  url: {url}\n  timeout: 1\n  retry:\n    total: 1\n"
        "    backoff_factor: 0.1\n"
    )
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(config))
    location = open_prefix(str(tmp_path / "art"))
    try:
        with caplog.at_level(logging.WARNING):
            took = []
            for i in range(4):
                spec = apply(f"lin/dead{i}", write, version="v1", out_path=OUT).lower()
                t0 = time.perf_counter()
                assert build_step(BuildRequest(spec, location)).action == "built"
                took.append(time.perf_counter() - t0)
            # The builds never waited for the endpoint: against the hanging one, each send waits
            # at least its 1 s timeout, two sends per build. The first build is not timed: it pays the one-time import
            # of the OpenLineage client, which on a loaded machine alone can take a second.
            assert max(took[1:]) < 1.0, took
            t0 = time.perf_counter()
            flushed = lineage.flush(0.5)
            assert time.perf_counter() - t0 < 1.5  # the exit flush is bounded too
            assert lineage.flush(60)
            assert flushed == (endpoint == "refuses")  # a hanging endpoint outlasts the flush
        # One warning in all, from any logger (urllib3's retry lines included).
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert fresh_sender.dropped == 8 and fresh_sender.sent == 0
    finally:
        hang.close()


def test_a_full_queue_drops_events_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gate = threading.Event()

    class Blocked:
        """A client whose send waits for the test: the queue fills behind it."""

        def emit(self, event: Any) -> None:
            gate.wait(30)

    sender = lineage.LineageSender(maxsize=2, client=Blocked())
    previous = lineage.use_sender(sender)
    try:
        file_transport(tmp_path, monkeypatch)
        location = open_prefix(str(tmp_path / "art"))
        with caplog.at_level(logging.WARNING, logger="marin"):
            for i in range(4):
                build_step(BuildRequest(apply(f"lin/q{i}", write, version="v1", out_path=OUT).lower(), location))
        assert sender.dropped >= 4
        assert len([r for r in caplog.records if "full" in r.getMessage()]) == 1
    finally:
        gate.set()
        lineage.use_sender(previous)
        lineage.reset_config_cache()


_SCRIPT = """
import sys
import fsspec
from marin.execution.builder.commit import BuildRequest, build_step
from marin.execution.lazy import OUT, apply
from marin.execution.store.location import open_prefix

def write(out_path):
    with fsspec.open(out_path, "w") as f:
        f.write("x")

spec = apply("lin/sub", write, version="v1", out_path=OUT).lower()
assert build_step(BuildRequest(spec, open_prefix(sys.argv[1]))).action == "built"
from marin.execution.builder import lineage
assert lineage.flush(30)
print("openlineage" in sys.modules)
"""


def test_off_unless_configured_and_openlineage_not_imported(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")}
    env["HOME"] = str(tmp_path)  # no ~/.openlineage/openlineage.yml
    env["PYTHONPATH"] = str(ROOT)

    def run(cwd: Path, prefix: str) -> str:
        cwd.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(tmp_path / prefix)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert run(tmp_path / "plain", "a") == "False"
    assert not list(tmp_path.glob("**/events*.jsonl"))
    # The same script with an openlineage.yml in its working directory sends.
    configured = tmp_path / "configured"
    configured.mkdir()
    events = tmp_path / "events.jsonl"
    (configured / "openlineage.yml").write_text(
        f"transport:\n  type: file\n  log_file_path: {events}\n  append: true\n"
    )
    assert run(configured, "b") == "True"
    assert [e["eventType"] for e in read_events(events)] == ["START", "COMPLETE"]


_BLOCKING_PIPELINE = """
import time
from marin.execution.lazy import OUT, apply

def hold(out_path):
    time.sleep(600)  # until the test interrupts the run

pipeline = apply("lin/held", hold, version="v1", out_path=OUT)
"""


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_marin_run_interrupted_mid_build_sends_abort(tmp_path: Path) -> None:
    import signal

    pipeline = tmp_path / "held.py"
    pipeline.write_text(_BLOCKING_PIPELINE)
    events = tmp_path / "events.jsonl"
    config = tmp_path / "openlineage.yml"
    config.write_text(f"transport:\n  type: file\n  log_file_path: {events}\n  append: true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")}
    env.update(OPENLINEAGE_CONFIG=str(config), PYTHONPATH=str(ROOT))
    marin = Path(sys.executable).parent / "marin"
    proc = subprocess.Popen(
        [str(marin), "run", f"{pipeline}:pipeline", "--prefix", str(tmp_path / "art")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        # The pipeline run's START, then the build's (written by the run's sender thread).
        while len(read_events(events)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    sent = read_events(events)
    for event in sent:
        check_event(event)
    target = f"{pipeline}:pipeline"
    # The build's ABORT, then the pipeline run's: every step's end precedes the pipeline's.
    assert [(e["job"]["name"], e["eventType"]) for e in sent] == [
        (target, "START"),
        ("lin/held@v1", "START"),
        ("lin/held@v1", "ABORT"),
        (target, "ABORT"),
    ]
    assert sent[1]["run"]["runId"] == sent[2]["run"]["runId"]
    assert sent[0]["run"]["runId"] == sent[3]["run"]["runId"]
    assert sent[2]["run"]["facets"]["parent"]["job"]["name"] == target
    assert sent[2]["run"]["facets"]["parent"]["run"]["runId"] == sent[0]["run"]["runId"]


class _HugeAnswers:
    """An HTTP endpoint on loopback answering every POST with ``status`` and a body of
    ``body_bytes`` (a 307 redirects to ``/final``, which answers 201), sent until the client
    closes; ``sent`` holds the body bytes each connection got out before that."""

    def __init__(self, status: int, body_bytes: int) -> None:
        self.status, self.body_bytes = status, body_bytes
        self.sent: list[int] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            thread = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _answer(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        conn.settimeout(20)
        sent, chunk = 0, b"x" * 65536
        with conn, conn.makefile("rb") as reader:
            while True:  # requests on this connection, one after another
                head = [reader.readline()]
                while head[-1] not in (b"\r\n", b""):
                    head.append(reader.readline())
                if head[-1] == b"":
                    break
                length = next(
                    (
                        int(h.split(b":")[1])
                        for h in head
                        if h.lower().startswith(b"content-length")
                    ),
                    0,
                )
                reader.read(length)
                final = head[0].split()[1] == b"/final"
                status = 201 if final or self.status != 307 else 307
                status = status if final or self.status == 307 else self.status
                conn.sendall(
                    f"HTTP/1.1 {status} X\r\nContent-Length: {self.body_bytes}\r\n"
                    f"Location: {self.url}/final\r\n\r\n".encode()
                )
                try:
                    while sent < self.body_bytes:
                        conn.sendall(chunk)
                        sent += len(chunk)
                except OSError:  # the client closed: the rest was never read
                    break
        self.sent.append(sent)


@pytest.mark.parametrize("status", [201, 500, 307])
def test_a_huge_lineage_answer_is_never_read(
    status: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_sender: lineage.LineageSender,
) -> None:
    body = 96 * 1024 * 1024
    endpoint = _HugeAnswers(status, body)
    config = tmp_path / "openlineage.yml"
    config.write_text(
        f"transport:\n  type: http\n  url: {endpoint.url}\n  timeout: 10\n  retry:\n"
        "    total: 2\n    backoff_factor: 0.01\n"
    )
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(config))
    try:
        spec = apply("lin/huge", write, version="v1", out_path=OUT).lower()
        assert build_step(BuildRequest(spec, open_prefix(str(tmp_path / "art")))).action == "built"
        assert lineage.flush(60)
        for thread in list(endpoint.threads):
            thread.join(30)
        # Two events; a 500 is retried twice, a 307 followed: every answer's body dropped.
        assert len(endpoint.sent) >= 2, endpoint.sent
        # What the kernel buffers took (about 200 KiB here); the client read none of it.
        assert max(endpoint.sent) < 2 * 1024 * 1024, endpoint.sent
        assert (fresh_sender.sent, fresh_sender.dropped) == ((0, 2) if status == 500 else (2, 0))
    finally:
        endpoint.server.close()


def test_a_remote_build_names_its_job_in_the_run_facet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_sender: lineage.LineageSender
) -> None:
    from tests.reliability.remote_pipelines import train

    path = file_transport(tmp_path, monkeypatch)
    step = apply("lin/remote", train, version="v1", data="d", out_path=OUT)
    spec = step.with_options(remote="local").lower()
    location = open_prefix(str(tmp_path / "art"))
    outcome = build_step(BuildRequest(spec, location))
    assert lineage.flush(30)
    done = read_events(path)[-1]
    check_event(done)
    job = done["run"]["facets"]["marin"]["remoteJob"]
    assert job == {"backend": "local", "jobId": outcome.record.provenance["job"]["job_id"]}
