"""What a Dask worker is sent, without a cluster: the pickled build of a pipeline loaded from a
file path resolves in another process once that process loads the target (and not before), a
worker that cannot load it gets one error naming it and the target, steps' accelerators become
Dask resources, and the cluster address is the worker's own setting."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from marin.execution.errors import CycleError, MarinError, StorageError, TargetError
from marin.execution.lazy import OUT, apply, lower
from marin.execution.pipeline.targets import load_target
from marin.execution.step_runner import StepRunner
from marin_prefect.compile import FlowOptions, remote_target
from marin_prefect.dask import (
    DASK_ADDRESS_ENV,
    WorkerImportError,
    dask_resources,
    pack,
    task_runner_from_env,
    unpack,
)
from tests.reliability.conftest import REPO, child_env

PIPELINE = """\
from marin.execution.lazy import OUT, apply

def make(out_path, n):
    return n

pipeline = [apply("shipped/one", make, version="v1", out_path=OUT, n=3)]
"""

# In a fresh process (as a worker is): load the target, unpickle the build, run its fn.
WORKER = """\
import sys
from marin_prefect.dask import unpack
target = sys.argv[1] if sys.argv[1] != "-" else None
build = unpack(target, open(sys.argv[2], "rb").read(), {"dask_worker": None, "dask_address": None})
print(build.spec.step_id, build.spec.fingerprint)
"""


def _payload(tmp_path: Path) -> tuple[str, Path, str]:
    from marin.execution.builder.request import BuildRequest

    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "shipped.py").write_text(PIPELINE)
    target = f"{folder / 'shipped.py'}:pipeline"
    spec = lower(list(load_target(target)))[0]
    plan, location = StepRunner(prefix=str(tmp_path / "p")).plan(spec)
    call = BuildRequest(spec, location, plan.policy, None, plan.of(spec), [], threading.Event())
    payload = tmp_path / "payload.bin"
    payload.write_bytes(pack(call, FlowOptions(run=None, policy=plan.policy)))  # type: ignore[arg-type]
    return target, payload, spec.fingerprint


def _worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WORKER, *args], capture_output=True, text=True, timeout=60,
        env=child_env(), cwd=REPO,
    )  # fmt: skip


def test_a_pickled_build_of_a_file_pipeline_resolves_once_the_worker_loads_the_target(
    tmp_path: Path,
) -> None:
    target, payload, fingerprint = _payload(tmp_path)
    shipped = _worker(target, str(payload))
    assert shipped.returncode == 0, shipped.stderr
    assert shipped.stdout.split() == ["shipped/one@v1", fingerprint]
    # Without the target, the functions' module (marin_target_shipped) exists nowhere else.
    bare = _worker("-", str(payload))
    assert bare.returncode != 0
    assert "cannot load a step of the pipeline" in bare.stderr
    assert "No module named 'marin_target_shipped'" in bare.stderr


def test_a_worker_without_the_pipeline_gets_one_error_naming_it_and_the_target(
    tmp_path: Path,
) -> None:
    target, payload, _ = _payload(tmp_path)
    (tmp_path / "code").rename(tmp_path / "elsewhere")
    with pytest.raises(WorkerImportError) as caught:
        unpack(target, payload.read_bytes(), {"dask_worker": "w1", "dask_address": "tcp://h:1"})
    what = caught.value.what
    assert what.startswith("Dask worker w1 at tcp://h:1 on ") and f"the pipeline {target}" in what
    assert "no file" in what and "on every Dask worker" in caught.value.fix


def test_remote_targets_are_absolute_files_or_module_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    assert remote_target("examples/ngram.py:pipeline") == f"{REPO}/examples/ngram.py:pipeline"
    assert remote_target("tests.prefect.dask_pipeline:slow") == "tests.prefect.dask_pipeline:slow"
    assert remote_target([]) is None  # handles are pickled as they are


def test_accelerators_become_dask_resources_and_cpu_memory_do_not() -> None:
    step = apply("res/one", lambda out_path: 1, version="v1", out_path=OUT)
    spec = lower(step.with_options(resources={"cpu": 4, "memory": "8GiB", "gpu": 2}))
    assert dask_resources(spec) == {"GPU": 2.0}
    assert dask_resources(lower(step)) == {}


def test_the_cluster_address_comes_from_the_workers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(DASK_ADDRESS_ENV, raising=False)
    assert task_runner_from_env() is None
    monkeypatch.setenv(DASK_ADDRESS_ENV, "127.0.0.1:8786")
    with pytest.raises(MarinError, match="is not a Dask scheduler address"):
        task_runner_from_env()
    pytest.importorskip("prefect_dask")
    monkeypatch.setenv(DASK_ADDRESS_ENV, " tcp://127.0.0.1:8786 ")
    runner = task_runner_from_env()
    assert type(runner).__name__ == "DaskTaskRunner" and runner.address == "tcp://127.0.0.1:8786"


@pytest.mark.parametrize(
    "error",
    [MarinError("w", "f", "s@v1"), CycleError(["a", "b"]), StorageError("w", "f"), TargetError("w", "f")],
)
def test_marin_errors_survive_pickling_as_themselves(error: MarinError) -> None:
    """A worker's error reaches the driver as itself (they could not be unpickled before)."""
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert (back.what, back.fix, back.step) == (error.what, error.fix, error.step)


ENTERED = threading.Event()
GO = threading.Event()
"""The slow pipeline file below sets ENTERED while it runs, then waits for GO."""


def test_two_threads_loading_one_file_target_both_get_the_whole_module(tmp_path: Path) -> None:
    """A Dask worker's threads each load the target first: one must not get the module the
    other is still running (it was registered before it ran: 'has no attribute pipeline')."""
    (tmp_path / "slowload.py").write_text(
        "from tests.prefect import test_prefect_dask_unit as t\n"
        "t.ENTERED.set()\n"
        "t.GO.wait(30)\n"
        "from marin.execution.lazy import OUT, apply\n"
        "def make(out_path):\n"
        "    return 1\n"
        "pipeline = [apply('slow/one', make, version='v1', out_path=OUT)]\n"
    )
    target = f"{tmp_path / 'slowload.py'}:pipeline"
    results: dict[str, Any] = {}

    def load(name: str) -> None:
        try:
            results[name] = [h.name for h in load_target(target)]
        except Exception as exc:
            results[name] = exc

    first = threading.Thread(target=load, args=("first",))
    first.start()
    assert ENTERED.wait(30)
    second = threading.Thread(target=load, args=("second",))
    second.start()
    second.join(1.0)  # before the fix it ended here, with the half-run module's error
    GO.set()
    first.join(30)
    second.join(30)
    assert results == {"first": ["slow/one"], "second": ["slow/one"]}
