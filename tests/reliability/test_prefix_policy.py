"""Issue 11 item 7: ``MARIN_ALLOWED_PREFIXES`` keeps runs inside the worker's allowed roots.

Real builds on local disk, ``memory://`` and moto S3 on loopback (``store_prefix``): a run whose
prefix is outside every root fails before it touches storage, so nothing appears or disappears
there; one inside builds as usual. The Airflow ``prefix`` param goes through ``choose_prefix``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import pytest

from marin.execution.errors import StorageError
from marin.execution.lazy import OUT, apply, run
from marin.execution.store.location import open_prefix, resolve_prefix
from marin.execution.store.prefix_policy import ALLOWED_ENV, check_prefix
from marin_airflow.runtime import choose_prefix


def write(out: str) -> str:
    with fsspec.open(f"{out}/data.txt", "w") as f:
        f.write("x")
    return "ok"


def _tree(url: str) -> dict[str, Any]:
    """Every file under ``url`` with its bytes (object stores have no real folders)."""
    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return {p: fs.cat_file(p) for p in fs.find(root)}


def test_unset_allows_everything(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ALLOWED_ENV, raising=False)
    assert check_prefix("/anything/at/all") == "/anything/at/all"
    assert open_prefix(str(tmp_path / "x")).url == str(tmp_path / "x")


def test_runs_outside_the_roots_fail_before_touching_storage(
    store_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = f"{store_prefix}/allowed"
    victim = f"{store_prefix}/victim"
    with fsspec.open(f"{victim}/keep.txt", "w") as f:
        f.write("precious")
    before = _tree(store_prefix)
    monkeypatch.setenv(ALLOWED_ENV, f"/nowhere,{allowed}")
    handle = apply("step", write, version="v0", out=OUT)
    for outside in (victim, f"{allowed}2", f"{allowed}/../victim", store_prefix):
        # An object store's '..' is refused on every worker, before the allow-list is read.
        with pytest.raises(StorageError, match=rf"{ALLOWED_ENV}|'\.\.' segment"):
            run(handle, prefix=outside)
    assert _tree(store_prefix) == before

    (artifact,) = run(handle, prefix=f"{allowed}/team")
    assert artifact.result == "ok"
    after = _tree(store_prefix)
    assert {k: v for k, v in after.items() if "/allowed/" not in k} == before
    assert any(k.endswith("/allowed/team/step/v0/data.txt") for k in after)


@pytest.mark.parametrize(
    ("roots", "prefix", "ok"),
    [
        ("/data/team", "/data/team", True),
        ("/data/team/", "/data/team/x/y", True),
        ("/data/team", "/data/team2", False),
        ("/data/team", "/data", False),
        ("/data/team", "/data/team/../other", False),
        ("/data/team", "/data/team/./x", False),
        ("/a:/data/team", "/data/team/x", True),  # os.pathsep separated
        ("s3://bucket/team", "s3://bucket/team/x", True),
        ("s3://bucket/team", "s3a://bucket/team/x", False),
        ("s3://bucket/team", "S3://bucket/team/x", False),
        ("s3://bucket/team", "s3://bucket/team-b", False),
        ("s3://bucket/team", "gs://bucket/team", False),
        ("gs://b/t,memory://m", "memory://m/run1", True),
        ("gs://b/t:memory://m", "memory://m/run1", True),
        ("s3://bucket/team", "/bucket/team", False),
        ("/data/team", "file:///data/team/x", True),
        ("/data/team", "s3://data/team", False),
    ],
)
def test_matching(monkeypatch: pytest.MonkeyPatch, roots: str, prefix: str, ok: bool) -> None:
    monkeypatch.setenv(ALLOWED_ENV, roots)
    if ok:
        check_prefix(resolve_prefix(prefix), prefix)
    else:
        with pytest.raises(StorageError, match=ALLOWED_ENV):
            check_prefix(resolve_prefix(prefix), prefix)


def test_relative_prefixes_and_the_default_are_checked_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ALLOWED_ENV, str(tmp_path / "ok"))
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    with pytest.raises(StorageError, match="outside the allowed roots"):
        open_prefix(None)  # ./marin-artifacts
    with pytest.raises(StorageError, match=r"'\.\.'"):
        open_prefix("ok/../elsewhere")
    assert open_prefix("ok/run").url == str(tmp_path / "ok" / "run")


def test_a_bad_root_is_an_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_ENV, "/data/../etc")
    with pytest.raises(StorageError, match=ALLOWED_ENV):
        open_prefix("/data/x")


def test_airflow_prefix_param_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ALLOWED_ENV, str(tmp_path / "ok"))
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    assert choose_prefix(str(tmp_path / "ok" / "a"), None) == str(tmp_path / "ok" / "a")
    assert choose_prefix(None, str(tmp_path / "ok")) == str(tmp_path / "ok")
    with pytest.raises(StorageError, match=ALLOWED_ENV):
        choose_prefix(str(tmp_path / "home"), str(tmp_path / "ok"))
    with pytest.raises(StorageError, match=ALLOWED_ENV):
        choose_prefix(None, "/etc")
    assert not (tmp_path / "home").exists()
