"""OpenLineage's HTTP transport, made to read no response body at all.

The transport posts an event and needs only the status, but ``requests`` reads a whole body
into memory (a hostile or broken endpoint answering 600 MiB cost 1.2 GiB of RSS on the sender
thread), and ``urllib3`` reads one to the end before each retry or redirect, to reuse the
connection. Here every answer's body is dropped unread by closing its connection: a lineage
endpoint can cost a new connection per event, never memory. Imported by ``lineage_events`` on
the sender thread only.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import requests
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import ConnectionPool
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry


class ClosingRetry(Retry):
    """urllib3's retries, closing each retried answer first: urllib3 would read its body to the
    end ("drain") to reuse the connection; a closed one has nothing left to read."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        if response is not None:
            response.close()
        return super().increment(method, url, response, error, _pool, _stacktrace)


class BodilessAdapter(HTTPAdapter):
    """Sends with ``stream=True`` (requests reads no body) and closes the answer's connection
    before requests can read it (a redirect's body too): every ``content`` is empty."""

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        kwargs["stream"] = True
        return super().send(request, *args, **kwargs)

    def build_response(self, req: requests.PreparedRequest, resp: Any) -> requests.Response:
        response = super().build_response(req, resp)
        resp.close()
        response._content = b""  # requests' own "already read" marker: content is never read
        response._content_consumed = True
        return response


def bound_http_transports(transport: Any) -> None:
    """Give every HTTP transport in ``transport`` (itself, or a composite's) the bodiless
    adapter with its own retry settings; one given its own adapter in code is left alone."""
    from openlineage.client.transport.http import HttpTransport

    for each in getattr(transport, "transports", None) or [transport]:
        if not isinstance(each, HttpTransport) or each.config.adapter is not None:
            continue
        adapter = BodilessAdapter(max_retries=ClosingRetry(**each.config.retry))
        each.config.adapter = adapter
        session = requests.Session()
        for scheme in ("http://", "https://"):  # a redirect to another host, too
            session.mount(scheme, adapter)
        each.session = session  # mounts the adapter on the transport's URL as well
