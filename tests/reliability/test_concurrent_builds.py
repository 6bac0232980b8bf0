"""Builds racing each other on one prefix: an input rebuilt under its reader, two forced rebuilds
of one step, and a step's fn asking for its own step. Each test holds one build inside its fn
with an event and lets the other go on a log line it waits for: no sleeps."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

import fsspec
import pytest

from marin.execution.builder.commit import BuildOutcome, build_step
from marin.execution.builder.request import BuildRequest
from marin.execution.errors import InputChangedError, LeaseVanishedError, StepFailedError
from marin.execution.lazy import OUT, apply, run
from marin.execution.plan.decide import Policy, Stored, Upstream, decide
from marin.execution.store.lease import TTL_ENV, Lease
from marin.execution.store.location import open_prefix
from marin.execution.store.records import delete_record, read_record, read_status

WAIT_S = 30.0
"""How long a test waits for an event that the fixed code always reaches at once."""


class Background:
    """One call on a thread; ``result()`` re-raises what it raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def target() -> None:
            try:
                self._value = fn()
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the build never ended"
        if self._error is not None:
            raise self._error
        return self._value


def _write(url: str, text: str) -> None:
    with fsspec.open(url, "w") as f:
        f.write(text)


def _read(url: str) -> str:
    with fsspec.open(url) as f:
        return str(f.read().decode())


class Source:
    """The fn of step ``s``: writes ``part1`` and ``part2`` holding one token per call, and can
    be held between the two (so its output is half rewritten) until ``go`` is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.hold = False
        self.inside = threading.Event()
        self.go = threading.Event()

    def __call__(self, out_path: str) -> str:
        self.calls += 1
        token = f"build-{self.calls}"
        fs, path = fsspec.core.url_to_fs(out_path)
        fs.makedirs(path, exist_ok=True)
        _write(f"{out_path}/part1", token)
        if self.hold:
            self.inside.set()
            assert self.go.wait(WAIT_S)
        _write(f"{out_path}/part2", token)
        return token


def _pipeline(source: Source, reader: Callable[..., Any]) -> tuple[Any, Any]:
    # The objects as fns: their Events and counters are in the code digest, unseen (never
    # refused: docs/caching.md).
    s = apply("s", source, version="v0", out_path=OUT)
    use = apply("use", reader, version="v0", src=s, out_path=OUT)
    return s.lower(), use.lower()


def _whole(src: str) -> str:
    parts = [_read(f"{src}/part1"), _read(f"{src}/part2")]
    assert parts[0] == parts[1], f"read a half-rewritten input: {parts}"
    return parts[0]


# -- item 5: an input rebuilt while a step builds from it -----------------------------------------


def test_a_build_waits_for_an_input_that_another_runner_is_rebuilding(
    store_prefix: str, log_event: Callable[[str], threading.Event]
) -> None:
    """Run A rebuilds ``s`` (``--force``) while run B, which planned ``s`` as built, starts
    ``use``: B waits for A's lease, then builds ``use`` from A's whole, committed build."""
    location = open_prefix(store_prefix)
    source = Source()
    s, use = _pipeline(source, lambda src, out_path: _whole(src))
    first = build_step(BuildRequest(s, location))
    waiting = log_event("wait use@v0: input s@v0 is being rebuilt")
    source.hold = True
    rebuild = Background(lambda: build_step(BuildRequest(s, location, policy=Policy(force=frozenset({s.step_id})))))
    try:
        assert source.inside.wait(WAIT_S)
        # B's plan read s's first build; s's output is half rewritten now.
        reader = Background(
            lambda: build_step(BuildRequest(use, location, upstream=[Upstream(s.step_id, first.record)]))
        )
        assert waiting.wait(WAIT_S), "use started from an input whose lease a rebuilder holds"
    finally:
        source.go.set()
    rebuilt: BuildOutcome = rebuild.result()
    built: BuildOutcome = reader.result()
    assert built.action == "built" and built.record.result == "build-2"
    assert built.record.inputs == {s.step_id: rebuilt.record.build_id}


class HeldReader:
    """The fn of ``use``: reads ``s`` whole, sets ``read_it``, then waits for ``go``."""

    def __init__(self) -> None:
        self.read_it = threading.Event()
        self.go = threading.Event()

    def __call__(self, src: str, out_path: str) -> str:
        token = _whole(src)
        self.read_it.set()
        assert self.go.wait(WAIT_S)
        return token


def test_a_build_whose_input_was_rebuilt_while_it_ran_does_not_commit(store_prefix: str) -> None:
    """``use`` reads ``s``; then another runner rebuilds ``s`` before ``use`` commits: ``use``
    discards its attempt, names the input, and leaves no record (nothing stale reads as valid)."""
    location = open_prefix(store_prefix)
    reader = HeldReader()
    read_it, go = reader.read_it, reader.go
    s, use = _pipeline(Source(), reader)
    first = build_step(BuildRequest(s, location))
    attempt = Background(
        lambda: build_step(BuildRequest(use, location, upstream=[Upstream(s.step_id, first.record)]))
    )
    try:
        assert read_it.wait(WAIT_S)
        assert build_step(BuildRequest(s, location, policy=Policy(force=frozenset({s.step_id})))).action == "built"  # run A, meanwhile
    finally:
        go.set()
    with pytest.raises(InputChangedError) as caught:
        attempt.result()
    assert caught.value.step == use.step_id and "input s@v0 was rebuilt" in caught.value.what
    assert read_record(location, use.output_path) is None
    assert (read_status(location, use.output_path) or {}).get("state") == "FAILED"
    again = build_step(BuildRequest(use, location))  # the next attempt builds from the new s
    assert again.action == "built" and again.record.result == "build-2"


def test_a_rebuild_that_holds_the_lease_but_kept_the_record_is_caught_at_the_commit(
    store_prefix: str,
) -> None:
    """The window the start check leaves open: a rebuilder of ``s`` has taken its lease and not
    yet deleted its record. ``use`` starts from that record (it is the build the run knows, so
    no lease is read); the rebuilder then deletes it, as it does before touching the output,
    and ``use`` discards its attempt instead of committing from a changing input."""
    location = open_prefix(store_prefix)
    reader = HeldReader()
    read_it, go = reader.read_it, reader.go
    s, use = _pipeline(Source(), reader)
    first = build_step(BuildRequest(s, location))
    rebuilder = Lease(location, s.output_path, ttl=60.0)
    assert rebuilder.try_acquire() is None  # another runner's live lease, record still there
    try:
        attempt = Background(
            lambda: build_step(BuildRequest(use, location, upstream=[Upstream(s.step_id, first.record)]))
        )
        assert read_it.wait(WAIT_S), "use waited although s's record is the known build"
        delete_record(location, s.output_path)  # the rebuilder's first write
        go.set()
        with pytest.raises(InputChangedError) as caught:
            attempt.result()
    finally:
        go.set()
        rebuilder.release()
    assert caught.value.step == use.step_id and "no record" in caught.value.what
    assert read_record(location, use.output_path) is None


# -- item 6: two concurrent forced rebuilds of one step ------------------------------------------


def test_two_concurrent_forced_rebuilds_build_the_step_once(
    store_prefix: str, log_event: Callable[[str], threading.Event]
) -> None:
    """Both runs planned ``--force s`` on the same old record. The second gets the lease after
    the first committed: that build is its forced build too, served as built-by-other."""
    location = open_prefix(store_prefix)
    source = Source()
    s, _ = _pipeline(source, lambda src, out_path: None)
    old = build_step(BuildRequest(s, location)).record
    forced = Policy(force=frozenset({s.step_id}))
    plans = [decide(s, Stored(old), [], forced, needed=True) for _ in range(2)]
    waiting = log_event("wait s@v0: lease held by")
    source.hold = True
    first = Background(lambda: build_step(BuildRequest(s, location, policy=forced, decision=plans[0])))
    try:
        assert source.inside.wait(WAIT_S)
        second = Background(lambda: build_step(BuildRequest(s, location, policy=forced, decision=plans[1])))
        assert waiting.wait(WAIT_S)
    finally:
        source.go.set()
    a: BuildOutcome = first.result()
    b: BuildOutcome = second.result()
    assert a.action == "built" and b.action == "built-by-other"
    assert source.calls == 2, "the forced step was built twice"
    assert b.record.build_id == a.record.build_id != old.build_id


def _write_k(out_path: str, k: int) -> int:
    _write(out_path, f"k={k}")
    return k


@pytest.mark.parametrize("forced", [False, True])
def test_a_build_another_runner_commits_of_another_config_is_never_this_runs(
    store_prefix: str, forced: bool
) -> None:
    """Red team r11-4: run B planned ``a`` with ``k=2`` while run A built it with ``k=1``;
    after A's lease, B served A's build as built-by-other (under ``--on-drift warn``), with no
    drift said, and its readers read ``k=1``. Drift is served only from a record committed
    before the run: B builds its own config (both runs ``--force a`` too)."""
    location = open_prefix(store_prefix)
    a1 = apply("a", _write_k, version="v1", out_path=OUT, k=1).lower()
    a2 = apply("a", _write_k, version="v1", out_path=OUT, k=2).lower()
    old = build_step(BuildRequest(a1, location)).record if forced else None
    policy = Policy(force=frozenset({a2.step_id} if forced else ()))
    planned = decide(a2, Stored(old), [], policy, needed=True)  # B's plan, before A commits
    a_built = build_step(BuildRequest(a1, location, policy=Policy(force=policy.force)))
    assert a_built.action == "built"
    b_built = build_step(BuildRequest(a2, location, policy=policy, decision=planned))
    assert b_built.action == "built" and b_built.record.config["k"] == 2
    assert _read(f"{location.url_for(a2.output_path)}") == "k=2"


# -- item 8: fn runs its own step ------------------------------------------------------------------


def test_fn_that_runs_its_own_step_fails_clearly_instead_of_hanging(tmp_path: Any) -> None:
    prefix = str(tmp_path / "p")
    handles: dict[str, Any] = {}

    def selfish(out_path: str) -> str:
        run(handles["me"], prefix=prefix)
        return "never"

    handles["me"] = apply("selfish", selfish, version="v0", out_path=OUT)
    with pytest.raises(StepFailedError) as caught:
        Background(lambda: run(handles["me"], prefix=prefix)).result()
    message = str(caught.value)
    assert "selfish@v0 is being built by the very build whose fn asked for it" in message
    assert "run() called from inside its own fn" in message
    location = open_prefix(prefix)
    assert read_record(location, "selfish/v0") is None
    assert (read_status(location, "selfish/v0") or {}).get("state") == "FAILED"


# -- item 12: blame where it belongs -------------------------------------------------------------


def test_fn_that_deletes_its_own_metadata_folder_is_told_so(tmp_path: Any) -> None:
    prefix = str(tmp_path / "p")

    def vandal(out_path: str) -> str:
        _write(out_path, "x")
        shutil.rmtree(out_path + ".marin")
        return "x"

    spec = apply("vandal", vandal, version="v0", out_path=OUT).lower()
    location = open_prefix(prefix)
    with pytest.raises(LeaseVanishedError) as caught:
        build_step(BuildRequest(spec, location))
    what = caught.value.what
    assert "metadata folder" in what and "was deleted while fn ran" in what
    assert "another runner" not in str(caught.value)
    assert read_record(location, spec.output_path) is None
    # The failure is on record beside the output, so the next build clears it and builds.
    assert (read_status(location, spec.output_path) or {}).get("state") == "FAILED"


def test_fn_that_garbles_the_lease_ttl_setting_does_not_fail_the_next_step(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Engine settings are read once, when the run starts: a fn changing the environment
    can't make another step fail on it (nor this one)."""
    monkeypatch.delenv(TTL_ENV, raising=False)

    def meddle(out_path: str) -> str:
        os.environ[TTL_ENV] = "garbage"  # monkeypatch restores it
        return "a"

    a = apply("a", meddle, version="v0", out_path=OUT)
    b = apply("b", lambda a, out_path: "b", version="v0", a=a, out_path=OUT)
    monkeypatch.setenv(TTL_ENV, "60")
    artifacts = run(b, prefix=str(tmp_path / "p"))
    assert os.environ[TTL_ENV] == "garbage"
    assert [x.record.result for x in artifacts] == ["b"]  # type: ignore[union-attr]
