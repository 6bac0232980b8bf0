"""Steps whose job starts a helper process, as a data loader does (same process group, no
session of its own), for ``test_job_group.py``. Controlled through the environment:
- ``MARIN_TEST_LEAK_DIR``: a rank's first attempt writes ``attempt-K``, starts a helper that
  writes ``helper-<pid>`` and then keeps appending to the step's output, appends ``K <pid>`` to
  ``ready`` and waits (forever, or until every rank is ready and then raises, for
  ``MARIN_TEST_LEAK=raise``); a later attempt appends the helpers still alive to ``seen``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from marin.execution.lazy import OUT, apply
from marin.execution.pipeline.context import current_context
from marin.execution.remote.procs import start_time
from tests.reliability.pipelines import append_line, wait_for_file

_HELPER = """import os, sys, time
open(os.path.join(sys.argv[1], f"helper-{os.getpid()}"), "w").close()
while True:
    try:  # the output may be cleared for the next attempt: keep going, as a loader would
        with open(os.path.join(sys.argv[2], "helper.log"), "a") as f:
            f.write(f"{os.getpid()}\\n")
    except OSError:
        pass
    time.sleep(0.05)
"""


def _lines(path: str) -> list[str]:
    return open(path).read().splitlines() if os.path.exists(path) else []


def leaky(out_path: str) -> dict[str, int]:
    """See the module docstring."""
    folder, ctx = os.environ["MARIN_TEST_LEAK_DIR"], current_context()
    marker = os.path.join(folder, f"attempt-{ctx.rank}")
    if os.path.exists(marker):
        helpers = [n.split("-")[1] for n in os.listdir(folder) if n.startswith("helper-")]
        alive = [pid for pid in helpers if start_time(int(pid)) is not None]
        append_line(os.path.join(folder, "seen"), " ".join(alive) or "none")
        return {"rank": ctx.rank}
    append_line(marker, str(os.getpid()))
    os.makedirs(out_path, exist_ok=True)
    helper = subprocess.Popen([sys.executable, "-c", _HELPER, folder, out_path])
    wait_for_file(os.path.join(folder, f"helper-{helper.pid}"))
    append_line(os.path.join(folder, "ready"), f"{ctx.rank} {os.getpid()}")
    if os.environ.get("MARIN_TEST_LEAK") == "raise" and ctx.rank == ctx.world_size - 1:
        while len(_lines(os.path.join(folder, "ready"))) < ctx.world_size:
            time.sleep(0.01)  # every rank started its helper
        raise RuntimeError("the last rank failed")
    wait_for_file(os.path.join(folder, "never"), timeout=600)
    return {"rank": ctx.rank}


plain = [apply("leak/plain", leaky, version="v1", out_path=OUT).with_options(remote="local")]
gang = [apply("leak/gang", leaky, version="v1", out_path=OUT).with_options(remote="local", ranks=2)]
