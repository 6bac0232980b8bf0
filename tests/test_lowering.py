"""Handles, lowering and fingerprints: pure, stable and independent of where data lives."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import pathlib
import sys
from typing import Any

import pytest

from marin.execution.errors import (
    ConfigError,
    CycleError,
    DuplicateStepError,
    InvalidStepError,
)
from marin.execution.lazy import OUT, ArtifactStep, apply, lower
from marin.execution.pipeline.context import StepContext
from marin.execution.step_spec import StepSpec


def fn(x: Any = None, out_path: str = "", data: Any = None, items: Any = None) -> None:
    return None


def test_apply_rejects_arguments_fn_does_not_take() -> None:
    with pytest.raises(TypeError, match=r"nonsense.*step s@v0"):
        apply("s", fn, version="v0", nonsense=1)


def test_spec_fields() -> None:
    a = apply("data/raw", fn, version="v1", x=1, out_path=OUT)
    b = apply("data/clean", fn, version="v2", data=a, out_path=OUT).with_options(
        retries=2, pool="gpu"
    )
    spec = b.lower()
    assert isinstance(spec, StepSpec)
    assert spec.name == "data/clean" and spec.version == "v2" and spec.step_id == "data/clean@v2"
    assert spec.output_path == "data/clean/v2"
    assert [d.step_id for d in spec.deps] == ["data/raw@v1"]
    assert spec.retries == 2 and spec.pool == "gpu"
    for key in ("git_commit", "git_dirty", "user", "host", "argv", "time"):
        assert key in spec.provenance
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


def test_handles_nested_in_containers_become_dependencies_and_paths() -> None:
    a, b, c = (apply(n, fn, version="v0", out_path=OUT) for n in ("a", "b", "c"))
    step = apply("s", fn, version="v0", items={"l": [a, (b,)], "d": {"k": c}}, out_path=OUT)
    assert {d.step_id for d in step.deps} == {"a@v0", "b@v0", "c@v0"}
    spec = step.lower()
    ctx = StepContext(
        output_path="/p/s/v0", prefix="/p", region=None,
        dep_paths={f"{n}@v0": f"/p/{n}/v0" for n in "abc"},
    )  # fmt: skip
    assert spec.build_config(ctx) == {
        "items": {"l": ["/p/a/v0", ("/p/b/v0",)], "d": {"k": "/p/c/v0"}},
        "out_path": "/p/s/v0",
    }


def test_fingerprint_stable_and_independent_of_prefix(tmp_path: Any) -> None:
    def make() -> ArtifactStep:
        a = apply("a", fn, version="v0", x={"b": 1, "a": [1, 2]}, out_path=OUT)
        return apply("b", fn, version="v0", data=a, out_path=OUT)

    first, second = make().lower(), make().lower()
    assert first.fingerprint == second.fingerprint
    assert first is not second
    # Where the data lives never enters the fingerprint: it is only joined at run time.
    assert "{OUT}" in first.fingerprint_payload and "{DEP:a}" in first.fingerprint_payload
    assert str(tmp_path) not in first.fingerprint_payload


def test_fingerprint_changes_with_a_literal_and_a_dependency_version() -> None:
    base = apply("b", fn, version="v0", data=apply("a", fn, version="v0", x=1), x=1)
    literal = apply("b", fn, version="v0", data=apply("a", fn, version="v0", x=1), x=2)
    dep_version = apply("b", fn, version="v0", data=apply("a", fn, version="v1", x=1), x=1)
    dep_literal = apply("b", fn, version="v0", data=apply("a", fn, version="v0", x=9), x=1)
    fps = [h.lower().fingerprint for h in (base, literal, dep_version)]
    assert len(set(fps)) == 3
    # Only the dependency's name@version enters: an upstream config change is upstream drift.
    assert dep_literal.lower().fingerprint == fps[0]


def test_memo_shares_one_spec_for_a_shared_dependency() -> None:
    dataset = apply("dataset", fn, version="v1", x="src")
    model_a = apply("model_a", fn, version="v0", data=dataset, out_path=OUT)
    model_b = apply("model_b", fn, version="v0", data=dataset, out_path=OUT)
    memo: dict[Any, Any] = {}
    spec_a, spec_b = model_a.lower(memo=memo), model_b.lower(memo=memo)
    assert spec_a.deps[0] is spec_b.deps[0]
    without = model_b.lower()
    assert without.deps[0] is not spec_a.deps[0]
    specs = lower(model_a, model_b)
    assert specs[0].deps[0] is specs[1].deps[0]


def test_lowering_is_pure(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "p"))
    calls: list[int] = []
    step = apply("s", lambda out_path: calls.append(1), version="v0", out_path=OUT)
    step.lower()
    assert calls == [] and not (tmp_path / "p").exists()


def test_a_chain_twenty_times_the_recursion_limit_deep_lowers() -> None:
    """No walk of lowering recurses: a recursive one fails past ``sys.getrecursionlimit()``
    (Marin never raises it), so twenty times that depth proves it without a 100k chain."""
    deep = 20 * sys.getrecursionlimit()

    def link(prev: Any = None) -> None:
        return None

    handle = apply("c/0", link, version="v0")
    for i in range(1, deep):
        handle = ArtifactStep(name=f"c/{i}", version="v0", run=lambda config: None, deps=(handle,))
    spec = handle.lower()
    depth = 0
    while spec.deps:
        spec = spec.deps[0]
        depth += 1
    assert depth == deep - 1


def test_cycle_is_named() -> None:
    a = apply("a", fn, version="v0")
    b = apply("b", fn, version="v0", data=a)
    object.__setattr__(a, "deps", (b,))
    with pytest.raises(CycleError, match=r"cycle (a@v0 -> b@v0 -> a@v0|b@v0 -> a@v0 -> b@v0)"):
        lower(b)


def test_two_definitions_of_one_name_version_are_an_error() -> None:
    one = apply("same", fn, version="v0", x=1)
    two = apply("same", fn, version="v0", x=2)
    with pytest.raises(DuplicateStepError, match=r"same@v0.*config.x: 1 -> 2"):
        lower(apply("top", fn, version="v0", items=[one, two]))
    # Two handles with one definition are one step.
    same = lower(apply("top", fn, version="v0", items=[one, apply("same", fn, version="v0", x=1)]))
    assert same.deps[0] is same.deps[1]


class Color(enum.Enum):
    RED = 1


@dataclasses.dataclass
class Opt:
    lr: float
    path: pathlib.Path


def test_canonical_config_handles_rich_types() -> None:
    value = {"s": {3, 1, 2}, "t": (1, 2), "e": Color.RED, "d": Opt(0.1, pathlib.Path("/x"))}
    step = apply("s", fn, version="v0", x=value)
    payload = step.lower().fingerprint_payload
    assert '"s":{"__set__":[1,2,3]}' in payload and '"t":[1,2]' in payload  # issue 49
    assert '"__enum__":"Color.RED"' in payload and '"path":"/x"' in payload
    reordered = {"d": Opt(0.1, pathlib.Path("/x")), "e": Color.RED, "t": (1, 2), "s": {2, 3, 1}}
    assert apply("s", fn, version="v0", x=reordered).lower().fingerprint == step.lower().fingerprint


def _color(value: Any) -> Any:
    return enum.Enum("Color", {"RED": value})


def test_an_enum_members_value_is_part_of_the_config() -> None:
    """Red team r17-5: a member was its class's name and its own name alone, so a member whose
    value was edited (or a class of the same name elsewhere) was the same config, though ``fn``
    sees the value. A value with no stable form leaves the name alone standing for it."""
    prints = {
        v: apply("s", fn, version="v0", x=_color(v).RED).lower().fingerprint
        for v in ("r", "red", 1)
    }
    assert len(set(prints.values())) == 3
    assert apply("s", fn, version="v0", x=_color("r").RED).lower().fingerprint == prints["r"]
    key = apply("s", fn, version="v0", x={_color("r").RED: 1}).lower().fingerprint
    assert key != apply("s", fn, version="v0", x={_color("red").RED: 1}).lower().fingerprint
    thing = _color(object()).RED
    payload = apply("s", fn, version="v0", x=thing).lower().fingerprint_payload
    assert '"x":{"__enum__":"Color.RED"}' in payload


@pytest.mark.parametrize(
    "tagged, spelled",
    [
        ({1, 2}, {"__set__": [1, 2]}),
        (datetime.date(2020, 1, 2), {"__date__": "2020-01-02"}),
        (b"\x01", {"__bytes__": "01"}),
        (Color.RED, {"__enum__": "Color.RED", "value": 1}),
        (Opt(0.1, pathlib.Path("/x")), {"__dataclass__": "Opt", "lr": 0.1, "path": "/x"}),
        ({"__dict__": {}}, {"__dict__": {"__dict__": {}}}),
    ],
)
def test_a_dict_spelling_a_type_tag_is_not_that_type(tagged: Any, spelled: Any) -> None:
    """A plain dict whose keys spell a type tag never shares the tagged value's fingerprint."""
    one, other = (apply("s", fn, version="v0", x=v).lower().fingerprint for v in (tagged, spelled))
    assert one != other


@pytest.mark.parametrize(
    "bad, path",
    [
        (lambda: 1, "config.x"),
        ({"inner": [1, object()]}, r"config.x.inner\[1\]"),
    ],
)
def test_unserialisable_config_names_the_field(bad: Any, path: str) -> None:
    with pytest.raises(ConfigError, match=rf"{path} holds a .*step s@v0"):
        apply("s", fn, version="v0", x=bad).lower()


def test_open_file_in_config_is_rejected(tmp_path: Any) -> None:
    with (
        open(tmp_path / "f", "w") as handle,
        pytest.raises(ConfigError, match=r"config.x holds a _io"),
    ):
        apply("s", fn, version="v0", x=handle).lower()


@pytest.mark.parametrize(
    "name", ["", "a//b", "../up", "a/../b", "/abs", "gs://bucket/x", "has space", "tab\there",
             "nl\nx", "ctl\x01", "back\\slash", "meta.marin/x"],
)  # fmt: skip
def test_unsafe_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidStepError, match="error: "):
        apply(name, fn, version="v0")


@pytest.mark.parametrize("version", ["", "a/b", "..", "v 1", "x\n"])
def test_unsafe_versions_are_rejected(version: str) -> None:
    with pytest.raises(InvalidStepError, match=r"version.*step s"):
        apply("s", fn, version=version)


@pytest.mark.parametrize("version", ["v0", "2026.11.29", "dev", "exp-dev", "ünïcode"])
def test_any_other_version_is_accepted(version: str) -> None:
    spec = apply("s", fn, version=version).lower()
    assert spec.mutable == (version in ("dev", "exp-dev"))


def test_dependency_that_is_not_a_handle_is_rejected() -> None:
    with pytest.raises(InvalidStepError, match=r"deps\[0\] is a str.*step s@v0"):
        ArtifactStep(name="s", version="v0", run=lambda config: None, deps=("a/v0",))  # type: ignore[arg-type]


# --- lower()'s graph check: one walk when it saw the whole graph, collect_steps otherwise -----


def test_nested_output_deep_in_a_fresh_graph_is_refused_naming_both_steps() -> None:
    inner = apply("team/exp", fn, version="v0", out_path=OUT)
    outer = apply("team", fn, version="exp", out_path=OUT)
    top = apply("top", fn, version="v0", items=[apply("mid", fn, version="v0", data=inner), outer])
    with pytest.raises(DuplicateStepError, match=r"team@exp \(team/exp\) contains .*team/exp@v0"):
        lower(top)


def test_nested_output_is_refused_through_a_shared_memo() -> None:
    """A memo shared with an earlier lower(): the walk no longer sees the whole graph."""
    inner = apply("team/exp", fn, version="v0", out_path=OUT)
    outer = apply("team", fn, version="exp", out_path=OUT)
    memo: dict[Any, Any] = {}
    lower(inner, memo=memo)
    with pytest.raises(DuplicateStepError, match="contains the output of team/exp@v0"):
        lower(apply("top", fn, version="v0", items=[inner, outer]), memo=memo)


def test_nested_output_is_refused_below_a_spec_lowered_elsewhere() -> None:
    inner_spec = apply("team/exp", fn, version="v0", out_path=OUT).lower()
    outer = apply("team", fn, version="exp", out_path=OUT)
    with pytest.raises(DuplicateStepError, match="contains the output of team/exp@v0"):
        lower(apply("top", fn, version="v0", items=[inner_spec, outer]))
    with pytest.raises(DuplicateStepError, match="contains the output of team/exp@v0"):
        lower(inner_spec, outer)


def test_two_definitions_are_refused_when_one_sits_below_a_spec_lowered_elsewhere() -> None:
    spec_one = apply("mid", fn, version="v0", data=apply("x", fn, version="v0", x=1)).lower()
    two = apply("x", fn, version="v0", x=2)
    with pytest.raises(DuplicateStepError, match=r"x@v0.*config.x: 1 -> 2"):
        lower(apply("top", fn, version="v0", items=[spec_one, two]))


def test_sibling_names_that_share_a_prefix_are_not_nested() -> None:
    """``a/v0-x`` and ``a/v0/...`` sort between ``a/v0`` and its children: neither is inside."""
    steps = [apply(n, fn, version=v, out_path=OUT) for n, v in [("a", "v0"), ("a/v0-x", "v1"),
             ("a/v0.y", "v1"), ("a", "v0.z"), ("ab", "v0")]]  # fmt: skip
    assert [s.step_id for s in lower(steps)] == [s.step_id for s in steps]


# --- the fingerprinted config is the config a build sees, with context values as placeholders ---


def _reference_config(spec: StepSpec) -> Any:
    from marin.execution.pipeline.canonical import to_canonical
    from marin.execution.pipeline.context import fingerprint_context

    return to_canonical(spec.build_config(fingerprint_context(spec.deps)), "config", spec.step_id)


def test_fingerprinted_config_equals_materialise_then_canonicalise() -> None:
    from marin.execution.pipeline.graph import collect_steps
    from tests.fingerprint_cases import rich_cases

    for spec in collect_steps(lower(rich_cases())):
        assert json.loads(spec.fingerprint_payload)["config"] == json.loads(
            json.dumps(_reference_config(spec))
        ), spec.step_id


def test_a_handle_in_the_config_that_is_not_a_dependency_fails_as_before() -> None:
    """A hand-made handle reusing apply()'s call with other deps is refused, naming the dep."""
    a = apply("a", fn, version="v0", out_path=OUT)
    made = apply("s", fn, version="v0", data=a)
    stray = ArtifactStep(name="s", version="v1", run=made.run, build_config=made.build_config)
    with pytest.raises(KeyError, match=r"a@v0 is not a dependency of this step"):
        lower(stray)


def test_bad_config_keys_and_values_still_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"config.x.k has a key of type object"):
        lower(apply("s", fn, version="v0", x={"k": {object(): "a"}}))
    with pytest.raises(ConfigError, match=r"config.x.inner\[1\]\{\} holds a .*object"):
        lower(apply("s", fn, version="v0", x={"inner": [1, {object()}]}))
