"""A history as a runnable Python script: how a failure is reported.

Executing a history also writes, operation by operation, the lines that do the same by hand:
the pipeline file and each edit of it, every ``marin`` command with its environment, the
planted files, the killed drivers. The checks that failed become the script's last lines, which
compare the prefix with a clean build of the final pipeline and exit 1 naming the broken
promise. The script needs only the project's Python (``marin`` importable).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from tests.oracle import gangs, sweep
from tests.oracle.pipeline import PipelineModel, render

SWEEP = "\n\n".join(inspect.getsource(f) for f in (sweep.run_sweep, gangs.gone, gangs.wait_holder))

PRELUDE = r'''"""Reproduces a history that tests/oracle found failing (run: python THIS_FILE).

It writes a generated pipeline, runs the same marin commands in order (edits between them),
then checks what failed; exit 1 names the broken promise.
"""
import atexit
import contextlib
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = tempfile.mkdtemp(prefix="marin-repro-")
PREFIX, CONTROL, JOBS, MARKERS = (os.path.join(ROOT, d) for d in ("prefix", "control", "jobs", "markers"))
for d in (PREFIX, CONTROL, JOBS, MARKERS, os.path.join(ROOT, "pipe")):
    os.makedirs(d, exist_ok=True)
PIPE = os.path.join(ROOT, "pipe", "repro.py")
TARGET = PIPE + ":pipeline"
TEAMMATE = PIPE + ":teammate"
FEEDER = PIPE + ":feeder"
OUTSIDE = os.path.join(ROOT, "outside")
IN_PLACE = []
COUNTER = os.path.join(ROOT, "counter.jsonl")
FAILED = []


def write(text):
    with open(PIPE + ".tmp", "w") as f:
        f.write(text)
    os.replace(PIPE + ".tmp", PIPE)


def set_step(i, block):
    """Replace step s<i>'s block of the pipeline file (an edit of its config or code)."""
    with open(PIPE) as f:
        text = f.read()
    start, end = "# --- s%d ---\n" % i, "# --- end s%d ---\n" % i
    a, b = text.index(start) + len(start), text.index(end)
    write(text[:a] + block + text[b:])


def env(user, run, **extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MARIN_", "ORACLE_"))}
    e.update(MARIN_USER=user, ORACLE_CONTROL=CONTROL, ORACLE_COUNTER=COUNTER, ORACLE_RUN=run,
             MARIN_LOCAL_JOBS=JOBS, ORACLE_OUTSIDE=OUTSIDE, **extra)
    return e


def put_data(where, files):
    """Write an adoption's data by hand: exactly ``files`` (relative path -> bytes)."""
    for rel in tree(where):
        if rel not in files:
            os.remove(os.path.join(where, rel))
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(where, rel)), exist_ok=True)
        with open(os.path.join(where, rel), "wb") as f:
            f.write(data)
    rel = os.path.relpath(where, PREFIX)
    if not rel.startswith("..") and rel not in IN_PLACE:
        IN_PLACE.append(rel)


def start(*args, user="alice", run="r", **extra):
    print("$ MARIN_USER=%s marin %s" % (user, " ".join(args)), flush=True)
    return subprocess.Popen([sys.executable, "-m", "marin.cli", *args, "--prefix", PREFIX],
                            env=env(user, run, **extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(p, timeout=30):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        print("  -> still running after %ss: killed" % timeout)
        return None
    print("  -> exit %s %s" % (p.returncode, err.strip().splitlines()[-1:]))
    return p


def marin(*args, user="alice", run="r", timeout=30, **extra):
    return finish(start(*args, user=user, run=run, **extra), timeout)


def wait_for(path, proc, timeout=60):
    deadline = time.time() + timeout
    while not os.path.exists(path) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    return os.path.exists(path)


def hold(step, token):
    with open(os.path.join(CONTROL, "hold-" + step), "w") as f:
        f.write(token)


def release(token):
    open(os.path.join(CONTROL, "release-" + token), "w").close()


def started_pid(token):
    with open(os.path.join(CONTROL, "started-" + token)) as f:
        return int(f.read())


DECOYS = []


def decoy():
    DECOYS.append(subprocess.Popen(["sleep", "600"], start_new_session=True))
    return DECOYS[-1]


@atexit.register
def _end_decoys():
    for p in DECOYS:
        p.kill()


class Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def plant_job(meta, job_id, workdir, fingerprint, pid=None, marker=None, recipe=None):
    """A foreign job.json (today's fields; ``recipe``: placement, inputs and code copied from
    the plan and the records) in a step's metadata folder, and its job folder in workdir (or
    $MARIN_LOCAL_JOBS when workdir is None)."""
    os.makedirs(meta, exist_ok=True)
    data = {"workdir": workdir} if workdir else {}
    job = {"job_id": job_id, "backend": "local", "build_id": "planted",
           "submitted_at": "2026-01-01T00:00:00Z", "fingerprint": fingerprint,
           "placement": "", "inputs": {}, "data": data}
    job.update({k: v for k, v in (recipe or {}).items() if v})
    with open(os.path.join(meta, "job.json"), "w") as f:
        json.dump(job, f)
    folder = os.path.join(workdir or JOBS, job_id)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "keep.txt"), "w") as f:
        f.write("planted")
    if pid is not None:
        with open("/proc/%d/stat" % pid) as f:
            started = f.read().rsplit(")", 1)[1].split()[19]
        with open(os.path.join(folder, "pid.json"), "w") as f:
            json.dump({"pid": pid, "start_time": started}, f)
    if marker is not None:
        payload = {"ok": True, "result": pickle.dumps({"planted": True}), "x": Marker(marker)}
        with open(os.path.join(folder, "result.pkl"), "wb") as f:
            pickle.dump(payload, f)


def tree(path):
    out = {}
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()[:12]
    return out


def stored(rel):
    try:
        with open(os.path.join(PREFIX, rel + ".marin", "record.json")) as f:
            result = json.load(f).get("result")
    except (OSError, ValueError):
        result = "<no record>"
    return tree(os.path.join(PREFIX, rel)), result


def clean_build():
    """A clean build of the pipeline as it is now, on an empty prefix: its file without the
    options that are placement, not identity (remote, resumable, scope), at version v1."""
    import re

    with open(PIPE) as f:
        text = f.read()
    text = re.sub(r"^s\d+ = s\d+\.with_options\(.*\)\n", "", text, flags=re.M)
    text = re.sub(r'version=(DEFER|"[^"]*")', 'version="v1"', text)
    root = tempfile.mkdtemp(prefix="marin-clean-")
    with open(os.path.join(root, "clean.py"), "w") as f:
        f.write(text)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MARIN_", "ORACLE_"))}
    e["ORACLE_OUTSIDE"] = OUTSIDE  # adopted data, as it is now (in place: copied)
    for rel in IN_PLACE:
        shutil.copytree(os.path.join(PREFIX, rel), os.path.join(root, "p", rel))
    for target in (["feeder"] if "\nfeeder = [" in text else []) + ["pipeline"]:
        subprocess.run([sys.executable, "-m", "marin.cli", "run", root + "/clean.py:" + target,
                        "--prefix", root + "/p"], env=e, capture_output=True, check=True)
    return root + "/p"


def expect(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what)
    if not ok:
        FAILED.append(what)


def expect_clean(clean, name, rel):
    got, want = stored(rel), stored_at(clean, name + "/v1")
    expect(got == want, "%s (at %s) is byte for byte a clean build: stored %s, clean %s"
           % (name, rel, got, want))


def stored_at(prefix, rel):
    with open(os.path.join(prefix, rel + ".marin", "record.json")) as f:
        return tree(os.path.join(prefix, rel)), json.load(f).get("result")


def data_k(rel):
    """The config ``k`` the output at ``rel`` was built with."""
    with open(os.path.join(PREFIX, rel, "data.txt")) as f:
        return json.load(f)["k"]


def stream(idx, wanted, step, user="alice", on_drift="warn", on_code_drift="warn", codex=None):
    """A sweep in this process: StepRunner.run over a generator (run_sweep, below)."""
    import importlib.util

    print("# stream: the targets, then o/s%d at %s" % (idx, wanted))
    os.environ.update(env(user, "stream"))
    spec = importlib.util.spec_from_file_location("repro_pipeline", PIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["repro_pipeline"] = module
    spec.loader.exec_module(module)
    try:
        run_sweep(module, PREFIX, idx, wanted, step, on_drift, on_code_drift, codex)
        print("  -> the sweep ran")
    except Exception as exc:
        print("  -> refused or failed: %s" % str(exc).splitlines()[0])


def ran(run):
    with open(COUNTER) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    keys = [(x["step"], x["recipe"]) for x in lines if x["run"] == run]
    return max([keys.count(k) for k in keys] or [0])


'''


@dataclass
class Script:
    """The lines that reproduce one history, built while it runs."""

    model: PipelineModel
    lines: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    _n: int = 0

    def var(self, stem: str) -> str:
        self._n += 1
        return f"{stem}{self._n}"

    def emit(self, *lines: str) -> None:
        self.lines.extend(lines)

    def comment(self, text: str) -> None:
        self.lines.append(f"# {text}")

    def rewrite(self, new: PipelineModel) -> None:
        """The whole file anew (an adoption turned into a built step, the feeder edited)."""
        self.lines.append(f"write(r'''{render(new)}''')")

    def edit(self, new: PipelineModel, idx: int) -> None:
        block = step_block(new, idx)
        self.lines.append(f"set_step({idx}, r'''{block}''')")

    def check(self, line: str) -> None:
        if line not in self.checks:
            self.checks.append(line)

    def render(self) -> str:
        body = [
            f"write(r'''{render(self.model)}''')",
            *self.lines,
            "",
            "# The checks that failed:",
            "CLEAN = clean_build()" if any("CLEAN" in c for c in self.checks) else "",
            *dict.fromkeys(self.checks),
            'sys.exit("broken: " + "; ".join(FAILED) if FAILED else 0)',
        ]
        return PRELUDE + SWEEP + "\n\n" + "\n".join(body) + "\n"


def step_block(model: PipelineModel, idx: int) -> str:
    """The text between ``# --- s<idx> ---`` and ``# --- end s<idx> ---`` in the file."""
    text = render(model)
    start, end = f"# --- s{idx} ---\n", f"# --- end s{idx} ---\n"
    a, b = text.index(start) + len(start), text.index(end)
    return text[a:b]
