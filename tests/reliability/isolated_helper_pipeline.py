"""An isolated step whose ``fn`` starts a helper process (as a data loader or an async writer
does), for ``test_isolated_helpers.py``. ``MARIN_TEST_HELPER_PID``: the file ``fn`` writes the
helper's pid to; ``fn`` then waits for ``MARIN_TEST_GATE`` (the test kills the driver first)."""

from __future__ import annotations

import os
import subprocess
import sys

from marin.execution.lazy import OUT, apply
from tests.reliability.pipelines import append_line, wait_for_file


def load(out_path: str) -> str:
    helper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    append_line(os.environ["MARIN_TEST_HELPER_PID"], str(helper.pid))
    wait_for_file(os.environ["MARIN_TEST_GATE"], timeout=120)
    return "loaded"


loader = apply("iso/loader", load, version="v1", out_path=OUT).with_options(isolate=True)
