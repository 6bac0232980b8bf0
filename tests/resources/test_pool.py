"""``Resources`` parsing and the ``ResourcePool`` the local scheduler draws grants from."""

from __future__ import annotations

import threading

import pytest

from marin.execution.errors import InvalidStepError
from marin.execution.pipeline.resources import (
    Grant,
    ResourcePool,
    Resources,
    check_fits,
    machine_capacity,
    parse_capacity,
    parse_duration,
    parse_memory,
    parse_resources,
    visible_gpus,
)

GiB = 1024**3


def test_a_plain_dict_parses_to_typed_amounts() -> None:
    r = parse_resources({"cpu": 4, "memory": "16GiB", "gpu": 2, "tpu": 8})
    assert (r.cpu, r.memory, r.gpu, r.extra) == (4.0, 16 * GiB, 2, (("tpu", 8.0),))
    assert r.to_dict() == {"cpu": 4, "memory": 16 * GiB, "gpu": 2, "tpu": 8}
    assert r.describe() == "cpu=4 memory=16GiB gpu=2 tpu=8"
    assert parse_resources(r) is r
    assert not parse_resources(None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("16GiB", 16 * GiB), ("16Gi", 16 * GiB), ("16GB", 16 * 10**9), ("512MiB", 512 * 2**20),
     ("1.5GiB", 3 * GiB // 2), (1024, 1024), ("0", 0)],
)  # fmt: skip
def test_memory_units(text: object, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize(
    ("value", "field_name", "fix"),
    [
        ({"memory": "16 parsecs"}, "resources.memory", "16GiB"),
        ({"gpu": 0.5}, "resources.gpu", "whole number"),
        ({"cpu": -1}, "resources.cpu", ">= 0"),
        ({"cpu": True}, "resources.cpu", ">= 0"),
        ({"cpu": float("nan")}, "resources.cpu", ">= 0"),
        ({"GPU ": 1}, "'GPU '", "lowercase"),
        ([1, 2], "resources=[1, 2]", "dict"),
    ],
)
def test_bad_resources_name_the_step_the_field_and_the_fix(
    value: object, field_name: str, fix: str
) -> None:
    with pytest.raises(InvalidStepError) as info:
        parse_resources(value, "train@v1")
    message = str(info.value)
    assert message.startswith("error: ") and "(step train@v1)" in message
    assert field_name in message and fix in message


@pytest.mark.parametrize(
    ("text", "seconds"), [(90, 90.0), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0),
                          ("1h30m", 5400.0), ("1d", 86400.0), (0.5, 0.5)],
)  # fmt: skip
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["2 hours", "h", "", 0, -3, "1h-5m", True])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(InvalidStepError, match=r"timeout=.* is not a duration \(step s@v1\)"):
        parse_duration(bad, "s@v1")


def test_parse_capacity_is_the_cli_syntax() -> None:
    cap = parse_capacity("cpu=16, memory=64GiB,gpu=2,tpu=4")
    assert cap == Resources(cpu=16, memory=64 * GiB, gpu=2, extra=(("tpu", 4.0),))
    for bad, why in [("cpu", "KIND=AMOUNT"), ("cpu=x", "not a number"), ("gpu=1,gpu=2", "twice"),
                     ("gpu=1.5", "whole number")]:  # fmt: skip
        with pytest.raises(InvalidStepError, match=why):
            parse_capacity(bad)


def test_machine_capacity_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    cap = machine_capacity()
    assert cap.cpu == os.cpu_count() and cap.gpu == 2
    assert cap.memory > 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,2"}) == ["0"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert machine_capacity().gpu == 0


def test_fits_ever_names_what_is_asked_and_what_the_machine_has() -> None:
    pool = ResourcePool(parse_capacity("cpu=8,memory=32GiB,gpu=2"))
    assert pool.fits_ever(Resources(cpu=8, gpu=2)) is None
    message = pool.fits_ever(parse_resources({"gpu": 4, "memory": "64GiB", "tpu": 1}), "train@v1")
    assert message is not None
    assert message.startswith("error: the step asks for ")
    assert "gpu=4 but the machine has 2" in message
    assert "memory=64GiB but the machine has 32GiB" in message
    assert "tpu=1 but the machine has 0" in message
    assert "(step train@v1)" in message and "--resources" in message
    with pytest.raises(ValueError, match="gpu=4"):
        pool.try_acquire("train@v1", Resources(gpu=4))


def test_check_fits_fails_the_plan_for_a_step_that_never_fits() -> None:
    from marin.execution.lazy import ArtifactStep, lower

    small = ArtifactStep("small", "v1", run=lambda config: None, resources={"gpu": 1})
    big = ArtifactStep("big", "v1", run=lambda config: None, deps=(small,), resources={"gpu": 3})
    specs = [small.lower(), lower(big)]
    with pytest.raises(InvalidStepError) as info:
        check_fits(ResourcePool(Resources(cpu=4, gpu=2)), specs)
    assert str(info.value).startswith(
        "error: the step asks for gpu=3 but the machine has 2 (step big@v1)"
    )


def test_grants_count_amounts_and_assign_distinct_devices() -> None:
    pool = ResourcePool(Resources(cpu=4, gpu=3))
    a = pool.try_acquire("a", Resources(cpu=1, gpu=2))
    b = pool.try_acquire("b", Resources(cpu=1, gpu=1))
    assert a is not None and b is not None
    assert a.devices == (0, 1) and b.devices == (2,)
    assert pool.try_acquire("c", Resources(gpu=1)) is None  # no device left
    assert pool.in_use() == {"cpu": 2.0, "gpu": 3.0}
    pool.release(a)
    c = pool.try_acquire("c", Resources(gpu=1))
    assert c is not None and c.devices == (0,)
    with pytest.raises(ValueError, match="no such grant"):
        pool.release(a)
    assert pool.peak() == {"cpu": 2.0, "gpu": 3.0}


def test_a_big_step_is_not_starved_by_a_stream_of_small_ones() -> None:
    """The scheduler offers ready steps in priority order; the first refused reserves."""
    pool = ResourcePool(Resources(cpu=4))
    running = [pool.try_acquire(f"small-{i}", Resources(cpu=1)) for i in range(3)]
    assert all(running)
    # The big step (needs the whole machine) is refused and becomes the reservation.
    assert pool.try_acquire("big", Resources(cpu=4)) is None
    assert pool.reserved_for == "big"
    # One cpu is free, but it is held for "big": a new small step may not take it.
    assert pool.try_acquire("small-new", Resources(cpu=1)) is None
    for grant in running:
        assert grant is not None
        pool.release(grant)
        assert pool.try_acquire("small-new", Resources(cpu=1)) is None
    big = pool.try_acquire("big", Resources(cpu=4))
    assert big is not None and pool.reserved_for is None
    pool.release(big)
    assert pool.try_acquire("small-new", Resources(cpu=1)) is not None


def test_small_steps_backfill_what_the_reserved_step_does_not_use() -> None:
    pool = ResourcePool(Resources(cpu=4, gpu=2))
    trainer = pool.try_acquire("train-a", Resources(cpu=1, gpu=1))
    assert trainer is not None
    assert pool.try_acquire("train-b", Resources(cpu=1, gpu=2)) is None  # reserves gpu=2, cpu=1
    # cpu beyond the reservation's one core is still free for cpu-only steps.
    assert pool.try_acquire("tok-1", Resources(cpu=1)) is not None
    assert pool.try_acquire("tok-2", Resources(cpu=1)) is not None
    assert pool.try_acquire("tok-3", Resources(cpu=1)) is None  # would eat the reserved core
    assert pool.try_acquire("eval", Resources(gpu=1)) is None  # the free GPU is held
    pool.withdraw("train-b")
    assert pool.reserved_for is None
    assert pool.try_acquire("eval", Resources(gpu=1)) is not None


def test_the_pool_is_thread_safe_and_never_double_books_a_device() -> None:
    pool = ResourcePool(Resources(cpu=64, gpu=4))
    holders: dict[int, str] = {}
    lock = threading.Lock()
    errors: list[str] = []
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        start.wait()
        for i in range(300):
            step = f"w{n}-{i}"
            grant: Grant | None = pool.try_acquire(
                step, Resources(cpu=1, gpu=1 + (i % 2)), reserve=False
            )
            if grant is None:
                continue
            with lock:
                for d in grant.devices:
                    if d in holders:
                        errors.append(f"device {d} held by {holders[d]} and {step}")
                    holders[d] = step
            with lock:
                for d in grant.devices:
                    del holders[d]
            pool.release(grant)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.in_use() == {} and pool.peak()["gpu"] <= 4


def test_capacity_from_fills_unnamed_kinds_from_the_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from marin.execution.pipeline.resources import capacity_from

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    machine = machine_capacity()
    assert capacity_from(None) == machine
    only_gpu = capacity_from("gpu=2")
    assert (only_gpu.gpu, only_gpu.cpu, only_gpu.memory) == (2, machine.cpu, machine.memory)
    assert capacity_from({"cpu": 1, "tpu": 4}) == Resources(
        cpu=1, memory=machine.memory, gpu=0, extra=(("tpu", 4.0),)
    )
    exact = Resources(gpu=2)
    assert capacity_from(exact) is exact
    with pytest.raises(InvalidStepError, match="not a number"):
        capacity_from("gpu=lots")
