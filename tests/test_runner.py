"""StepRunner on real file systems (local disk and memory://)."""

from __future__ import annotations

import contextvars
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin.execution.errors import (
    ConfigError,
    DriftError,
    InvalidStepError,
    PipelineFailedError,
    StepFailedError,
    StorageError,
)
from marin.execution.lazy import OUT, ArtifactStep, apply, lower, resolve, run
from marin.execution.plan.options import RunOptions
from marin.execution.step_runner import READY_ORDERS, StepRunner
from marin.execution.store.lease import Lease
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record, read_status


def write(out_path: str, value: Any = None, deps: Any = ()) -> dict[str, Any]:
    with fsspec.open(out_path, "w", auto_mkdir=True) as f:
        f.write(json.dumps(value))
    return {"value": value}


class Log:
    """Thread-safe record of which steps ran, in what order, how many at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.order: list[str] = []
        self.running = 0
        self.peak = 0

    def step(self, name: str, sleep: float = 0.0) -> Any:
        def fn(deps: Any, out_path: str) -> str:
            with self.lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
            time.sleep(sleep)
            for dep in deps:
                fs, path = fsspec.core.url_to_fs(dep)
                assert fs.exists(path), f"{name} ran before {dep}"
            with fsspec.open(out_path, "w", auto_mkdir=True) as f:
                f.write(name)
            with self.lock:
                self.order.append(name)
                self.running -= 1
            return name

        fn.__qualname__ = f"step_{name}"
        return fn


def dag(log: Log, edges: dict[int, list[int]], sleep: float = 0.0) -> list[ArtifactStep]:
    handles: dict[int, ArtifactStep] = {}
    for node in sorted(edges):
        deps = [handles[d] for d in edges[node]]
        handles[node] = apply(
            f"n/{node}", log.step(str(node), sleep), version="v0", deps=deps, out_path=OUT
        )
    return [handles[n] for n in sorted(edges)]


@st.composite
def random_dags(draw: Any) -> dict[int, list[int]]:
    n = draw(st.integers(1, 25))
    return {
        i: sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3)))) if i else []
        for i in range(n)
    }


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(edges=random_dags(), max_concurrent=st.integers(1, 6))
def test_random_dags_run_each_step_once_after_its_deps(
    tmp_path_factory: Any, edges: dict[int, list[int]], max_concurrent: int
) -> None:
    prefix = str(tmp_path_factory.mktemp("dag"))
    log = Log()
    handles = dag(log, edges)
    run(*handles, prefix=prefix, max_concurrent=max_concurrent)
    assert sorted(log.order, key=int) == [str(n) for n in sorted(edges)]
    position = {name: i for i, name in enumerate(log.order)}
    for node, deps in edges.items():
        assert all(position[str(d)] < position[str(node)] for d in deps)
    assert log.peak <= max_concurrent


def test_chain_diamond_and_concurrency_limit(prefix: str) -> None:
    log = Log()
    edges = {0: [], **{i: [0] for i in range(1, 9)}, 9: list(range(1, 9))}
    handles = dag(log, edges, sleep=0.15)
    run(handles[-1], prefix=prefix, max_concurrent=4)
    assert log.order[0] == "0" and log.order[-1] == "9"
    assert log.peak == 4


def test_skip_on_rerun_keeps_files_untouched(tmp_path: Any) -> None:
    log = Log()
    handles = dag(log, {0: [], 1: [0], 2: [1]})
    prefix = str(tmp_path)
    run(handles[-1], prefix=prefix)
    files = [os.path.join(root, f) for root, _, fs in os.walk(prefix) for f in fs]
    mtimes = {f: os.stat(f).st_mtime_ns for f in files}
    time.sleep(0.01)
    artifacts = run(handles[-1], prefix=prefix)
    assert log.order == ["0", "1", "2"]
    assert {f: os.stat(f).st_mtime_ns for f in files} == mtimes
    assert artifacts[0].result == "2"


def test_built_targets_prune_their_subtrees(prefix: str) -> None:
    log = Log()
    handles = dag(log, {0: [], 1: [0], 2: [1]})
    run(handles[-1], prefix=prefix)
    # Remove the middle step's record: it is needed only by a built step, so it is pruned.
    location = open_prefix(prefix)
    location.fs.rm(location.path("n/1/v0.marin/record.json"))
    # Its output too: a record deleted by hand leaves nothing that proves the output Marin's
    # (red team r17-2), so a build would refuse to clear it.
    location.remove_tree(location.path("n/1/v0"))
    report = StepRunner(prefix=prefix).run(lower(handles[-1]))
    assert log.order == ["0", "1", "2"]
    assert sorted(report.pruned) == ["n/1/v0"] and sorted(report.skipped) == ["n/0/v0", "n/2/v0"]
    # Asking for the middle step itself does rebuild it ...
    run(handles[1], prefix=prefix)
    assert log.order == ["0", "1", "2", "1"]
    plan, _ = StepRunner(prefix=prefix).plan(lower(handles[-1]))
    decision = plan.of(lower(handles[-1]))
    run(handles[-1], prefix=prefix)
    # ... and then the step made from its old build is stale, and rebuilt: the bytes it read
    # can no longer be proven to be the ones rebuilt (the record that claimed them was gone, so
    # the rebuild had nothing to check them against): no early cutoff (issue 43).
    assert decision.stale == ("upstream n/1@v0 was rebuilt after this step",)
    assert log.order == ["0", "1", "2", "1", "2"]


def test_shared_dependency_built_exactly_once(prefix: str) -> None:
    log = Log()
    dataset = apply("dataset", log.step("dataset"), version="v1", deps=[], out_path=OUT)
    model_a = apply("model_a", log.step("a"), version="v0", deps=[dataset], out_path=OUT)
    model_b = apply("model_b", log.step("b"), version="v0", deps=[dataset], out_path=OUT)
    artifacts = run(model_a, model_b, prefix=prefix)
    assert log.order.count("dataset") == 1 and sorted(log.order) == ["a", "b", "dataset"]
    assert [a.path() for a in artifacts] == [
        open_prefix(prefix).url_for("model_a/v0"),
        open_prefix(prefix).url_for("model_b/v0"),
    ]


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def test_steps_see_the_callers_context_variables(prefix: str) -> None:
    seen: list[str] = []

    def read_var(out_path: str) -> str:
        seen.append(REQUEST_ID.get())
        return REQUEST_ID.get()

    token = REQUEST_ID.set("req-42")
    try:
        run(
            *(apply(f"ctx/{i}", read_var, version="v0", out_path=OUT) for i in range(4)),
            prefix=prefix,
            max_concurrent=4,
        )
    finally:
        REQUEST_ID.reset(token)
    assert seen == ["req-42"] * 4


def boom(out_path: str) -> None:
    raise ValueError("bad data")


def test_fail_fast_names_the_step_and_chains_the_cause(prefix: str) -> None:
    log = Log()
    bad = apply("bad", boom, version="v0", out_path=OUT)
    after = apply("after", log.step("after"), version="v0", deps=[bad], out_path=OUT)
    with pytest.raises(StepFailedError, match=r"ValueError: bad data \(step bad@v0\).*log") as info:
        run(after, prefix=prefix)
    assert isinstance(info.value.__cause__, ValueError)
    assert log.order == []
    location = open_prefix(prefix)
    assert read_record(location, "bad/v0") is None
    status = read_status(location, "bad/v0")
    assert status is not None and status["state"] == "FAILED" and "bad data" in status["error"]


def test_keep_going_lists_every_failure(prefix: str) -> None:
    log = Log()
    bad1 = apply("bad1", boom, version="v0", out_path=OUT)
    bad2 = apply("bad2", boom, version="v0", out_path=OUT)
    blocked = apply("blocked", log.step("blocked"), version="v0", deps=[bad1], out_path=OUT)
    fine = apply("fine", log.step("fine"), version="v0", deps=[], out_path=OUT)
    with pytest.raises(
        PipelineFailedError, match=r"2 step\(s\) failed, 1 blocked.*bad1@v0.*bad2@v0"
    ) as info:
        run(blocked, bad2, fine, prefix=prefix, keep_going=True, max_concurrent=1)
    assert log.order == ["fine"]
    assert info.value.blocked == ["blocked@v0"]


def test_drift_policies(prefix: str, caplog: Any) -> None:
    log = Log()

    def model(lr: float) -> ArtifactStep:
        return apply("model", log.step("model"), version="v1", deps=[], out_path=OUT).__class__(
            name="model", version="v1", run=lambda config: log.order.append(f"lr={lr}"),
            build_config=lambda ctx: {"lr": lr, "out": ctx.output_path},
        )  # fmt: skip

    run(model(0.1), prefix=prefix)
    with caplog.at_level("WARNING", logger="marin"):
        artifact = run(model(0.2), prefix=prefix)[0]
    assert "config.lr: 0.1 -> 0.2" in caplog.text
    assert log.order == ["lr=0.1"] and artifact.record is not None
    with pytest.raises(DriftError, match=r"config.lr: 0.1 -> 0.2 \(step model@v1\)"):
        run(model(0.2), prefix=prefix, on_drift="error")
    assert log.order == ["lr=0.1"]
    run(model(0.2), prefix=prefix, on_drift="rebuild")
    assert log.order == ["lr=0.1", "lr=0.2"]
    record = read_record(open_prefix(prefix), "model/v1")
    assert record is not None and record.config["lr"] == 0.2


def test_dev_versions_rebuild_and_force_rebuilds(prefix: str) -> None:
    log = Log()
    dev = apply("exp", log.step("exp"), version="exp-dev", deps=[], out_path=OUT)
    fixed = apply("fixed", log.step("fixed"), version="v0", deps=[], out_path=OUT)
    run(dev, fixed, prefix=prefix)
    run(dev, fixed, prefix=prefix)
    assert log.order.count("exp") == 2 and log.order.count("fixed") == 1
    run(dev, fixed, prefix=prefix, force=["fixed"])
    assert log.order.count("fixed") == 2
    with pytest.raises(InvalidStepError, match="--force names no step.*nope"):
        run(fixed, prefix=prefix, force=["nope"])


def test_dry_run_builds_nothing(prefix: str) -> None:
    log = Log()
    report = StepRunner(prefix=prefix).run(lower(dag(log, {0: [], 1: [0]})[-1]), dry_run=True)
    assert sorted(report.to_build) == ["n/0/v0", "n/1/v0"] and log.order == []
    assert not open_prefix(prefix).fs.exists(open_prefix(prefix).path("n"))


def test_result_must_be_serialisable(prefix: str) -> None:
    step = apply("obj", lambda out_path: object(), version="v0", out_path=OUT)
    with pytest.raises(StepFailedError, match=r"no JSON form.*step obj@v0") as info:
        resolve(step, prefix=prefix)
    assert isinstance(info.value.__cause__, ConfigError)
    assert read_record(open_prefix(prefix), "obj/v0") is None


def test_corrupt_record_counts_as_not_built(prefix: str, caplog: Any) -> None:
    log = Log()
    step = apply("s", log.step("s"), version="v0", deps=[], out_path=OUT)
    resolve(step, prefix=prefix)
    location = open_prefix(prefix)
    location.fs.pipe_file(location.path("s/v0.marin/record.json"), b'{"schema": 1, "name": "s"')
    with caplog.at_level("WARNING", logger="marin"):
        # Torn, it names no build: no proof that the data beside it is Marin's (r20-1).
        with pytest.raises(StepFailedError, match="already exists and was not written by Marin"):
            resolve(step, prefix=prefix)
        location.remove_tree(location.path("s/v0"))
        resolve(step, prefix=prefix)
    assert "corrupt record" in caplog.text and log.order == ["s", "s"]


def test_bad_runner_arguments() -> None:
    with pytest.raises(InvalidStepError, match="max_concurrent=0.*>= 1"):
        StepRunner(RunOptions(max_concurrent=0))
    with pytest.raises(ValueError, match="on_drift='sometimes'"):
        StepRunner(RunOptions(on_drift="sometimes"))


def test_bad_prefixes(tmp_path: Any) -> None:
    step = apply("s", write, version="v0", out_path=OUT)
    with pytest.raises(StorageError, match="unknown storage protocol 'nosuch'"):
        resolve(step, prefix="nosuch://x")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        if os.access(readonly, os.W_OK):
            pytest.skip("running as a user that ignores permissions")
        with pytest.raises(StorageError, match="not writable|cannot be created"):
            resolve(step, prefix=str(readonly / "p"))
    finally:
        readonly.chmod(0o700)


def test_unwritable_prefix_as_root(tmp_path: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StorageError, match="cannot be created.*--prefix"):
        resolve(apply("s", write, version="v0", out_path=OUT), prefix=str(blocker / "p"))


def test_missing_backend_names_the_extra(monkeypatch: Any) -> None:
    import fsspec.core

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise ImportError("Install gcsfs to access Google Storage")

    monkeypatch.setattr(fsspec.core, "url_to_fs", missing)
    with pytest.raises(StorageError, match=r"marin-execution\[gcs\]"):
        open_prefix("gs://bucket/x")


CRASHING_PIPELINE = textwrap.dedent(
    """
    import os, sys, time
    from marin.execution.lazy import apply, run, OUT

    def slow(out_path):
        os.makedirs(out_path, exist_ok=True)
        with open(os.path.join(out_path, "partial.bin"), "w") as f:
            f.write("half")
        print("WRITING", flush=True)
        time.sleep(float(os.environ.get("SLEEP", "60")))
        with open(os.path.join(out_path, "done.bin"), "w") as f:
            f.write("done")
        return "ok"

    run(apply("crashy", slow, version="v0", out_path=OUT), prefix=sys.argv[1])
    """
)


def test_killed_mid_step_leaves_it_unbuilt_and_rebuildable(tmp_path: Any) -> None:
    script = tmp_path / "pipeline.py"
    script.write_text(CRASHING_PIPELINE)
    prefix = str(tmp_path / "prefix")
    env = {**os.environ, "MARIN_LEASE_TTL": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script), prefix], stdout=subprocess.PIPE, env=env, text=True
    )
    # The step's print, echoed labelled with its step.
    assert proc.stdout is not None and proc.stdout.readline().strip() == "crashy@v0 | WRITING"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    location = open_prefix(prefix)
    assert read_record(location, "crashy/v0") is None
    assert os.path.exists(os.path.join(prefix, "crashy/v0/partial.bin"))
    (tmp_path / "prefix/crashy/v0/debris.tmp").write_text("left by the crash")
    # Wait until the dead runner's lease has expired by the wall clock it records, rather than
    # guessing a sleep: the next run must see "expired", never "held by another runner".
    held = Lease(location, "crashy/v0").read()
    assert held is not None, "the killed runner held a lease"
    while not held.expired:
        time.sleep(max(held.expires_at - time.time(), 0.01))
    done = subprocess.run(
        [sys.executable, str(script), prefix],
        env={**env, "SLEEP": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert read_record(location, "crashy/v0") is not None
    assert sorted(os.listdir(os.path.join(prefix, "crashy/v0"))) == ["done.bin", "partial.bin"]
    assert "taking over expired lease" in done.stderr


def _built_results(prefix: str, specs: list[Any]) -> dict[str, Any]:
    location = open_prefix(prefix)
    results = {}
    for spec in specs:
        record = read_record(location, spec.output_path)
        assert record is not None, f"{spec.step_id} not built under {prefix}"
        with location.fs.open(location.path(spec.output_path), "r") as f:
            results[spec.step_id] = (record.result, f.read(), sorted(record.dep_paths))
    return results


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_priorities_do_not_change_results(tmp_path: Any, seed: int) -> None:
    """The order ready steps start in (the ready-order policy, and the order targets are given
    in, which breaks ties) changes the start order but never what gets built."""
    rng = random.Random(7)
    edges = {i: sorted(rng.sample(range(i), min(i, rng.randint(0, 3)))) for i in range(40)}
    baseline_log = Log()
    baseline = list(lower(dag(baseline_log, edges), memo={}))
    StepRunner(RunOptions(max_concurrent=1), prefix=str(tmp_path / "baseline")).run(baseline)
    expected = _built_results(str(tmp_path / "baseline"), baseline)

    shuffle = random.Random(seed)
    orders = []
    for ready_order in READY_ORDERS:
        log = Log()
        specs = list(lower(dag(log, edges), memo={}))
        shuffle.shuffle(specs)
        runner = StepRunner(RunOptions(max_concurrent=3), prefix=str(tmp_path / ready_order))
        runner.ready_order = ready_order
        runner.run(specs)
        assert sorted(log.order, key=int) == [str(i) for i in range(40)]  # each step once
        assert _built_results(str(tmp_path / ready_order), specs) == expected
        orders.append(log.order)
    assert baseline_log.order != orders[0] or baseline_log.order != orders[1], (
        "the priorities never changed the start order, so this test proved nothing"
    )


def test_durable_mode_fsyncs_outputs_and_record(tmp_path: Any, monkeypatch: Any) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def two_files(out_path: str) -> None:
        os.makedirs(out_path)
        for name in ("a.bin", "b.bin"):
            with open(os.path.join(out_path, name), "w") as f:
                f.write(name)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    resolve(apply("plain", two_files, version="v0", out_path=OUT), prefix=str(tmp_path))
    assert synced == [], "fsync outside durable mode"
    monkeypatch.setenv("MARIN_DURABLE", "1")
    resolve(apply("durable", two_files, version="v0", out_path=OUT), prefix=str(tmp_path))
    out = str(tmp_path / "durable" / "v0")
    assert {os.path.join(out, "a.bin"), os.path.join(out, "b.bin"), out} <= set(synced)
    assert any(p.startswith(str(tmp_path / "durable" / "v0.marin" / "record.json")) for p in synced)


def _wander_off(elsewhere: str, out_path: str) -> str:
    os.chdir(elsewhere)  # a step's fn that changes the process's directory
    return "moved"


def _stay(tag: str, out_path: str) -> str:
    return tag


def test_records_name_the_checkout_the_run_was_launched_from(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run reads its working directory once: a step that changes directory does not make
    later records name another checkout's git state (or none)."""
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    checkout.mkdir()
    elsewhere.mkdir()
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (checkout / "pipeline.py").write_text("steps\n")
    subprocess.run([*git, "add", "pipeline.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    monkeypatch.chdir(checkout)  # restored after the test, wherever the step went
    prefix = str(tmp_path / "p")
    wander = apply("cwd/wander", _wander_off, version="v1", elsewhere=str(elsewhere), out_path=OUT)
    after = apply("cwd/after", _stay, version="v1", tag=wander, out_path=OUT)
    StepRunner(RunOptions(max_concurrent=1), prefix=prefix).run(lower([after]))
    assert os.getcwd() == str(elsewhere)  # the step did move the process
    location = open_prefix(prefix)
    for step in ("cwd/wander/v1", "cwd/after/v1"):
        record = read_record(location, step)
        assert record is not None
        assert record.provenance["git_commit"] == head, step


def _make_or_fail(out_path: str, fail: bool) -> str:
    if fail:
        raise RuntimeError("this version fails")
    with fsspec.open(f"{out_path}/data.txt", "w", auto_mkdir=True) as f:
        f.write("made")
    return "made"


def test_another_versions_failure_at_a_shared_pin_is_not_this_versions(tmp_path) -> None:
    """Red team round 15, finding 3: a pinned step's versions share its output path; c@v1
    failed there, and c@v2 (which never ran) read as ``failed-before`` and was refused under
    ``force_run_failed=False``. A status names the attempt's step: another's is not this one's."""
    from marin.execution.errors import StepFailedError
    from marin.execution.pipeline.graph import Graph
    from marin.execution.plan.read import plan_run
    from marin.execution.store.location import open_prefix
    from marin.execution.vocabulary import StoredStatus

    prefix = str(tmp_path / "p")
    v1 = apply("c", _make_or_fail, version="v1", out_path=OUT, fail=True, pin="ckpt/base")
    with pytest.raises(StepFailedError):
        run(v1, prefix=prefix)
    v2 = apply("c", _make_or_fail, version="v2", out_path=OUT, fail=False, pin="ckpt/base")
    graph = Graph.of([v2.lower()])
    plan = plan_run(graph, open_prefix(prefix), RunOptions(force_run_failed=False))
    decision = plan.decisions["ckpt/base"]
    assert decision.status == StoredStatus.RUN and "c@v1" in decision.reason, decision.reason
    run(v2, prefix=prefix, force_run_failed=False)
    assert (tmp_path / "p/ckpt/base/data.txt").read_text() == "made"
