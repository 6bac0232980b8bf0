"""Issue 11 item 9: stored and user strings reach the terminal as data, never markup or escapes.

Step names with rich markup (``sweep[lr=0.1]``, ``x[/red]``) used to crash ``marin ls``,
``marin plan`` and the end of ``marin run`` with a ``MarkupError`` or print wrongly, and a crafted
record or status printed raw ANSI sequences through ``marin show`` and ``marin ls``.

Steps are built for real on local disk; the hostile strings are then written into the real
record and status files, as anyone who can write to the prefix could. Names with brackets are
made as ``StepSpec``s directly, so the tests do not depend on which names the grammar accepts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from marin.cli import main
from marin.execution.errors import StepFailedError
from marin.execution.lazy import apply
from marin.execution.pipeline.context import StepContext
from marin.execution.pipeline.graph import Graph
from marin.execution.plan.options import RunOptions
from marin.execution.plan.read import plan_run
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec, fingerprint_of
from marin.execution.store.location import open_prefix
from marin.execution.store.records import record_path, status_path
from marin.plan_view import plan_table
from marin.progress import RunObserver, render_summary
from marin.terminal_text import safe_json, safe_text

# What a terminal would act on: C0/C1 controls other than newline, DEL, bidi and format chars.
UNSAFE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://x\x1b\\link\x9b31m\u202egnp.exe[/red][bold]"
MARKUP_NAMES = ["sweep[lr=0.1]", "x[/red]", "a[bold]b[/bold]", "[link=http://x]y"]


def _write(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "out.txt").write_text("ok")


def _spec(name: str, version: str = "v0") -> StepSpec:
    """A spec whose name the grammar may (now or later) reject: the display must still cope."""
    fingerprint, payload = fingerprint_of({"name": name, "version": version, "config": {}})

    def run(ctx: StepContext) -> dict[str, Any]:
        _write(Path(ctx.output_path))
        return {"n": 1}

    return StepSpec(
        name=name,
        version=version,
        deps=(),
        fingerprint=fingerprint,
        fingerprint_payload=payload,
        provenance={},
        run=run,
        build_config=lambda ctx: {},
    )


def _assert_safe(text: str) -> None:
    assert not UNSAFE.search(text), repr(UNSAFE.search(text))


def test_markup_names_render_literally_in_plan_run_summary_and_ls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = str(tmp_path / "p")
    specs = [_spec(name) for name in MARKUP_NAMES]
    location = open_prefix(prefix)
    for color in (False, True):
        table = plan_table(plan_run(Graph.of(specs), location, RunOptions()), location, color=color)
        plain = re.sub(r"\x1b\[[0-9;]*m", "", table)
        for name in MARKUP_NAMES:
            assert f"{name}@v0" in plain

    observer = RunObserver(location, live=False)
    report = StepRunner(prefix=prefix, listener=observer).run(specs)
    summary = render_summary(observer, specs, report, color=False)
    for name in MARKUP_NAMES:
        assert f"{name}@v0" in summary

    assert main(["ls", "--prefix", prefix, "--no-size"]) == 0
    out = capsys.readouterr().out
    for name in MARKUP_NAMES:
        assert f"{name}@v0" in out


def _built(prefix: str) -> tuple[Path, Path]:
    """Two real steps: ``ok@v0`` built, ``bad@v0`` failed; their metadata folders."""

    def ok() -> int:
        return 1

    def bad() -> None:
        raise RuntimeError("boom")

    from marin.execution.lazy import run

    run(apply("ok", ok, version="v0"), prefix=prefix)
    with pytest.raises(StepFailedError):
        run(apply("bad", bad, version="v0"), prefix=prefix)
    return Path(prefix, record_path("ok/v0")), Path(prefix, status_path("bad/v0"))


def test_crafted_record_and_status_print_no_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = str(tmp_path / "p")
    record_file, status_file = _built(prefix)
    record = json.loads(record_file.read_text())
    # The name stays the step's: a record naming another step is foreign, not ok@v0's record
    # (issue 18; test_stored_state.py), and would not be shown as built at all.
    record["provenance"].update(user=HOSTILE, host=HOSTILE, argv=[HOSTILE], time=HOSTILE)
    record["config"] = {HOSTILE: HOSTILE}
    record["result"] = [HOSTILE, "\u009b2J"]
    record["artifact_type"] = HOSTILE
    record_file.write_text(json.dumps(record))
    status = json.loads(status_file.read_text())
    status.update(error=HOSTILE + "\nfake: line", holder=HOSTILE, traceback=HOSTILE)
    status_file.write_text(json.dumps(status))

    capsys.readouterr()
    for argv in (
        ["ls", "--prefix", prefix, "--no-size"],
        ["ls", "--prefix", prefix, "--json"],
        ["show", "ok@v0", "--prefix", prefix],
        ["show", "ok@v0", "--prefix", prefix, "--json"],
        ["show", "bad@v0", "--prefix", prefix],
    ):
        main(argv)
        captured = capsys.readouterr()
        _assert_safe(captured.out)
        _assert_safe(captured.err)
        assert "\\x1b" in captured.out or "\\u001b" in captured.out, argv
        if "--json" in argv:
            json.loads(captured.out)  # still valid JSON, with the escapes as JSON escapes
    main(["show", "bad@v0", "--prefix", prefix])
    shown = capsys.readouterr().out
    assert not any(line.startswith("fake: line") for line in shown.splitlines())
    assert "[/red][bold]" in shown  # markup printed as text, not interpreted


def test_graph_output_escapes_names() -> None:
    from marin.graph_view import FORMATS, render_graph

    up = _spec("up\x9b31m\u202e[/red]")
    down = dataclasses.replace(_spec("down"), deps=(up,))
    for fmt in FORMATS:
        text = render_graph([up, down], fmt)
        _assert_safe(text)
        assert "[/red]" in text


def test_live_display_and_log_lines_escape(tmp_path: Path) -> None:
    import io
    import logging

    from rich.console import Console

    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=200)
    location = open_prefix(str(tmp_path / "p"))
    started, release = threading.Event(), threading.Event()

    def slow(ctx: StepContext) -> None:
        started.set()
        assert release.wait(30)

    spec = _spec("live[/red]")
    spec = dataclasses.replace(spec, run=slow)
    observer = RunObserver(location, live=True, console=console)
    result: dict[str, Any] = {}
    with observer:
        thread = threading.Thread(
            target=lambda: result.update(
                r=StepRunner(prefix=location.url, listener=observer).run([spec])
            )
        )
        thread.start()
        assert started.wait(30)
        observer._echo(HOSTILE + "\n")
        logging.getLogger("marin").warning("step %s said %s", "x[/red]", HOSTILE)
        rendered = Console(file=io.StringIO(), width=200, force_terminal=False)
        with rendered.capture() as capture:
            rendered.print(observer)
        assert "live[/red]@v0" in capture.get()
        release.set()
        thread.join(30)
    text = stream.getvalue()
    # rich's own cursor movements and colours are fine; the hostile OSC/CSI payloads are not.
    assert "\x1b]0;pwned" not in text and "\x9b" not in text and "\u202e" not in text
    assert "\\x1b]0;pwned" in text


def test_plain_log_handler_escapes(capfd: pytest.CaptureFixture[str]) -> None:
    import logging

    from marin import terminal_log

    terminal_log.configure(False)
    logging.getLogger("marin").warning("a %s b", HOSTILE)
    err = capfd.readouterr().err
    _assert_safe(err)
    assert "\\x1b]0;pwned" in err


def test_safe_text_and_safe_json() -> None:
    assert safe_text("sweep[lr=0.1]@v0") == "sweep[lr=0.1]@v0"
    assert safe_text("a\x1bb\u202ec\nd") == "a\\x1bb\\u202ec\\x0ad"
    assert safe_text("a\nb", keep_newlines=True) == "a\nb"
    assert safe_text("\ud800") == "\\ud800"
    text = json.dumps({"k": "\x9b\u202e\U000e0001x"}, ensure_ascii=False)
    assert json.loads(safe_json(text)) == {"k": "\x9b\u202e\U000e0001x"}
    _assert_safe(safe_json(text))
