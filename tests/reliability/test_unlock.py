"""Leases that would block a step for days: an expiry judged against the lease's own TTL, and
``marin unlock`` to break a lease by hand."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import pytest

from marin.cli import build_parser, main
from marin.execution.builder.commit import build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.lazy import OUT, apply
from marin.execution.store.lease import CLOCK_SKEW_S, Lease, LeaseInfo
from marin.execution.store.location import Location, open_prefix
from marin.execution.store.records import lease_path, metadata_dir, read_status

DAY = 24 * 3600.0


def _plant(location: Location, body: dict[str, Any]) -> None:
    location.fs.makedirs(location.path(metadata_dir("s/v0")), exist_ok=True)
    location.fs.pipe_file(location.path(lease_path("s/v0")), json.dumps(body).encode())


def _planted(expires_in: float, **extra: Any) -> dict[str, Any]:
    return {
        "holder": "otherhost:4242:99",
        "token": "planted",
        "expires_at": time.time() + expires_in,
        "started_at": "2026-11-30T08:00:00Z",
        **extra,
    }


def _lease_there(location: Location) -> bool:
    location.fs.invalidate_cache()
    return bool(location.fs.exists(location.path(lease_path("s/v0"))))


# Expiries are given relative to the moment the test runs (not to collection time).
@pytest.mark.parametrize(
    ("expires_in", "extra"),
    [(6 * DAY, {}), (6 * DAY, {"ttl": 60})],
    ids=["no-ttl-stored", "ttl-60s"],
)
def test_a_lease_expiring_far_beyond_its_own_ttl_is_taken_over_at_once(
    store_prefix: str, expires_in: float, extra: dict[str, Any]
) -> None:
    """Under the one-week cap, but six days beyond a 60 s TTL: a clock running ahead, or a
    planted lease. It no longer blocks the step for six days."""
    location = open_prefix(store_prefix)
    lease = _planted(expires_in, **extra)
    _plant(location, lease)
    assert LeaseInfo.parse(json.dumps(lease).encode()).skewed
    taker = Lease(location, "s/v0", ttl=60)
    assert taker.try_acquire() is None and taker.took_over
    taker.release()


@pytest.mark.parametrize(
    ("expires_in", "extra"),
    [(6 * DAY, {"ttl": 7 * DAY}), (60 + CLOCK_SKEW_S / 2, {})],
    ids=["own-ttl-a-week", "within-the-skew-allowance"],
)
def test_a_lease_within_its_own_ttl_still_protects_its_step(
    store_prefix: str, expires_in: float, extra: dict[str, Any]
) -> None:
    location = open_prefix(store_prefix)
    _plant(location, _planted(expires_in, **extra))
    held = Lease(location, "s/v0", ttl=60).try_acquire()
    assert held is not None and held.token == "planted" and held.live


def test_leases_store_their_ttl(store_prefix: str) -> None:
    location = open_prefix(store_prefix)
    lease = Lease(location, "s/v0", ttl=123)
    assert lease.try_acquire() is None
    info = Lease(location, "s/v0").read()
    assert info is not None and info.ttl == 123 and not info.skewed
    lease.release()


# -- marin unlock --------------------------------------------------------------------------------


def test_unlock_breaks_a_planted_lease_and_says_who_held_it(
    store_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    location = open_prefix(store_prefix)
    _plant(location, _planted(2 * 3600, ttl=3 * 3600))  # live, on another machine
    assert main(["unlock", "s@v0", "--prefix", store_prefix]) == 1
    refused = capsys.readouterr().err
    assert "refusing to unlock s@v0" in refused and "--force" in refused
    assert "host otherhost, pid 4242, since 2026-11-30T08:00:00Z" in refused
    assert "another machine" in refused and _lease_there(location)

    assert main(["unlock", "s@v0", "--prefix", store_prefix, "--force"]) == 0
    out = capsys.readouterr().out
    assert "unlocked s@v0" in out and "host otherhost, pid 4242" in out
    assert not _lease_there(location)
    status = read_status(location, "s/v0") or {}
    assert status.get("state") == "FAILED" and "marin unlock" in status.get("error", "")
    spec = apply("s", lambda out_path: "x", version="v0", out_path=OUT).lower()
    assert build_step(BuildRequest(spec, location)).action == "built"  # no wait: the step is free


def test_unlock_of_a_skewed_lease_needs_no_force(
    store_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    location = open_prefix(store_prefix)
    _plant(location, _planted(6 * DAY))
    assert main(["unlock", "s@v0", "--prefix", store_prefix]) == 0
    out = capsys.readouterr().out
    assert "unlocked s@v0" in out and "skewed clock or a planted lease" in out
    assert not _lease_there(location)


def test_unlock_refuses_a_live_local_holder_unless_forced(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = str(tmp_path / "p")
    location = open_prefix(prefix)
    holder = Lease(location, "s/v0", ttl=600)
    assert holder.try_acquire() is None
    try:
        assert main(["unlock", "s@v0", "--prefix", prefix]) == 1
        err = capsys.readouterr().err
        assert f"host {socket.gethostname()}, pid {os.getpid()}, since " in err
        assert "a live process on this machine" in err and _lease_there(location)
        assert holder.renew(), "a refused unlock must leave the holder its lease"
        assert main(["unlock", "s@v0", "--prefix", prefix, "--force"]) == 0
        assert not _lease_there(location)
        assert not holder.renew() and holder.vanished  # it finds out, and won't commit
    finally:
        holder.release()


def test_unlock_without_a_lease_and_with_bad_input(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = str(tmp_path / "p")
    assert main(["unlock", "s@v0", "--prefix", prefix]) == 0
    assert "s@v0 has no lease" in capsys.readouterr().out
    for bad in ("s", "../up@v0", "s@.."):
        assert main(["unlock", bad, "--prefix", prefix]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and len(err.splitlines()) == 1, err


def test_unlock_of_a_step_in_your_folder_says_where_its_lease_is(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team r21-2: a step built with ``--scope user`` keeps its lease in the user's
    folder; ``marin unlock name@version`` looked in the shared one and said "has no lease"
    alone. It says where the lease is, and that command unlocks it."""
    monkeypatch.setenv("MARIN_USER", "alice")
    prefix = str(tmp_path / "p")
    location = open_prefix(prefix)
    held = Lease(location, "users/alice/s/v0", ttl=1)
    assert held.try_acquire() is None
    assert main(["unlock", "s@v0", "--prefix", prefix]) == 0
    said = capsys.readouterr().out
    assert "s@v0 has no lease" in said and "marin unlock users/alice/s@v0" in said, said
    assert main(["unlock", "users/alice/s@v0", "--prefix", prefix, "--force"]) == 0
    assert "unlocked users/alice/s@v0" in capsys.readouterr().out
    assert not location.has_file(location.path(lease_path("users/alice/s/v0")))


def test_unlock_help_explains_itself() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    text = commands.choices["unlock"].format_help()  # type: ignore[attr-defined]
    for phrase in ("name@version", "--prefix", "--force", "who held the lease", "exit codes"):
        assert phrase in text, phrase
