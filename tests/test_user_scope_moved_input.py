"""A user's build that read a shared input is stale once the user's run moves that input.

Found by the random-history checker (tests/oracle, soak seed 1132; pinned as
``a-user-run-serves-its-build-of-a-shared-input-it-moved``): alice's ``c`` was built in her
folder from the shared ``b``. Once ``a`` changed, her run placed ``a``, then ``b``, in her
folder (``plan/scope.py``); ``b`` had no record there and read as a pruned intermediate, so her
``c`` was served, built from the old ``a``, even under ``--on-drift rebuild``. The shared build
of a step the user's run places in her folder is now what her records read
(``Upstream.shared``): they are stale, and rebuilt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from marin.execution.lazy import OUT, apply, run
from marin.execution.store.location import open_prefix
from marin.execution.store.records import read_record


def _step(out: str, name: str, k: int, ins: list[str]) -> str:
    text = f"{name}{k}(" + "".join(Path(i, "data").read_text() for i in ins) + ")"
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, "data").write_text(text)
    return text


def make(out: str, cfg: dict[str, Any], ins: list[str]) -> str:
    return _step(out, cfg["name"], cfg["k"], ins)


def chain(ka: int, kc: int) -> Any:
    """``a -> b -> c``; ``ka``, ``kc``: a's and c's configs (no version bump)."""
    a = apply("a", make, version="v1", out=OUT, cfg={"name": "a", "k": ka}, ins=[])
    b = apply("b", make, version="v1", out=OUT, cfg={"name": "b", "k": 0}, ins=[a])
    return apply("c", make, version="v1", out=OUT, cfg={"name": "c", "k": kc}, ins=[b])


def test_a_user_build_of_a_moved_shared_input_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARIN_USER", "alice")
    prefix = str(tmp_path / "p")
    run(chain(1, 1), prefix=prefix)  # the team's shared a, b, c
    run(chain(1, 2), prefix=prefix, scope="user")  # c drifted: alice's c reads shared b
    location = open_prefix(prefix)
    shared_b, mine = read_record(location, "b/v1"), read_record(location, "users/alice/c/v1")
    assert shared_b is not None and mine is not None
    assert mine.inputs["b@v1"] == shared_b.build_id
    (c,) = run(chain(2, 2), prefix=prefix, on_drift="rebuild", scope="user")  # a changed
    assert (tmp_path / "p/users/alice/c/v1/data").read_text() == "c2(b0(a2()))"
    assert c.record is not None and c.record.build_id != mine.build_id
    b = read_record(location, "users/alice/b/v1")
    assert b is not None and c.record.inputs["b@v1"] == b.build_id
    assert read_record(location, "b/v1") == shared_b  # the shared builds are untouched
