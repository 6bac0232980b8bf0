"""Who built what: a record names the engine's own unit of work (``provenance.engine``) beside
host and pid when an adapter builds inside ``engine_run``; ``marin show`` and ``marin ls``
print it, and a stored value that is not a mapping is shown as absent, never a crash."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from marin.execution.builder.commit import build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.lazy import OUT, apply, lower
from marin.execution.pipeline.provenance import current_engine, engine_run
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record, record_path
from tests.ux.helpers import marin

AIRFLOW_IDS = {
    "dag_id": "d",
    "run_id": "manual__1",
    "task_id": "t__v1",
    "try_number": 2,
    "map_index": -1,
}


def write_out(out_path: str, n: int) -> dict[str, Any]:
    os.makedirs(out_path, exist_ok=True)
    return {"n": n}


def _build(prefix: Path, name: str, engine: dict[str, Any] | None) -> Any:
    spec = lower(apply(name, write_out, version="v1", out_path=OUT, n=1))
    location = open_prefix(str(prefix))
    if engine is None:
        build_step(BuildRequest(spec, location))
    else:
        with engine_run(engine.pop("name"), engine):
            build_step(BuildRequest(spec, location))
    return read_record(location, spec.output_path)


def test_a_record_built_in_an_engine_task_names_it(tmp_path: Path) -> None:
    record = _build(tmp_path, "prov/engine", {"name": "airflow", **AIRFLOW_IDS})
    prov = record.provenance
    assert prov["engine"] == {"name": "airflow", **AIRFLOW_IDS}
    assert prov["pid"] == os.getpid() and prov["host"]
    assert current_engine() is None, "engine_run leaked out of its block"
    plain = _build(tmp_path, "prov/plain", None)
    assert "engine" not in plain.provenance  # a local build names no engine


def test_each_thread_sees_only_its_own_engine() -> None:
    seen: dict[str, Any] = {}
    inside = threading.Event()
    done = threading.Event()

    def other() -> None:
        inside.wait(10)
        seen["other"] = current_engine()
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with engine_run("prefect", {"task_run_id": "abc"}):
        inside.set()
        done.wait(10)
        seen["here"] = current_engine()
    thread.join(10)
    assert seen == {"other": None, "here": {"name": "prefect", "task_run_id": "abc"}}


def test_show_and_ls_print_where_a_step_was_built(tmp_path: Path) -> None:
    _build(tmp_path, "prov/engine", {"name": "airflow", **AIRFLOW_IDS})
    _build(tmp_path, "prov/plain", None)
    shown = marin("show", "prov/engine@v1", "--prefix", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert (
        "  engine       airflow dag_id=d map_index=-1 run_id=manual__1 task_id=t__v1 "
        "try_number=2\n" in shown.stdout  # stored with sorted keys
    )
    assert f"(pid {os.getpid()})" in shown.stdout
    plain = marin("show", "prov/plain@v1", "--prefix", str(tmp_path))
    assert "  engine       -\n" in plain.stdout

    table = marin("ls", "--prefix", str(tmp_path), "--where").stdout
    header, *rows = table.splitlines()
    assert header.split()[-2:] == ["pid", "engine"]
    row = next(r for r in rows if r.startswith("prov/engine@v1"))
    assert f" {os.getpid()} " in row and row.endswith("task_id=t__v1 try_number=2")
    assert "engine" not in marin("ls", "--prefix", str(tmp_path)).stdout.splitlines()[0]

    data = json.loads(marin("ls", "--prefix", str(tmp_path), "--json").stdout)
    by_step = {a["step"]: a for a in data["artifacts"]}
    assert by_step["prov/engine@v1"]["engine"] == {"name": "airflow", **AIRFLOW_IDS}
    assert by_step["prov/engine@v1"]["pid"] == os.getpid()
    assert by_step["prov/plain@v1"]["engine"] is None


def test_a_stored_engine_that_is_not_a_mapping_is_shown_as_absent(tmp_path: Path) -> None:
    _build(tmp_path, "prov/odd", None)
    path = tmp_path / record_path("prov/odd/v1")
    data = json.loads(path.read_text())
    data["provenance"]["engine"] = ["\x1b[31m", "not", "a", "mapping"]
    path.write_text(json.dumps(data))
    shown = marin("show", "prov/odd@v1", "--prefix", str(tmp_path))
    assert shown.returncode == 0 and "  engine       -\n" in shown.stdout
    listed = marin("ls", "--prefix", str(tmp_path), "--where", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["artifacts"][0]["engine"] is None
    table = marin("ls", "--prefix", str(tmp_path), "--where")
    assert table.returncode == 0 and "\x1b" not in table.stdout
