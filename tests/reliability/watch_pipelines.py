"""A remote step whose job prints while it runs, for ``test_watch.py`` (issue 55).

``MARIN_TEST_BACKEND`` picks the backend (default ``local``). The job prints ``tick 0``, a line
with a terminal escape sequence, then waits for ``$MARIN_TEST_GATE`` (while printing a tick each
0.2 s), prints ``done ticking`` and returns; ``MARIN_TEST_FAIL`` set makes it raise instead.
``MARIN_TEST_VERSION`` (default v1) versions the job's step and its reader; ``watch/prep``
stands apart (served once built). ``deferred`` is the same pipeline with ``version=None``: the
run's ``--version`` names the version, as the README shows. ``long_line``'s job prints a
line, a 3 MB line and a line, then waits for the gate in silence.
"""

from __future__ import annotations

import os
import time

from marin.execution.lazy import OUT, ArtifactStep, apply


def ticker(out_path: str) -> str:
    print("tick 0", flush=True)
    print("colour \x1b[31mred\x1b[0m and a bell \x07", flush=True)
    gate, n = os.environ.get("MARIN_TEST_GATE", ""), 1
    while gate and not os.path.exists(gate) and n < 1500:  # at most 5 minutes, left alone
        time.sleep(0.2)
        print(f"tick {n}", flush=True)
        n += 1
    print("done ticking", flush=True)
    if os.environ.get("MARIN_TEST_FAIL"):
        raise RuntimeError("told to fail")
    os.makedirs(out_path, exist_ok=True)
    return "ticked"


def long_liner(out_path: str) -> str:
    print("before the long line", flush=True)
    print("x" * 3_000_000, flush=True)
    print("after the long line", flush=True)
    gate, waited = os.environ.get("MARIN_TEST_GATE", ""), 0
    while gate and not os.path.exists(gate) and waited < 1500:  # at most 5 minutes
        time.sleep(0.2)
        waited += 1
    os.makedirs(out_path, exist_ok=True)
    return "printed"


def summarize(model: str) -> str:
    return f"read {model}"


def prepare() -> str:
    return "prepared"


def _pipeline(version: str | None) -> list[ArtifactStep]:
    train = apply("watch/train", ticker, version=version, out_path=OUT).with_options(
        remote=os.environ.get("MARIN_TEST_BACKEND", "local")
    )
    return [
        apply("watch/prep", prepare, version="v1"),
        apply("watch/report", summarize, version=version, model=train),
    ]


pipeline = _pipeline(os.environ.get("MARIN_TEST_VERSION", "v1"))
deferred = _pipeline(None)
long_line = [
    apply("watch/long", long_liner, version="v1", out_path=OUT).with_options(
        remote=os.environ.get("MARIN_TEST_BACKEND", "local")
    )
]
