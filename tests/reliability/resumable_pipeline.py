"""A resumable step that counts, for the resume tests; and a process entry point.

``python -m tests.reliability.resumable_pipeline <prefix> <where> [isolate|remote] [every]`` runs one
step, ``count@v1``, that counts from 0 to 100 and writes a checkpoint (``{"next": i}``) every
``every`` iterations, in its own output path (``where=out``, as Levanter does) or in
``current_context().checkpoint_path`` (``where=ckpt``). It prints the committed record's
``provenance.attempt`` as JSON. Environment variables steer it, so a test never sleeps:

- ``MARIN_TEST_COUNTER``: a file each executed iteration appends ``<pid> <i>`` to;
- ``MARIN_TEST_KILL_AT=<i>``: at iteration i the runner is SIGKILLed (with
  ``MARIN_TEST_ISOLATED=1``, an isolated child kills its runner, and dies with it); with
  ``MARIN_TEST_KILL_ONCE=<file>`` only the attempt that creates that file is (a retry in the
  same environment, such as Airflow's, goes on);
- ``MARIN_TEST_HOLD_AT=<i>:<started>:<release>``: at iteration i the step creates ``started``
  (holding its pid) and waits until ``release`` exists;
- ``MARIN_TEST_PUBLISHED``: a file each published checkpoint appends ``<pid> <next>`` to.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import fsspec

from marin.execution.lazy import ArtifactStep, apply
from marin.execution.pipeline.context import current_context
from tests.reliability.pipelines import append_line, wait_for_file

COUNTER_ENV = "MARIN_TEST_COUNTER"
KILL_ENV = "MARIN_TEST_KILL_AT"
KILL_ONCE_ENV = "MARIN_TEST_KILL_ONCE"
HOLD_ENV = "MARIN_TEST_HOLD_AT"
PUBLISHED_ENV = "MARIN_TEST_PUBLISHED"


def _checkpoint_file(out: str, where: str) -> str:
    folder = current_context().checkpoint_path if where == "ckpt" else f"{out}/checkpoints"
    assert folder is not None, "a resumable step has a checkpoint_path"
    return f"{folder}/state.json"


def _hold(i: int) -> None:
    at, _, files = os.environ.get(HOLD_ENV, "").partition(":")
    if not at or int(at) != i:
        return
    started, _, release = files.partition(":")
    with open(started + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(started + ".tmp", started)  # whole: a test reads the pid once the file is there
    wait_for_file(release)


def _first_kill() -> bool:
    """Whether this attempt may die: always, or once per ``MARIN_TEST_KILL_ONCE`` file."""
    marker = os.environ.get(KILL_ONCE_ENV)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def _publish(path: str, next_i: int) -> None:
    if not current_context().still_holds_lease():
        raise RuntimeError(f"lost the lease: checkpoint {next_i} not published")
    fs, root = fsspec.core.url_to_fs(path)
    fs.makedirs(root.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(root, json.dumps({"next": next_i, "pid": os.getpid()}).encode())
    published = os.environ.get(PUBLISHED_ENV)
    if published:
        append_line(published, f"{os.getpid()} {next_i}")


def count(out: str, upto: int, every: int, where: str) -> dict[str, Any]:
    """Count from 0 to ``upto``, resuming from the newest checkpoint."""
    path = _checkpoint_file(out, where)
    fs, root = fsspec.core.url_to_fs(path)
    start = json.loads(fs.cat_file(root))["next"] if fs.exists(root) else 0
    counter, kill_at = os.environ.get(COUNTER_ENV), os.environ.get(KILL_ENV)
    for i in range(start, upto + 1):
        if kill_at is not None and int(kill_at) == i and _first_kill():
            if os.environ.get("MARIN_TEST_ISOLATED") == "1":
                os.kill(os.getppid(), signal.SIGKILL)  # the runner; this child dies with it
            os.kill(os.getpid(), signal.SIGKILL)
        _hold(i)
        if counter:
            append_line(counter, f"{os.getpid()} {i}")
        if (i + 1) % every == 0:
            _publish(path, i + 1)
    out_fs, out_root = fsspec.core.url_to_fs(out)
    out_fs.makedirs(out_root, exist_ok=True)
    out_fs.pipe_file(f"{out_root}/total", str(upto).encode())
    return {"started_at": start}


def counting_step(
    where: str = "out", *, isolate: bool = False, every: int = 10, remote: str | None = None
) -> ArtifactStep:
    from marin.execution.lazy import OUT

    step = apply("count", count, version="v1", out=OUT, upto=100, every=every, where=where)
    return step.with_options(resumable=True, isolate=isolate, remote=remote)


def main(argv: list[str]) -> int:
    import logging

    from marin.execution.lazy import lower, run
    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import read_record

    logging.basicConfig(level=logging.INFO, format="%(process)d %(levelname)s %(message)s")
    prefix, where = argv[0], argv[1]
    placement = argv[2] if len(argv) > 2 else ""
    every = int(argv[3]) if len(argv) > 3 else 10
    remote = "local" if placement == "remote" else None
    handle = counting_step(where, isolate=placement == "isolate", every=every, remote=remote)
    run(handle, prefix=prefix)
    record = read_record(open_prefix(prefix), lower(handle, memo={}).output_path)
    assert record is not None
    print(json.dumps({"attempt": record.provenance.get("attempt"), "result": record.result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


counting = counting_step("out")
"""The CLI's target: ``marin plan tests/reliability/resumable_pipeline.py:counting``."""

counting_plain = counting_step("ckpt").with_options(resumable=False)
"""``counting_step("ckpt")`` without ``resumable``: one step whose option was switched off."""
