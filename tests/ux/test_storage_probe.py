"""Fail fast on storage that cannot be reached (issue 22): ``marin plan`` against an S3
endpoint that refuses connections, and one that accepts them and never answers, exits 2 within
a bound, says which endpoint and credentials it tried, and prints no library traceback."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.ux.helpers import EXAMPLE, marin

PROBE_S = 2.0
BOUND_S = 45.0
"""Interpreter start, the pipeline's import and the probe on a loaded 2-core machine; the
storage libraries' own retries, which the probe cuts short, took minutes."""


@pytest.fixture
def refusing_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A socket of the test's own that takes connections into its backlog and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield int(s.getsockname()[1])


def s3_env(port: int) -> dict[str, str]:
    pytest.importorskip("s3fs")
    return {
        "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "MARIN_STORAGE_PROBE_TIMEOUT": str(PROBE_S),
    }


@pytest.mark.parametrize("server", ["refusing_port", "silent_port"])
def test_unreachable_s3_fails_fast(server: str, request: pytest.FixtureRequest) -> None:
    port = request.getfixturevalue(server)
    started = time.monotonic()
    result = marin("plan", EXAMPLE, "--prefix", "s3://marin-tests/x", env=s3_env(port))
    took = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert took < BOUND_S
    err = result.stderr
    assert "error: storage for s3://marin-tests/x" in err
    assert f"tried endpoint http://127.0.0.1:{port}, credentials from $AWS_ACCESS_KEY_ID" in err
    assert "MARIN_STORAGE_PROBE_TIMEOUT" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert result.stdout == ""


def test_a_bad_probe_timeout_is_bad_input(refusing_port: int) -> None:
    env = {**s3_env(refusing_port), "MARIN_STORAGE_PROBE_TIMEOUT": "soon"}
    result = marin("plan", EXAMPLE, "--prefix", "s3://marin-tests/x", env=env)
    assert result.returncode == 2
    assert "MARIN_STORAGE_PROBE_TIMEOUT='soon' is not a number of seconds" in result.stderr


def test_a_silent_ftp_server_is_bounded_by_the_probe(silent_port: int) -> None:
    """Issue 53.16: fsspec's FTP file system connects when it is made, before any probe, and
    waited its own 30 s (then more) on a server that accepts and never answers."""
    started = time.monotonic()
    env = {"MARIN_STORAGE_PROBE_TIMEOUT": str(PROBE_S)}
    prefix = f"ftp://127.0.0.1:{silent_port}/x"
    result = marin("plan", EXAMPLE, "--prefix", prefix, env=env)
    took = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert f"error: storage for {prefix} did not answer within {PROBE_S:g}s" in err
    assert "MARIN_STORAGE_PROBE_TIMEOUT" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert took < 25, took  # fsspec's own FTP timeout alone is 30 s
    gc = marin("gc", EXAMPLE, "--prefix", prefix, "--dry-run", env=env)
    assert gc.returncode == 2 and "did not answer within" in gc.stderr, gc.stderr
