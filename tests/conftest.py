from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marin_testing.prefect import isolate_prefect_home  # does not import prefect

# Where the extras are installed (or in CI) an unexpected skip fails the run.
pytest_plugins = ["tests.skip_policy"]


WORKERS_FOLDER = Path(__file__).resolve().parent.parent / ".pytest-workers"
"""Where each pytest-xdist worker gets its working folder: inside the checkout, so the code
digest finds the project from it (its own distribution's modules are followed) as from the
checkout itself."""


def _isolate_xdist_worker() -> None:
    """A pytest-xdist worker (``PYTEST_XDIST_WORKER``) gets a working folder, ``HOME``,
    ``TMPDIR`` and local jobs folder of its own, so two workers never write the same relative
    path, dotfile or temporary file (the jobs folder is made fresh here: the controller's,
    inherited, would be shared). Short paths: Ray and PostgreSQL put Unix sockets under them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    root = tempfile.mkdtemp(prefix=f"marin-{worker}-", dir="/tmp")
    WORKERS_FOLDER.mkdir(exist_ok=True)
    cwd = tempfile.mkdtemp(prefix=f"{worker}-", dir=WORKERS_FOLDER)
    for folder in (root, cwd):  # last at exit: the servers' own atexit stops run first
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    for name in ("home", "tmp", "jobs"):
        os.mkdir(os.path.join(root, name), 0o700)
    # Searchable, not listable, by others: as root, the PostgreSQL harness runs its server as
    # the postgres user in a folder under TMPDIR, which it must be able to reach.
    for folder in (root, os.path.join(root, "tmp")):
        os.chmod(folder, 0o711)
    os.environ["HOME"] = os.path.join(root, "home")
    os.environ["TMPDIR"] = os.path.join(root, "tmp")
    os.environ["MARIN_LOCAL_JOBS"] = os.path.join(root, "jobs")
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    # A worker's environment says COLUMNS=80 and LINES=24 (no terminal): the CLI the tests start
    # would lay out its tables for 80 columns, unlike in a one-process run.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    os.chdir(cwd)


_isolate_xdist_worker()

# Prefect keeps cache records and its database under PREFECT_HOME; every test session gets its
# own, set before anything imports Prefect.
isolate_prefect_home()

# The ``local`` remote backend keeps its jobs' folders under $MARIN_LOCAL_JOBS (else the user's
# ~/.cache): every test session gets its own (mode 700), inherited by the processes it starts.
os.environ.setdefault("MARIN_LOCAL_JOBS", tempfile.mkdtemp(prefix="marin-test-jobs-"))

# A shell that starts a job in the background without job control starts it with SIGINT
# ignored, and an ignored SIGINT is inherited by every process the tests start: the Ctrl-C
# tests would then send an interrupt nobody receives. Python's own handler is what a user's
# terminal gives, and exec resets it to the default in child processes.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


MAX_WORKERS = 2
"""Worker processes of a whole-suite run: what CI's two cores keep busy (the slow tests mostly
wait on servers and subprocesses)."""


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """A whole-suite run (``pytest``, ``pytest -m "not slow"``) spreads its test files over
    worker processes with pytest-xdist, one file per worker at a time (module fixtures and
    in-file order hold); a run that names its tests, asks for ``-n``, or has no pytest-xdist runs
    in this process as usual. Every worker has its own temporary folders, Prefect home, servers
    and ports (``-n 0`` turns this off)."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    named = config.args_source is not pytest.Config.ArgsSource.TESTPATHS
    if named or config.option.numprocesses is not None or config.option.usepdb:
        return
    workers = min(MAX_WORKERS, len(os.sched_getaffinity(0)))
    if workers > 1 and not config.option.collectonly:
        config.option.numprocesses = workers
        if config.option.dist == "no":
            config.option.dist = "loadfile"
            # Files go out in the order pytest_collection_modifyitems below gives them, not
            # xdist's (most tests first, which leaves the few long end-to-end files for last).
            config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker, the files with the most ``slow`` tests (servers, engines,
    subprocesses) come first, then those with the most tests: a worker that is handed the last
    file is handed a short one, so neither waits long for the other at the end."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    weight: dict[str, tuple[int, int]] = {}
    for item in items:
        slow, count = weight.get(_file_of(item), (0, 0))
        weight[_file_of(item)] = (slow - (item.get_closest_marker("slow") is not None), count - 1)
    items.sort(key=lambda item: weight[_file_of(item)])  # stable: in-file order holds


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The in-process CLI (``marin.cli.main``) configures the root logger with a handler on
    this test's captured stderr, closed after it: give every later test the logger it had."""
    import logging

    from marin import terminal_log

    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    saved = (terminal_log._active, terminal_log._default)
    yield
    # Only the terminal handler the CLI added goes: Marin's step-log capture keeps its own.
    if terminal_log._active is not None and terminal_log._active not in before:
        root.removeHandler(terminal_log._active)
    root.setLevel(level)
    terminal_log._active, terminal_log._default = saved


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from marin_testing.prefect import stop_harness

    stop_harness()


@pytest.fixture(params=["local", "memory"])
def prefix(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """The same tests on local disk and on fsspec's in-memory file system."""
    if request.param == "local":
        yield str(tmp_path / "prefix")
    else:
        import fsspec

        name = f"memory://t-{uuid.uuid4().hex[:10]}"
        yield name
        fs = fsspec.filesystem("memory")
        if fs.exists(name):
            fs.rm(name, recursive=True)


from tests.reliability.conftest import S3_KEYS, free_port  # noqa: E402


# One moto S3 server per session for every test folder (reliability, prefect): a second
# session fixture of the same name elsewhere would start a second server under the same
# environment variables.
@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, str]]:
    """moto's S3 server on 127.0.0.1; yields the environment that points s3fs at it."""
    pytest.importorskip("s3fs")
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {**S3_KEYS, "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import fsspec.config

    fsspec.config.set_conf_env(fsspec.config.conf)
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        fs.mkdir("marin-tests")
        yield env
    finally:
        server.stop()
        fsspec.config.conf.get("s3", {}).pop("endpoint_url", None)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
