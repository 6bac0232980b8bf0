"""Shared by the lineage tests: the OpenLineage schema, a client configuration, an HTTP sink."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from marin.execution.builder import lineage

SPEC = Path(__file__).parent / "spec"
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = f"{ROOT / 'examples' / 'ngram.py'}:pipeline"


def write(out_path: str, text: str = "x") -> str:
    """A step fn: write ``text`` to its output."""
    with fsspec.open(out_path, "w") as f:
        f.write(text)
    return "ok"


def validator() -> Any:
    """A validator of OpenLineage 2-0-2 events, with the facet schemas Marin uses."""
    import jsonschema
    from referencing import Registry, Resource

    schemas = [json.loads(p.read_text()) for p in sorted(SPEC.glob("*.json"))]
    registry = Registry().with_resources(
        (schema["$id"], Resource.from_contents(schema)) for schema in schemas
    )
    main = json.loads((SPEC / "OpenLineage.json").read_text())
    cls = jsonschema.Draft202012Validator
    return cls(main, registry=registry, format_checker=cls.FORMAT_CHECKER), registry


def check_event(event: dict[str, Any]) -> None:
    """Validate ``event`` and the standard facets it carries against their own schemas."""
    import jsonschema

    core, registry = validator()
    core.validate(event)
    facets = {
        "parent": "ParentRunFacet",
        "errorMessage": "ErrorMessageRunFacet",
    }
    for key, name in facets.items():
        if key in event["run"].get("facets", {}):
            _facet_validator(jsonschema, registry, name).validate(event["run"]["facets"][key])
    job_type = event["job"].get("facets", {}).get("jobType")
    if job_type is not None:
        _facet_validator(jsonschema, registry, "JobTypeJobFacet").validate(job_type)


def _facet_validator(jsonschema: Any, registry: Any, name: str) -> Any:
    schema = json.loads((SPEC / f"{name}.json").read_text())
    ref = {"$ref": f"{schema['$id']}#/$defs/{name}"}
    cls = jsonschema.Draft202012Validator
    return cls(ref, registry=registry, format_checker=cls.FORMAT_CHECKER)


@pytest.fixture
def fresh_sender(monkeypatch: pytest.MonkeyPatch) -> Iterator[lineage.LineageSender]:
    """A sender of this test's own (a new client, reading this test's configuration)."""
    for name in list(os.environ):
        if name.startswith("OPENLINEAGE"):
            monkeypatch.delenv(name)
    sender = lineage.LineageSender()
    previous = lineage.use_sender(sender)
    lineage.reset_config_cache()
    try:
        yield sender
    finally:
        sender.flush(30)
        lineage.use_sender(previous)
        # The client turns OPENLINEAGE_URL into OPENLINEAGE__TRANSPORT__* variables of the
        # process; left behind, they would configure every later test's subprocesses.
        # (Not through monkeypatch: it would put them back at its own teardown.)
        for name in list(os.environ):
            if name.startswith("OPENLINEAGE__"):
                os.environ.pop(name, None)
        lineage.reset_config_cache()


def file_transport(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the client at a JSON-lines file, through ``OPENLINEAGE_CONFIG``."""
    events = tmp_path / "events.jsonl"
    config = tmp_path / "openlineage.yml"
    config.write_text(f"transport:\n  type: file\n  log_file_path: {events}\n  append: true\n")
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(config))
    lineage.reset_config_cache()
    return events


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Sink(http.server.ThreadingHTTPServer):
    """An OpenLineage HTTP endpoint on loopback that keeps every event posted to it."""

    daemon_threads = True

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.received = threading.Condition()
        super().__init__(("127.0.0.1", 0), _SinkHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def wait_for(self, count: int, timeout: float) -> bool:
        with self.received:
            return self.received.wait_for(lambda: len(self.events) >= count, timeout)


class _SinkHandler(http.server.BaseHTTPRequestHandler):
    server: Sink

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.received:
            self.server.events.append(json.loads(body))
            self.server.received.notify_all()
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass
