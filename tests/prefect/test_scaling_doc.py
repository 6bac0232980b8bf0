"""docs/scaling.md's by-hand Prefect-on-Dask commands, run as the user would paste them.

The block is taken from the doc as written, with only its ports and its scratch folder moved
(so that it cannot meet another server on this machine), and run by bash from the checkout. It
starts moto's S3 server, a Prefect server, a Dask scheduler and two workers, runs the flow, and
lists who built what. The test then checks what the doc promises: every step built once, the
GPU steps on the ``gpu`` worker, and a second run of the flow line serving everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("prefect_dask")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scaling.md"
HEADING = "By hand, from the checkout (each `&` line could be its own terminal):"
DOC_PORTS = (9000, 4200, 8786)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def doc_block() -> str:
    """The bash block right after the Dask section's by-hand heading."""
    text = DOC.read_text()
    start = text.index(HEADING)
    match = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert match is not None, "docs/scaling.md: the by-hand Dask block is gone"
    return match.group(1)


def relocated(block: str, scratch: Path) -> str:
    for port in DOC_PORTS:
        assert f"127.0.0.1:{port}" in block, port
        new = _free_port()
        block = block.replace(f"127.0.0.1:{port}", f"127.0.0.1:{new}")
        block = block.replace(f"--port {port}", f"--port {new}")
        block = block.replace(f"-p {port} ", f"-p {new} ")
        assert re.search(rf"\b{port}\b", block) is None, f"port {port} is still in the block"
    return block.replace("/tmp/dk", str(scratch))


@pytest.fixture
def session(tmp_path: Path) -> tuple[str, Path, dict[str, str]]:
    """The relocated block, its scratch folder, and a user's environment (own HOME, TMPDIR)."""
    scratch = tmp_path / "dk"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MARIN_"))}
    env.update(HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path))
    (tmp_path / "home").mkdir()
    return relocated(doc_block(), scratch), scratch, env


def test_the_by_hand_dask_commands_of_docs_scaling_work(
    session: tuple[str, Path, dict[str, str]], tmp_path: Path
) -> None:
    block, scratch, env = session
    # The flow line, once more at the end: the doc says a second run serves every step.
    flow = re.search(r"python -c '\n.*?\(\)'\n", block, re.S)
    assert flow is not None, "the block's `python -c` flow line is gone"
    lines = block.splitlines()
    ls_line = next(line for line in lines if line.startswith("marin ls"))
    ls_json = ls_line.split("#")[0].replace("--where", "--json")
    script = f"set -euo pipefail\n{block}\n{ls_json} > {tmp_path}/first.json\n{flow.group(0)}"
    script += f"{ls_json} > {tmp_path}/second.json\n"
    log = tmp_path / "session.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", script], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=420)
        finally:
            # Every server the block started with `&` is in the session's process group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    output = log.read_text(errors="replace")
    assert rc == 0, output[-5000:]
    assert "--where" in ls_line, "the doc's listing no longer shows who built what"

    first = json.loads((tmp_path / "first.json").read_text())["artifacts"]
    second = json.loads((tmp_path / "second.json").read_text())["artifacts"]
    assert len(first) == 8, [a["step"] for a in first]
    # Who built what, from the events the test pipeline notes (one start per step: built once).
    events = (scratch / "events.txt").read_text().splitlines()
    starts = [e.split() for e in events if e.startswith("start ")]
    workers = {name: worker for _, name, worker, _ in starts}
    assert len(starts) == len(workers) == 8, starts
    assert {workers["dask/train-0@v1"], workers["dask/train-1@v1"]} == {"gpu"}, workers
    assert set(workers.values()) == {"cpu", "gpu"}, workers
    # The second flow run served everything: the same records, and no step started again.
    assert second == first
