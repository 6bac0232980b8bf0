"""The lease contract and the commit path on local disk, memory://, S3 (moto via s3fs) and GCS
(fake-gcs-server via gcsfs)."""

from __future__ import annotations

import gc
import threading
import time
import uuid
import weakref
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from marin.execution.builder.commit import build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.lazy import OUT, apply
from marin.execution.store.lease import Heartbeat, Lease, LeaseInfo, heartbeat, lease_store
from marin.execution.store.lease.heartbeat import _COMPACT_SLACK
from marin.execution.store.location import open_prefix
from marin.execution.store.records import lease_path, read_record, read_status


def test_backends_get_the_strong_store(store_prefix: str) -> None:
    store = lease_store(open_prefix(store_prefix))
    assert store.atomic
    kinds = {"s3": "s3", "gs": "gcs", "memory": "memory"}
    assert store.kind == (kinds[store_prefix.split("://")[0]] if "://" in store_prefix else "local")


def test_one_holder_then_release_hands_over(store_prefix: str) -> None:
    location = open_prefix(store_prefix)
    first, second = Lease(location, "s/v0"), Lease(location, "s/v0")
    assert first.try_acquire() is None
    held = second.try_acquire()
    assert isinstance(held, LeaseInfo) and held.token == first.token and not held.expired
    assert first.holder in held.describe()
    assert not second.renew()
    assert not second.commit(lambda: pytest.fail("a non-holder must not commit"))
    second.release()  # not ours: must not delete the holder's lease
    assert first.read() is not None and first.renew()
    first.release()
    assert first.read() is None
    assert second.try_acquire() is None
    second.release()


class _Clock:
    """Stands in for the ``time`` module inside ``marin.execution.store.lease``'s modules: the clock
    can be
    moved forward, so a test expires a lease without sleeping and without a race against a
    slow store (a 0.3 s TTL once had to outlive a moto create, a 412 and a GET)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_expired_lease_is_taken_over_and_the_old_holder_cannot_commit(
    store_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from marin.execution.store.lease import core, info

    clock = _Clock()
    for module in (core, info):  # the lease protocol's clock, and the one expiries are judged by
        monkeypatch.setattr(module, "time", clock)
    location = open_prefix(store_prefix)
    old = Lease(location, "s/v0", ttl=30)
    assert old.try_acquire() is None
    new = Lease(location, "s/v0", ttl=30)
    assert new.try_acquire() is not None, "a live lease must not be taken over"
    clock.offset = 31.0  # past old's TTL (and past the half-TTL renew shortcut)
    assert new.try_acquire() is None, "an expired lease must be taken over"
    assert not old.renew()
    wrote = []
    assert not old.commit(lambda: wrote.append("old"))
    assert new.commit(lambda: wrote.append("new"))
    assert wrote == ["new"]
    old.release()
    assert new.read() is not None and new.read().token == new.token  # type: ignore[union-attr]
    new.release()


@pytest.mark.parametrize("expired", [False, True], ids=["fresh", "expired"])
def test_racing_acquirers_exactly_one_wins(store_prefix: str, expired: bool) -> None:
    """Simultaneous create-if-absent (fresh) or compare-and-swap takeover (expired)."""
    location = open_prefix(store_prefix)
    if expired:
        stale = Lease(location, "s/v0", ttl=0.05)
        assert stale.try_acquire() is None
        time.sleep(0.1)
    racers = [Lease(location, "s/v0") for _ in range(8)]
    barrier = threading.Barrier(len(racers))

    def race(lease: Lease) -> bool:
        barrier.wait()
        return lease.try_acquire() is None

    with ThreadPoolExecutor(len(racers)) as pool:
        wins = list(pool.map(race, racers))
    assert wins.count(True) == 1
    winner = racers[wins.index(True)]
    assert winner.read().token == winner.token  # type: ignore[union-attr]
    winner.release()


def test_heartbeat_keeps_a_short_lease_alive(store_prefix: str) -> None:
    location = open_prefix(store_prefix)
    holder = Lease(location, "s/v0", ttl=0.6)
    assert holder.try_acquire() is None
    with Heartbeat(holder) as beat:
        time.sleep(1.5)  # well past the TTL
        assert Lease(location, "s/v0").try_acquire() is not None
    assert not beat.lost.is_set()
    holder.release()


def _renewals(beat: Heartbeat) -> threading.Event:
    """An event set each time ``beat`` is renewed (by the shared renewal thread)."""
    renewed = threading.Event()
    renew = beat.beat

    def renew_and_signal() -> bool:
        alive = renew()
        renewed.set()
        return alive

    beat.beat = renew_and_signal  # type: ignore[method-assign]
    return renewed


def test_ended_heartbeats_are_dropped_before_their_deadline(store_prefix: str) -> None:
    """Builds end long before their lease's first renewal is due: the shared renewer must not
    keep each one's heartbeat, lease and event until then (a fast run kept every build's, and
    its per-step time grew with the run), and a heartbeat still running is still renewed."""
    location = open_prefix(store_prefix)
    kept_lease = Lease(location, "kept/v0", ttl=0.3)
    assert kept_lease.try_acquire() is None
    with Heartbeat(kept_lease) as kept:
        ended = []
        for i in range(300):
            lease = Lease(location, f"s{i}/v0", ttl=60)  # first renewal due in 20 s
            assert lease.try_acquire() is None
            with Heartbeat(lease) as beat:
                pass
            lease.release()
            ended.append(weakref.ref(beat))
        del beat
        gc.collect()
        assert sum(ref() is not None for ref in ended) <= 2 + _COMPACT_SLACK
        renewed = _renewals(kept)
        assert renewed.wait(5), "the running heartbeat was not renewed after the compaction"
    assert not kept.lost.is_set()
    kept_lease.release()


def _fresh_renewer(monkeypatch: pytest.MonkeyPatch) -> tuple[heartbeat._Renewer, list[int]]:
    """A renewer of the test's own (no other test's heartbeats in its heap), and a count of
    its condition's notifies (an add's, or the thread's own after a renewal)."""
    renewer = heartbeat._Renewer()
    monkeypatch.setattr(heartbeat, "_RENEWER", renewer)
    wakes = [0]
    notify_all = renewer._cond.notify_all

    def counted() -> None:
        wakes[0] += 1
        notify_all()

    monkeypatch.setattr(renewer._cond, "notify_all", counted)
    return renewer, wakes


def test_builds_ending_before_their_renewal_never_wake_the_renewer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A build's heartbeat whose first renewal is due after the renewer's next look must not
    wake it: a woken thread takes the GIL at the building thread's next system call, and a
    serial memory:// build paid a hand-off between CPUs at each one (issue 23). The renewer
    used to be woken again and again once it had found its heap empty."""
    _, wakes = _fresh_renewer(monkeypatch)
    location = open_prefix(f"memory://wake-{uuid.uuid4().hex[:8]}")
    for i in range(3 * _COMPACT_SLACK):  # compacted to empty twice on the way
        lease = Lease(location, f"s{i}/v0", ttl=60)
        assert lease.try_acquire() is None
        with Heartbeat(lease):
            pass
        lease.release()
    assert wakes[0] == 0


def test_a_heartbeat_after_the_renewer_went_idle_is_renewed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other side of not waking the renewer: once it has given up on more heartbeats (it
    waits with no deadline), a new one wakes it, and one due before its next look does too."""
    renewer, wakes = _fresh_renewer(monkeypatch)
    asleep = threading.Event()
    wait = renewer._cond.wait

    def observed(timeout: float | None = None) -> bool:
        if timeout is None:
            asleep.set()  # the thread has found nothing to renew for a whole interval
        return wait(timeout)

    monkeypatch.setattr(renewer._cond, "wait", observed)
    location = open_prefix(f"memory://idle-{uuid.uuid4().hex[:8]}")
    first = Lease(location, "first/v0", ttl=0.3)
    assert first.try_acquire() is None
    with Heartbeat(first):
        pass
    first.release()
    assert asleep.wait(5), "the renewer never went to sleep"

    slow_lease, fast_lease = Lease(location, "slow/v0", ttl=60), Lease(location, "fast/v0", ttl=0.3)
    assert slow_lease.try_acquire() is None and fast_lease.try_acquire() is None
    before = wakes[0]  # a renewal of the first lease, had it come due, notified too
    with Heartbeat(slow_lease) as slow:  # wakes the sleeping thread, which then waits 20 s
        assert wakes[0] == before + 1
        fast = Heartbeat(fast_lease)
        renewed = _renewals(fast)
        with fast:  # due in 0.1 s: before the thread's next look, so it is woken again
            assert renewed.wait(5), "a heartbeat due before the renewer's next look was not renewed"
        assert wakes[0] >= before + 2
    assert not slow.lost.is_set() and not fast.lost.is_set()
    slow_lease.release()
    fast_lease.release()


def test_heartbeat_reports_a_stolen_lease(store_prefix: str) -> None:
    location = open_prefix(store_prefix)
    holder = Lease(location, "s/v0", ttl=0.3)
    assert holder.try_acquire() is None
    with Heartbeat(holder) as beat:
        # Another runner overwrites the lease, as a takeover after a stall would.
        thief = Lease(location, "s/v0", ttl=30)
        thief.store.replace(thief.path, thief._body(), thief.store.read(thief.path)[1])  # type: ignore[index]
        assert beat.lost.wait(2)
    assert not holder.commit(lambda: pytest.fail("must not commit"))
    thief.release()


def test_racing_builders_run_fn_once_and_agree(store_prefix: str) -> None:
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def fn(out_path: str) -> str:
        with lock:
            calls["fn"] += 1
        time.sleep(0.1)
        import fsspec

        with fsspec.open(out_path, "w") as f:
            f.write("x")
        return "done"

    spec = apply("shared", fn, version="v0", out_path=OUT).lower()
    location = open_prefix(store_prefix)
    barrier = threading.Barrier(6)

    def build(_: int) -> Any:
        barrier.wait()
        return build_step(BuildRequest(spec, location))

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(build, range(6)))
    assert calls["fn"] == 1
    actions = Counter(o.action for o in outcomes)
    assert (
        actions["built"] == 1
        and actions["built"] + actions["built-by-other"] + actions["cached"] == 6
    )
    assert {o.record.fingerprint for o in outcomes} == {spec.fingerprint}
    assert read_record(location, spec.output_path) is not None
    assert (read_status(location, spec.output_path) or {}).get("state") == "SUCCESS"
    assert not location.fs.exists(location.path(lease_path(spec.output_path)))


def test_a_lease_being_created_is_waited_for_then_taken_over_if_it_stays_torn(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local creates make the file, then write it: an empty or half-written lease may be a
    competitor mid-create, so it is not taken over at once; one that stays so is."""
    import marin.execution.store.lease.info as lease_module  # the garbled-lease grace period

    location = open_prefix(str(tmp_path / "p"))
    path = location.path(lease_path("s/v0"))
    for torn in (b"", b'{"holder": "h:1:2", "tok'):
        lease_module._garbled_seen.clear()
        (tmp_path / "p" / "s" / "v0.marin").mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(torn)
        monkeypatch.setattr(lease_module, "GARBLED_GRACE_S", 3600.0)
        waiting = Lease(location, "s/v0")
        held = waiting.try_acquire()
        assert held is not None and held.garbled, "a torn lease must not be taken over at once"
        assert read_status(location, "s/v0") is None  # says nothing: no holder to report
        monkeypatch.setattr(lease_module, "GARBLED_GRACE_S", 0.0)
        assert waiting.try_acquire() is None and waiting.took_over
        waiting.release()
        assert waiting.read() is None
    # Well-formed JSON that is not a valid lease (here an impossible expiry) was written whole:
    # it protects nothing and is taken over at once.
    with open(path, "w") as f:
        f.write('{"holder": "h", "token": "t", "expires_at": 1e300}')
    monkeypatch.setattr(lease_module, "GARBLED_GRACE_S", 3600.0)
    taker = Lease(location, "s/v0")
    assert taker.try_acquire() is None and taker.took_over
    taker.release()


def test_racing_local_creates_have_exactly_one_winner(tmp_path: Any) -> None:
    location = open_prefix(str(tmp_path / "p"))
    for round_ in range(20):
        leases = [Lease(location, f"race/{round_}") for _ in range(8)]
        start = threading.Barrier(len(leases))

        def take(lease: Lease, start: threading.Barrier = start) -> bool:
            start.wait(timeout=30)
            return lease.try_acquire() is None

        with ThreadPoolExecutor(len(leases)) as pool:
            won = list(pool.map(take, leases))
        assert won.count(True) == 1, f"round {round_}: {won.count(True)} holders"
        assert not any(lease.took_over for lease in leases)


def test_a_local_lease_folder_deleted_after_it_was_seen_is_made_again(tmp_path: Any) -> None:
    """The location remembers the folders a first build made as real, so the next lease create
    skips the link check's walk; if they were deleted meanwhile (a step folder removed by hand
    between two runs on one location), the create makes them again instead of failing."""
    import shutil

    location = open_prefix(str(tmp_path))
    first = Lease(location, "step/v0")
    assert first.try_acquire() is None
    first.release()
    assert f"{tmp_path}/step/v0.marin" in location._real_dirs  # what the next create trusts
    shutil.rmtree(tmp_path / "step")
    again = Lease(location, "step/v0")
    assert again.try_acquire() is None
    assert again.read() is not None
    again.release()
