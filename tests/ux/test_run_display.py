"""What ``marin run`` shows: a live display on a terminal, plain lines elsewhere, a summary."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pexpect
import pytest

from tests.ux.helpers import PIPELINES, ROOT, marin, strip_ansi

LIVE_HEADER = re.compile(r"(\d+)/(\d+) done · (\d+) running · (\d+) skipped · (\d+) failed")


def spawn(*args: str, sleep: str = "0.8") -> pexpect.spawn:
    env = {**os.environ, "TERM": "xterm-256color", "MARIN_TEST_SLEEP": sleep, "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    return pexpect.spawn(
        sys.executable,
        ["-m", "marin.cli", "run", *args],
        cwd=str(ROOT),
        env=env,
        dimensions=(40, 120),
        encoding="utf-8",
        timeout=60,
    )


def test_terminal_shows_live_progress_then_a_summary(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    child = spawn(f"{PIPELINES}:pipeline", "--prefix", prefix, "--max-concurrent", "2")
    raw = child.read()
    child.close()
    assert child.exitstatus == 0, raw
    screen = strip_ansi(raw)
    # While the two middle steps run, a person sees both, each with its elapsed time.
    frame = re.search(
        r"1/4 done · 2 running · 0 skipped · 0 failed · [\d.]+s\s*\r?\n"
        r"\S+ demo/(left|right)@v1\s+\d+\.\d\ds\s*\r?\n\S+ demo/(left|right)@v1\s+\d+\.\d\ds",
        screen,
    )
    assert frame, screen[:3000]
    frames = [tuple(map(int, m)) for m in LIVE_HEADER.findall(screen)]
    assert frames and frames[-1] == (4, 4, 0, 0, 0), frames[-3:]
    rest = raw
    # The display is redrawn in place with cursor movement, not printed line after line.
    assert "\x1b[1A" in rest or "\x1b[2K" in rest
    # Step output and warnings show above the display, each line labelled with its step.
    assert "demo/join@v1 | step join says hello" in screen
    assert "WARNING demo/join@v1 | step join logs a warning" in screen
    # The final summary: every step with its duration, and the slowest ones.
    summary = screen[screen.index("step ") :]
    for name in ("demo/source@v1", "demo/left@v1", "demo/right@v1", "demo/join@v1"):
        assert re.search(rf"{re.escape(name)}\s+built\s+\d+\.\d\ds", summary), summary
    assert "4 steps: 4 built in" in summary and "slowest:" in summary
    assert "built 4 step(s), skipped 0" in summary
    # Routine INFO lines are left to the display.
    assert "INFO    start" not in screen


def test_terminal_failure_names_step_error_and_log(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    child = spawn(f"{PIPELINES}:failing", "--prefix", prefix, sleep="0.3")
    out = strip_ansi(child.read())
    child.close()
    assert child.exitstatus == 1
    log = f"{prefix}/demo/bad/v1.marin/log.txt"
    assert "failed: demo/bad@v1" in out
    assert "error: RuntimeError: kaboom: the model diverged" in out
    assert f"log:   {log}" in out
    assert "error: RuntimeError: kaboom: the model diverged (step demo/bad@v1)" in out
    assert "demo/bad@v1 | about to fail" in out
    assert Path(log).read_text().startswith("about to fail")


def test_no_progress_flag_on_a_terminal_gives_plain_lines(tmp_path: Path) -> None:
    child = spawn(f"{PIPELINES}:pipeline", "--prefix", str(tmp_path / "p"), "--no-progress",
                  sleep="0.1")  # fmt: skip
    out = child.read()
    child.close()
    assert child.exitstatus == 0
    assert not LIVE_HEADER.search(strip_ansi(out))
    assert "\x1b[1A" not in out and "\x1b[?25l" not in out  # no cursor movement or hiding
    assert "INFO    start demo/source@v1" in out and "INFO    finish demo/join@v1" in out


def test_off_terminal_there_is_no_live_display(tmp_path: Path) -> None:
    result = marin(
        "run", f"{PIPELINES}:pipeline", "--prefix", str(tmp_path / "p"),
        env={"MARIN_TEST_SLEEP": "0.1", "TERM": "xterm-256color"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    both = result.stdout + result.stderr
    assert "\x1b[" not in both, "escape codes in non-terminal output"
    assert not LIVE_HEADER.search(both)
    assert "INFO    start demo/left@v1" in result.stderr
    assert re.search(r"demo/join@v1\s+built\s+\d", result.stdout)
    # Step output is still shown (plain, with the same labels) and captured unlabelled.
    assert "demo/join@v1 | step join says hello\n" in result.stdout
    assert "WARNING demo/join@v1 | step join logs a warning" in result.stderr
    log = (tmp_path / "p" / "demo" / "join" / "v1.marin" / "log.txt").read_text()
    assert log.startswith("step join says hello\n") and "step join logs a warning" in log
    assert "left" not in log and " | " not in log


def test_no_step_output_keeps_steps_off_the_terminal_but_in_their_logs(tmp_path: Path) -> None:
    result = marin(
        "run", f"{PIPELINES}:pipeline", "--prefix", str(tmp_path / "p"), "--no-step-output",
        env={"MARIN_TEST_SLEEP": "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    both = result.stdout + result.stderr
    assert "says hello" not in both and "logs a warning" not in both
    assert "INFO    start demo/join@v1" in result.stderr  # Marin's own lines stay
    log = (tmp_path / "p" / "demo" / "join" / "v1.marin" / "log.txt").read_text()
    assert "step join says hello" in log and "step join logs a warning" in log


def test_run_json_keeps_step_output_off_stdout(tmp_path: Path) -> None:
    result = marin(
        "run", f"{PIPELINES}:pipeline", "--prefix", str(tmp_path / "p"), "--json",
        env={"MARIN_TEST_SLEEP": "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "says hello" not in result.stdout  # stdout is the report's
    assert "demo/join@v1 | step join says hello" in result.stderr


def test_summary_points_at_a_small_text_result(tmp_path: Path) -> None:
    from tests.ux.helpers import EXAMPLE

    prefix = tmp_path / "p"
    result = marin("run", EXAMPLE, "--prefix", str(prefix))
    assert result.returncode == 0, result.stderr
    report = prefix / "ngram" / "report" / "v1"
    text = report.read_text()
    assert text.endswith("\n")
    lines = text.count("\n")
    assert f"  ngram/report@v1: {report} (Markdown, {lines} lines)\n" in result.stdout
    assert result.stdout.count(str(report)) == 1  # each output path once


def test_summary_calls_a_json_result_json(tmp_path: Path) -> None:
    from marin.execution.store.location import open_prefix
    from marin.progress import readable_result

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "metrics.json").write_text('{"bleu": 0.3}\n')
    (tmp_path / "table.csv").write_text("a,b\n1,2\n")
    location = open_prefix(str(tmp_path))
    assert readable_result(location, "out") == f"{tmp_path}/out/metrics.json (JSON, 1 line)"
    assert readable_result(location, "table.csv") == f"{tmp_path}/table.csv (CSV, 2 lines)"


def test_second_run_lists_skipped_steps(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    env = {"MARIN_TEST_SLEEP": "0"}
    assert marin("run", f"{PIPELINES}:pipeline", "--prefix", prefix, env=env).returncode == 0
    again = marin("run", f"{PIPELINES}:pipeline", "--prefix", prefix, env=env)
    assert re.search(r"demo/join@v1\s+skipped\s+-\s+built earlier", again.stdout)
    assert re.search(r"demo/source@v1\s+skipped\s+-\s+built earlier", again.stdout)
    assert "4 steps: 4 skipped" in again.stdout
    # A missing intermediate under built steps is pruned, and the summary says so.
    shutil.rmtree(os.path.join(prefix, "demo", "left", "v1.marin"))
    third = marin("run", f"{PIPELINES}:pipeline", "--prefix", prefix, env=env)
    assert re.search(r"demo/left@v1\s+skipped\s+-\s+pruned: not built", third.stdout)


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
def test_ctrl_c_exits_130_and_restores_the_terminal(tmp_path: Path) -> None:
    child = spawn(f"{PIPELINES}:pipeline", "--prefix", str(tmp_path / "p"), sleep="1.5")
    child.expect("demo/source@v1")
    time.sleep(0.3)
    child.sendintr()
    out = child.read()
    child.close()
    assert child.exitstatus == 130
    assert "error: interrupted" in out
    assert "\x1b[?25h" in out  # the cursor is shown again
