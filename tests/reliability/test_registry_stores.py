"""The registry on every store (issue 57): two racing ``register`` calls of one id, exactly one
wins (``O_EXCL``-like ``link`` on local disk, ``If-None-Match`` on moto S3, ``ifGenerationMatch=0``
on fake-gcs), in separate processes with their own cwd, HOME and TMPDIR; ``Artifact.from_id``
resolves with two requests, its manifest's GET and the GET of the record at its path; and a
registered build is never rebuilt in place there."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from marin.execution.errors import RegisteredBuildFrozenError, StepFailedError
from marin.execution.lazy import OUT, apply, run
from marin.execution.pipeline.artifact import Artifact
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record
from marin.execution.store.registry import (
    ArtifactAlreadyExistsError,
    RegistryId,
    lookup,
    register,
)
from tests.reliability.conftest import child_env

ROUNDS = 3
_RACER = """
import sys
print("ready", flush=True)
sys.stdin.readline()
from marin.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _built(prefix: str, *, force: bool = False) -> None:
    def write(out_path: str) -> dict[str, str]:
        import fsspec

        with fsspec.open(f"{out_path}/data.txt", "w", auto_mkdir=True) as f:
            f.write("released")
        return {"ok": "yes"}

    step = apply("rel/data", write, version="v1", out_path=OUT)
    run([step], prefix=prefix, force=["rel/data"] if force else ())


def _race_processes(prefix: str, reg_id: str, tmp_path: Path) -> list[subprocess.Popen[str]]:
    procs = []
    for who in ("alice", "bob"):
        home = tmp_path / f"{reg_id.replace('/', '_')}-{who}"
        (home / "tmp").mkdir(parents=True)
        env = child_env(HOME=str(home), TMPDIR=str(home / "tmp"), MARIN_USER=who)
        args = ["register", "rel/data@v1", "--id", reg_id, "--prefix", prefix]
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _RACER, *args], cwd=home, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ))  # fmt: skip
    for proc in procs:  # both have imported Python and wait: then both are told to go at once
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs


def test_two_racing_registrations_of_one_id_exactly_one_wins(
    store_prefix: str, tmp_path: Path
) -> None:
    _built(store_prefix)
    location = open_prefix(store_prefix)
    for i in range(ROUNDS):
        reg_id = f"rel/data/r{i}"
        if store_prefix.startswith("memory://"):  # one process's store: threads race
            winners = _race_threads(location, reg_id)
        else:
            winners = []
            for proc, who in zip(_race_processes(store_prefix, reg_id, tmp_path), ("alice", "bob"), strict=True):
                _, err = proc.communicate(timeout=120)
                if proc.returncode == 0:
                    winners.append(who)
                else:
                    assert proc.returncode == 1, err[-2000:]
                    assert f"{reg_id} is registered already (to rel/data@v1" in err
        assert len(winners) == 1, winners
        manifest = lookup(location, RegistryId.parse(reg_id))
        assert manifest.registered_by.startswith(f"{winners[0]}@")  # the winner's, whole


def _race_threads(location: Any, reg_id: str) -> list[str]:
    barrier = threading.Barrier(2)
    winners: list[str] = []

    def go(who: str) -> None:
        barrier.wait()
        try:
            register(location, "rel/data/v1", RegistryId.parse(reg_id), f"{who}@host")
            winners.append(who)
        except ArtifactAlreadyExistsError:
            pass

    threads = [threading.Thread(target=go, args=(w,)) for w in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return winners


def test_from_id_is_two_gets_and_the_build_is_frozen_on_s3(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    import s3fs

    prefix = f"s3://marin-tests/{uuid.uuid4().hex[:10]}"
    _built(prefix)
    location = open_prefix(prefix)
    register(location, "rel/data/v1", RegistryId.parse("rel/data/v1"), "me@h")
    record = read_record(location, "rel/data/v1")
    requests: list[str] = []
    original = s3fs.S3FileSystem._call_s3

    async def counted(self: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        requests.append(str(method))
        return await original(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    found = Artifact.from_id("rel/data/v1", prefix=prefix)
    # The manifest, then the record at its path (still that build?): one GET each.
    assert requests == ["get_object", "get_object"], requests
    assert found.url == f"{prefix}/rel/data/v1" and found.result == {"ok": "yes"}
    assert found.record == record
    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", original)
    with pytest.raises(StepFailedError) as refused:  # --force of the registered build
        _built(prefix, force=True)
    assert isinstance(refused.value.__cause__, RegisteredBuildFrozenError)
    assert "is registered as rel/data/v1" in refused.value.__cause__.what
    assert read_record(location, "rel/data/v1") == record
