"""Absurd input gives a clear error, not a traceback (issue 43 item 12): fingerprint functions
that return their own type or lead back to one another, and a NUL byte in a prefix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from marin.execution.errors import ConfigError, StorageError
from marin.execution.lazy import OUT, apply, lower
from marin.execution.pipeline.canonical import _lookup_cache, _registered, register_fingerprint
from marin.execution.store.location import open_prefix


class Opaque:
    def __init__(self, value: object) -> None:
        self.value = value


class Other:
    def __init__(self, value: object) -> None:
        self.value = value


def _keep(out: str, thing: object) -> None:
    return None


@pytest.fixture
def clean_registry() -> Iterator[None]:
    saved = dict(_registered)
    yield
    _registered.clear()
    _registered.update(saved)
    _lookup_cache.clear()


def test_a_fingerprint_function_that_returns_its_own_type_is_a_clear_error(
    clean_registry: None,
) -> None:
    register_fingerprint(Opaque, lambda v: v)
    with pytest.raises(ConfigError) as info:
        lower(apply("e", _keep, version="v1", out=OUT, thing=Opaque(1)))
    text = str(info.value)
    assert "config.thing: the fingerprint function registered for Opaque returned a Opaque" in text
    assert "(step e@v1)" in text and "return plain data" in text


def test_fingerprint_functions_that_lead_back_to_one_another_are_a_clear_error(
    clean_registry: None,
) -> None:
    register_fingerprint(Opaque, lambda v: Other(v.value))
    register_fingerprint(Other, lambda v: Opaque(v.value))
    with pytest.raises(ConfigError, match="lead back to one another") as info:
        lower(apply("e", _keep, version="v1", out=OUT, thing=Opaque(1)))
    assert "(step e@v1)" in str(info.value)


@pytest.mark.parametrize("prefix", ["{tmp}/a\x00b", "memory://absurd/a\x00b"])
def test_a_nul_byte_in_a_prefix_is_refused_before_anything_runs(
    tmp_path: Path, prefix: str
) -> None:
    from marin.execution.step_runner import StepRunner

    prefix = prefix.format(tmp=tmp_path)
    with pytest.raises(StorageError, match="contains a NUL byte") as info:
        open_prefix(prefix)
    assert "remove it from the prefix" in str(info.value)
    with pytest.raises(StorageError, match="contains a NUL byte"):
        StepRunner(prefix=prefix).run(lower(apply("e", _keep, version="v1", out=OUT, thing=1)))
    assert list(tmp_path.iterdir()) == []
