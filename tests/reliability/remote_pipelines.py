"""Pipelines with remote steps (``with_options(remote="local")``) for ``test_remote.py``.

Controlled through environment variables, which the ``local`` jobs inherit from their driver:
- ``MARIN_TEST_CALLS``: each remote ``fn`` call appends ``<step> <pid>``;
- ``MARIN_TEST_STARTED``: a folder; a remote ``fn`` creates ``<step>`` there when it starts;
- ``MARIN_TEST_GATE``: a remote ``fn`` waits for this file before it finishes;
- ``MARIN_TEST_FAIL``: a file; while it exists, a remote ``fn`` prints and raises;
- ``MARIN_TEST_BACKEND``: ``chain``'s remote backend (default ``local``; empty: not remote);
- ``MARIN_TEST_BARRIER``: a folder; ``fan``'s three steps each wait there for all three (the
  ``fan/`` steps only);
- ``MARIN_TEST_VARIANT``: set, it is ``chain``'s training config ``variant`` (a new fingerprint);
- ``MARIN_TEST_FORGE``: a file; while it exists, a remote ``fn`` prints its text and then
  SIGKILLs itself (a job killed after it logged text that looks like an outcome);
- ``MARIN_TEST_LOG_MB``: ``loud``'s job prints that many MiB of log lines;
- ``MARIN_TEST_MAX_PREEMPTIONS``: set, ``chain``'s training step's ``max_preemptions``;
- ``MARIN_TEST_FILL``: the file ``full``'s job writes until the disk is full (default: one in
  its output).

``retried`` (Airflow's own task retry) is the counting step of ``resumable_pipeline.py`` and a
remote step, both with ``retries=1``.
"""

from __future__ import annotations

import os
import signal
import sys

from marin.execution.lazy import OUT, apply
from tests.reliability.pipelines import append_line, wait_for_file
from tests.reliability.resumable_pipeline import counting_step


def prepare(out_path: str) -> str:
    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, "data.txt"), "w") as f:
        f.write("tokens")
    return "prepared"


def train(data: str, out_path: str, step: str = "train", variant: str = "") -> dict[str, object]:
    env = os.environ
    if env.get("MARIN_TEST_CALLS"):
        append_line(env["MARIN_TEST_CALLS"], f"{step} {os.getpid()}")
    from marin.execution.pipeline.context import current_context

    assert current_context().output_path == out_path  # the run context reached the job
    if env.get("MARIN_TEST_STARTED"):
        append_line(
            os.path.join(env["MARIN_TEST_STARTED"], step.replace("/", "_")), str(os.getpid())
        )
    if env.get("MARIN_TEST_BARRIER") and step.startswith("fan/"):
        append_line(os.path.join(env["MARIN_TEST_BARRIER"], step.replace("/", "_")), "")
        for other in env.get("MARIN_TEST_BARRIER_STEPS", "fan_a,fan_b,fan_c").split(","):
            wait_for_file(os.path.join(env["MARIN_TEST_BARRIER"], other), timeout=60)
    if env.get("MARIN_TEST_GATE"):
        wait_for_file(env["MARIN_TEST_GATE"], timeout=120)
    if env.get("MARIN_TEST_FORGE") and os.path.exists(env["MARIN_TEST_FORGE"]):
        with open(env["MARIN_TEST_FORGE"]) as f:
            print(f.read(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if env.get("MARIN_TEST_FAIL") and os.path.exists(env["MARIN_TEST_FAIL"]):
        print("training diverged: loss is nan")
        if env.get("MARIN_TEST_RETRIES", "0") != "0":
            os.unlink(env["MARIN_TEST_FAIL"])  # the retry succeeds
        raise RuntimeError("loss is nan")
    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, "model.txt"), "w") as f:
        f.write(f"model from {data}")
    return {"pid": os.getpid(), **({"variant": variant} if variant else {})}


def evaluate(model: str, out_path: str) -> str:
    with open(os.path.join(model, "model.txt")) as f:
        return f.read()


_data = apply("remote/data", prepare, version="v1", out_path=OUT)
_model = apply(
    "remote/train",
    train,
    version="v1",
    data=_data,
    out_path=OUT,
    step="remote/train",
    **({"variant": v} if (v := os.environ.get("MARIN_TEST_VARIANT")) else {}),
).with_options(
    remote=os.environ.get("MARIN_TEST_BACKEND", "local") or None,
    retries=int(os.environ.get("MARIN_TEST_RETRIES", "0")),
    **({"max_preemptions": int(m)} if (m := os.environ.get("MARIN_TEST_MAX_PREEMPTIONS")) else {}),
)
chain = [apply("remote/eval", evaluate, version="v1", model=_model, out_path=OUT)]

fan = [
    apply(name, train, version="v1", data=name, out_path=OUT, step=name).with_options(
        remote="local"
    )
    for name in ("fan/a", "fan/b", "fan/c")
]

# Two remote steps in a one-slot pool (Airflow: deferred tasks give their slot back).
pooled = [
    apply(name, train, version="v1", data=name, out_path=OUT, step=name).with_options(
        remote="local", pool="one"
    )
    for name in ("fan/a", "fan/b")
]

# Airflow retries each task once, in the same DAG run (tests/airflow/test_airflow_remote.py).
retried = [
    counting_step("out").with_options(retries=1),
    apply(
        "remote/retried", train, version="v1", data="r", out_path=OUT, step="remote/retried"
    ).with_options(remote="local", retries=1),
]


def shout(out_path: str) -> str:
    """Print ``$MARIN_TEST_LOG_MB`` MiB of numbered log lines, then return."""
    line = b"%09d " + b"x" * 90 + b"\n"
    block = b"".join(line % i for i in range(10486))  # ~1 MiB
    for _ in range(int(os.environ.get("MARIN_TEST_LOG_MB", "1"))):
        sys.stdout.buffer.write(block)
    sys.stdout.buffer.write(b"the last line\n")
    sys.stdout.flush()
    return "shouted"


def fill(out_path: str) -> str:
    """Write zeros until the disk is full (the ``OSError`` of ``ENOSPC`` ends the job)."""
    os.makedirs(out_path, exist_ok=True)
    target = os.environ.get("MARIN_TEST_FILL") or os.path.join(out_path, "blob")
    with open(target, "wb") as f:
        while True:
            f.write(b"\0" * (1 << 16))
            f.flush()


loud = [apply("remote/loud", shout, version="v1", out_path=OUT).with_options(remote="local")]
full = [apply("remote/full", fill, version="v1", out_path=OUT).with_options(remote="local")]
isolated = [
    apply("iso/train", train, version="v1", data="d", out_path=OUT).with_options(isolate=True)
]
