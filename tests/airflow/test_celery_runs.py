"""Airflow on Celery, for real: one pipeline across two worker machines on loopback.

Redis, PostgreSQL (the metadata database), the api-server, scheduler and dag-processor, and two
``airflow celery worker`` processes (``cpu`` consumes ``default``; ``gpu`` consumes ``default``
and ``gpu``), each set up as its own machine (working directory, ``HOME``, ``TMPDIR``,
``AIRFLOW_HOME``, DAG folder); artifacts on moto's S3 server. Runs are triggered through the
REST API, as a user does. The tests share one set of services and run in file order: the
lost-worker test, which kills a worker, is last.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.celery_pipelines import EVENTS_ENV, GO_FILE, WORKER_ENV, events

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = "tests.airflow.celery_pipelines"
BUCKET = "marin-celery"
LEASE_TTL = 6
DAGS = {"cel_routed": "routed", "cel_victim": "victim", "cel_flaky": "flaky"}


class Cluster:
    """The running services, and what the tests read back."""

    def __init__(self, services: Any, events_dir: Path) -> None:
        self.services = services
        self.events_dir = events_dir

    def run(self, dag_id: str, timeout: float = 240) -> str:
        run_id = self.services.trigger_rest(dag_id)
        state = self.services.wait_for_run(dag_id, run_id, timeout=timeout)
        assert state == "success", self.services.log_tail(5000)
        return str(run_id)

    def wait_for_event(self, step: str, event: str, timeout: float = 180) -> dict[str, Any]:
        """Until a step's fn has left ``event``; return it (the test's synchronisation point)."""
        from marin_testing.celery import wait_for

        found: list[dict[str, Any]] = []

        def seen() -> bool:
            found[:] = [e for e in self.events(step) if e["step"] == step and e["event"] == event]
            return bool(found)

        wait_for(f"{step} {event}", seen, timeout, self.services._check_alive)
        return found[0]

    def events(self, prefix: str) -> list[dict[str, Any]]:
        return [e for e in events(str(self.events_dir)) if e["step"].startswith(prefix)]


def _location(dag_id: str) -> Any:
    from marin.execution.store.location import open_prefix

    return open_prefix(f"s3://{BUCKET}/{dag_id}")


def _records(dag_id: str, steps: list[str]) -> dict[str, Any]:
    from marin.execution.store.records import read_record

    location = _location(dag_id)
    out = {}
    for step_id in steps:
        name, _, version = step_id.rpartition("@")
        record = read_record(location, f"{name}/{version}")
        assert record is not None, f"{step_id} has no record under {location.url}"
        out[step_id] = record
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # Checked here, not at import: `pytest -m "not slow"` never collects a skip from this module.
    pytest.importorskip("airflow.providers.celery", reason="pip install -e '.[celery]'")
    pytest.importorskip("s3fs")
    if shutil.which("redis-server") is None:  # .ci/run installs it
        pytest.skip("redis-server is not installed: apt-get install -y redis-server")
    from marin_airflow.export import build_export, write_export
    from marin_testing.celery import CeleryServices, WorkerSpec, start_moto
    from marin_testing.postgres import PostgresUnavailable, find_bin_dir

    try:  # the metadata database: allowed to be missing outside CI only (tests/skip_policy.py)
        find_bin_dir()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    from marin_testing.airflow import AirflowSandbox

    root = tmp_path_factory.mktemp("celery")
    moto, s3_env = start_moto(str(root), BUCKET)
    saved = {k: os.environ.get(k) for k in s3_env}
    os.environ.update(s3_env)  # this process reads the records back through s3fs
    import fsspec.config
    import s3fs

    # The session's own moto server (tests/conftest.py) may have set s3's endpoint in this
    # process already: it is put back as it was, not removed, when this cluster stops.
    s3_conf = dict(fsspec.config.conf.get("s3", {}))
    fsspec.config.set_conf_env(fsspec.config.conf)
    s3fs.S3FileSystem.clear_instance_cache()
    events_dir = root / "events"
    events_dir.mkdir()
    dags = root / "dags"
    for dag_id, attr in DAGS.items():
        prefix = f"s3://{BUCKET}/{dag_id}"
        write_export(
            build_export(
                f"{PIPELINES}:{attr}", str(dags), dag_id=dag_id, prefix=prefix, executor="celery"
            )
        )
    shared = {
        **s3_env,
        EVENTS_ENV: str(events_dir),
        # Every worker is another machine: a lease is taken over when its TTL has passed.
        "MARIN_LEASE_CHECK_PID": "0",
        "MARIN_LEASE_TTL": str(LEASE_TTL),
    }
    workers = [
        WorkerSpec("cpu", ("default",), env={**shared, WORKER_ENV: "cpu"}),
        WorkerSpec("gpu", ("default", "gpu"), env={**shared, WORKER_ENV: "gpu"}),
    ]
    sandbox = AirflowSandbox(str(root / "airflow"), pythonpath=[str(ROOT)])
    services = CeleryServices(sandbox, str(dags), workers, env=s3_env)
    try:
        services.start()
        services.wait_for_dags(list(DAGS))
        yield Cluster(services, events_dir)
    finally:
        services.stop()
        moto.stop()
        from marin_testing.airflow import session_members

        left = {sid: session_members(sid) for sid in [*services.sessions, moto.proc.pid]}
        assert not any(left.values()), f"processes left running: {left}"
        fsspec.config.conf["s3"] = s3_conf
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()


def _assert_built_by(cluster: Cluster, record: Any, worker: str) -> None:
    """Who built what, as the record says it, is the worker that ran the step: the record's
    process is the one Airflow's task instance (that try) ran in, and that process belonged to
    worker ``worker``'s machine (its session)."""
    prov, engine = record.provenance, record.provenance["engine"]
    ti = cluster.services.task_instance(
        engine["dag_id"], engine["run_id"], engine["task_id"], engine["try_number"]
    )
    assert (ti["pid"], ti["try_number"]) == (prov["pid"], engine["try_number"]), (ti, prov)
    ended = [e for e in cluster.events(record.name) if e["event"] == "end"]
    ended = [e for e in ended if e["pid"] == prov["pid"]]
    assert [e["sid"] for e in ended] == [cluster.services.worker_session(worker)], ended


def _ran_on(evs: list[dict[str, Any]], event: str = "end") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in evs:
        if e["event"] == event:
            out.setdefault(e["step"], []).append(e["worker"])
    return out


def test_gpu_steps_run_only_on_the_gpu_worker_and_a_rerun_serves_all(cluster: Cluster) -> None:
    run_id = cluster.run("cel_routed")
    ran = _ran_on(cluster.events("cel/"))
    steps = ["cel/prep", *(f"cel/data-{i}" for i in range(4)), "cel/train-0", "cel/train-1"]
    steps.append("cel/eval")
    assert sorted(ran) == sorted(steps)
    assert all(len(w) == 1 for w in ran.values()), f"a step was built twice: {ran}"
    assert ran["cel/train-0"] == ran["cel/train-1"] == ["gpu"], ran
    # Four 2-second shards, two slots per worker: the default queue is spread over both.
    assert {ran[f"cel/data-{i}"][0] for i in range(4)} == {"cpu", "gpu"}, ran

    records = _records("cel_routed", [f"{s}@v1" for s in steps])
    ends = {e["step"]: e for e in cluster.events("cel/") if e["event"] == "end"}
    for step_id, record in records.items():
        prov = record.provenance
        step = step_id.rpartition("@")[0]
        assert prov["pid"] == ends[step]["pid"] and prov["host"], prov  # the process that ran fn
        engine = prov["engine"]
        assert engine["name"] == "airflow" and engine["dag_id"] == "cel_routed", engine
        assert engine["run_id"] == run_id and engine["try_number"] == 1, engine
        assert engine["task_id"] == step.replace("/", ".") + "__v1", engine
        assert record.result["worker"] == ran[step][0]
        _assert_built_by(cluster, record, ran[step][0])

    before = len(cluster.events("cel/"))
    cluster.run("cel_routed")
    assert len(cluster.events("cel/")) == before, "the re-run called a step's fn"
    again = _records("cel_routed", [f"{s}@v1" for s in steps])
    assert {k: r.build_id for k, r in again.items()} == {k: r.build_id for k, r in records.items()}


def test_a_step_failing_on_one_worker_succeeds_on_its_retry_elsewhere(cluster: Cluster) -> None:
    services = cluster.services
    run_id = services.trigger_rest("cel_flaky")
    first = cluster.wait_for_event("flaky/step", "start")
    bad, good = first["worker"], {"cpu": "gpu", "gpu": "cpu"}[first["worker"]]
    # The failing machine stops taking default-queue work, so the retry must go elsewhere.
    services.celery_control("remove-queue", "-H", services.celery_host(bad), "-q", "default")
    try:
        (cluster.events_dir / GO_FILE).write_text("fail now")
        assert services.wait_for_run("cel_flaky", run_id, timeout=180) == "success"
    finally:
        services.celery_control("add-queue", "-H", services.celery_host(bad), "-q", "default")
    evs = cluster.events("flaky/")
    assert [(e["event"], e["worker"]) for e in evs if e["step"] == "flaky/step"] == [
        ("start", bad),
        ("fail", bad),
        ("start", good),
        ("end", good),
    ]
    records = _records("cel_flaky", ["flaky/root@v1", "flaky/step@v1", "flaky/after@v1"])
    engine = records["flaky/step@v1"].provenance["engine"]
    assert engine["try_number"] == 2 and engine["run_id"] == run_id, engine
    assert records["flaky/step@v1"].result["worker"] == good
    _assert_built_by(cluster, records["flaky/step@v1"], good)
    assert records["flaky/after@v1"].inputs == {"flaky/step@v1": records["flaky/step@v1"].build_id}
    starts = _ran_on(evs, "start")
    assert len(starts["flaky/root"]) == len(starts["flaky/after"]) == 1, starts


def test_a_killed_worker_is_replaced_and_its_step_committed_once(cluster: Cluster) -> None:
    from marin.execution.store.records import read_status

    services = cluster.services
    run_id = services.trigger_rest("cel_victim")
    started = cluster.wait_for_event("kill/victim", "start")
    lost, alive = started["worker"], {"cpu": "gpu", "gpu": "cpu"}[started["worker"]]
    before = _records("cel_victim", ["kill/root@v1", "kill/side-0@v1", "kill/side-1@v1"])
    # The machine is gone: no SIGTERM, no cleanup, its lease left held. This test is the
    # module's last: the lost worker stays lost.
    services.kill_worker(lost)
    assert services.wait_for_run("cel_victim", run_id, timeout=180) == "success"
    evs = cluster.events("kill/")
    assert [(e["event"], e["worker"]) for e in evs if e["step"] == "kill/victim"] == [
        ("start", lost),
        ("start", alive),
        ("end", alive),
    ]
    starts = _ran_on(evs, "start")
    assert all(
        len(starts[s]) == 1 for s in ("kill/root", "kill/side-0", "kill/side-1", "kill/after")
    )
    after = _records("cel_victim", ["kill/root@v1", "kill/side-0@v1", "kill/side-1@v1"])
    assert {k: r.build_id for k, r in after.items()} == {k: r.build_id for k, r in before.items()}
    victim = _records("cel_victim", ["kill/victim@v1", "kill/after@v1"])
    record = victim["kill/victim@v1"]
    assert record.provenance["engine"]["try_number"] == 2, record.provenance
    assert record.provenance["pid"] == [e["pid"] for e in evs if e["step"] == "kill/victim"][-1]
    _assert_built_by(cluster, record, alive)
    assert victim["kill/after@v1"].inputs == {"kill/victim@v1": record.build_id}
    assert (read_status(_location("cel_victim"), "kill/victim/v1") or {}).get("state") == "SUCCESS"
    # The retry found the dead attempt's lease held (by the killed process, on this "other"
    # host), and took it over once its TTL had passed.
    log = services.task_log(alive, "cel_victim", run_id, "kill.victim__v1", 2)
    lease = f"{BUCKET}/cel_victim/kill/victim/v1.marin/lease.json"
    holder = f"{socket.gethostname()}:{started['pid']}:"
    assert f"taking over expired lease on {lease} from {holder}" in log, log[-3000:]
