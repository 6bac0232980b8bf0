"""Per-step log capture while several steps run at once on threads."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import fsspec

from marin.execution.builder.step_logs import PASS_THROUGH, capture_step_output, set_echo
from marin.execution.lazy import OUT, apply
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import StepRunner
from marin.execution.store.location import open_prefix
from marin.execution.store.records import log_path

N_STEPS = 8
REPEAT = 200


def chatty(marker: str, barrier_id: int, out_path: str) -> str:
    barrier = BARRIERS[barrier_id]
    barrier.wait(timeout=30)  # all 8 steps are running at once from here on
    logger = logging.getLogger(f"user.{marker}")
    for i in range(REPEAT):
        print(f"print {marker} {i}")
        sys.stderr.write(f"stderr {marker} {i}\n")
        logger.warning("log %s %d", marker, i)
        if i % 50 == 0:
            threading.Event().wait(0.001)  # let the other threads interleave
    barrier.wait(timeout=30)  # and still running together at the end
    with fsspec.open(out_path, "w") as f:
        f.write(marker)
    return marker


BARRIERS: dict[int, threading.Barrier] = {}


def test_eight_concurrent_steps_each_log_only_their_own_markers(prefix: str) -> None:
    key = id(prefix)
    BARRIERS[key] = threading.Barrier(N_STEPS)
    markers = [f"M{i}x" for i in range(N_STEPS)]
    steps = [
        apply(f"logs/step-{i}", chatty, version="v1", marker=m, barrier_id=key, out_path=OUT)
        for i, m in enumerate(markers)
    ]
    specs = [s.lower() for s in steps]
    StepRunner(RunOptions(max_concurrent=N_STEPS), prefix=prefix).run(specs)
    location = open_prefix(prefix)
    for spec, marker in zip(specs, markers, strict=True):
        with location.fs.open(location.path(log_path(spec.output_path)), "r") as f:
            text = f.read()
        lines = text.splitlines()
        assert len(lines) == 3 * REPEAT, (marker, len(lines))
        for other in markers:
            if other != marker:
                assert other not in text, f"{other} leaked into the log of {marker}"
        for i in range(REPEAT):
            assert f"print {marker} {i}" in lines
            assert f"stderr {marker} {i}" in lines
        assert sum(f"log {marker} " in line for line in lines) == REPEAT


def test_output_outside_a_step_is_not_captured(tmp_path: Any, capsys: Any) -> None:
    import io

    log = io.StringIO()
    with capture_step_output(log):
        print("inside")
    print("outside")
    assert log.getvalue() == "inside\n"
    assert "inside" in capsys.readouterr().out  # passed through as well


def test_pass_through_off_and_echo(capsys: Any) -> None:
    import io

    log = io.StringIO()
    token = PASS_THROUGH.set(False)
    try:
        with capture_step_output(log):
            print("quiet")
    finally:
        PASS_THROUGH.reset(token)
    assert "quiet" not in capsys.readouterr().out and log.getvalue() == "quiet\n"

    echoed: list[str] = []
    set_echo(echoed.append)
    try:
        with capture_step_output(io.StringIO()):
            print("to the display")
    finally:
        set_echo(None)
    assert "".join(echoed) == "to the display\n"
    assert "to the display" not in capsys.readouterr().out


def test_capture_survives_a_reset_of_the_root_loggers_handlers() -> None:
    # An engine's logging.config.dictConfig (or basicConfig(force=True)) replaces the root
    # logger's handlers; a step's log records must still reach its log.
    import io
    import logging.config

    with capture_step_output(io.StringIO()):
        pass  # installed
    root = logging.getLogger()
    before = list(root.handlers)
    logging.config.dictConfig(
        {
            "version": 1,
            "incremental": False,
            "disable_existing_loggers": False,
            "root": {"level": "WARNING"},
        }
    )
    try:
        assert not root.handlers
        step_log = io.StringIO()
        with capture_step_output(step_log):
            logging.getLogger("user.after_reset").warning("still captured")
        # Through the step-log handler (not logging's last-resort print to stderr):
        assert "WARNING user.after_reset: still captured" in step_log.getvalue()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in before:
            root.addHandler(handler)


def test_a_memory_prefix_log_is_shown_and_another_process_is_told_why_it_sees_nothing(
    capsys: Any,
) -> None:
    """Issue 55: ``marin show`` of a ``memory://`` step named a log URL nobody can open; it
    prints the log's last lines in the process that built it. A new ``marin`` command, whose
    ``memory://`` is empty, says that instead of "check the name"."""
    import uuid

    from marin.cli import main
    from tests.ux.helpers import PIPELINES, marin

    prefix = f"memory://logs-{uuid.uuid4().hex[:8]}"
    assert main(["run", f"{PIPELINES}:greeting", "--prefix", prefix, "--no-progress"]) == 0
    assert "gone when it exits" in capsys.readouterr().out
    assert main(["show", "demo/hello@v1", "--prefix", prefix]) == 0
    shown = capsys.readouterr().out
    assert f"log          {prefix}/demo/hello/v1.marin/log.txt (in this process's memory" in shown
    assert "\n    step greeting says hello\n" in shown

    other = marin("show", "demo/hello@v1", "--prefix", prefix)
    assert other.returncode == 2
    assert "memory:// is one process's own store: a new `marin` command starts with it empty" in (
        other.stderr
    )
    listed = marin("ls", "--prefix", prefix)
    assert listed.returncode == 0 and "memory:// is one process's own store" in listed.stderr
