"""Issue 11 items 11 and 12: one artifact has one definition, and it is the one fingerprinted.

- Two different ``fn``s with one ``name@version`` and one config used to be merged silently (one
  handle returned the other's result): now a ``DuplicateStepError`` naming both functions.
- Config keys that collide as strings (``{1: "a", "1": "b"}``) used to drop one: rejected, then
  (red team round 16) kept apart: a config key keeps its type, so ``{0: x}`` and ``{"0": x}``
  are two configs; a result's keys become text, and colliding ones are still refused.
- A config changed after ``apply()`` or after ``lower()`` used to run ``fn`` with the new values
  under the old fingerprint: ``apply()`` now snapshots every literal.

Every build here is real, on local disk and ``memory://`` (the ``prefix`` fixture).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from typing import Any

import pytest

from marin.execution.errors import ConfigError, DriftError, DuplicateStepError
from marin.execution.lazy import apply, lower, run
from marin.execution.pipeline.canonical import to_canonical
from marin.execution.pipeline.graph import collect_steps


def train(lr: float) -> dict[str, Any]:
    return {"fn": "train", "lr": lr}


def evaluate(lr: float) -> dict[str, Any]:
    return {"fn": "evaluate", "lr": lr}


def test_two_functions_one_name_version_config_is_a_duplicate(prefix: str) -> None:
    a = apply("exp", train, version="v0", lr=0.1)
    b = apply("exp", evaluate, version="v0", lr=0.1)
    with pytest.raises(DuplicateStepError) as info:
        run(a, b, prefix=prefix)
    message = str(info.value)
    assert "exp@v0" in message and "train" in message and "evaluate" in message
    with pytest.raises(DuplicateStepError):
        lower([a, b])


def test_duplicate_functions_caught_across_separately_lowered_specs() -> None:
    spec_a = lower(apply("exp", train, version="v0", lr=0.1))
    spec_b = lower(apply("exp", evaluate, version="v0", lr=0.1))
    with pytest.raises(DuplicateStepError, match="evaluate"):
        collect_steps([spec_a, spec_b])


def test_same_function_twice_is_still_one_step(prefix: str) -> None:
    a = apply("exp", train, version="v0", lr=0.1)
    b = apply("exp", train, version="v0", lr=0.1)
    c = apply("exp", functools.partial(train), version="v0", lr=0.1)
    artifacts = run(a, b, c, prefix=prefix)
    assert [x.result for x in artifacts] == [{"fn": "train", "lr": 0.1}] * 3
    assert len(collect_steps(lower([a, b, c]))) == 1


KEYED_ALIKE = [
    ({0: "x"}, {"0": "x"}),
    ({True: "x"}, {"True": "x"}),
    ({1.0: "x"}, {"1.0": "x"}),
    ({1: "x"}, {1.0: "x"}),  # one key to Python (1 == 1.0): still a float against an int
    ({"outer": {2: "x"}}, {"outer": {"2": "x"}}),
]


@pytest.mark.parametrize(("one", "other"), KEYED_ALIKE)
def test_config_keys_of_another_type_are_another_config(one: Any, other: Any) -> None:
    """``r16-repro-1.sh``: ``{0: x}`` and ``{"0": x}`` had one fingerprint, so switching between
    them served the other config's build, even under ``--on-drift error``."""

    def fn(config: Any) -> None:
        return None

    first = lower(apply("keys", fn, version="v0", config=one))
    second = lower(apply("keys", fn, version="v0", config=other))
    assert first.fingerprint != second.fingerprint


def test_an_enum_key_is_not_its_members_name() -> None:
    import enum

    class Split(enum.Enum):
        TRAIN = "train"

    def fn(config: Any) -> None:
        return None

    as_enum = lower(apply("keys", fn, version="v0", config={Split.TRAIN: 1}))
    as_name = lower(apply("keys", fn, version="v0", config={"TRAIN": 1}))
    assert as_enum.fingerprint != as_name.fingerprint


def test_config_keys_that_would_collide_as_strings_are_both_kept(prefix: str) -> None:
    seen: list[Any] = []

    def fn(config: Any) -> None:
        seen.append(config)

    config = {1: "a", "1": "b", "outer": {True: 1, "True": 2}}
    run(apply("keys", fn, version="v0", config=config), prefix=prefix)
    assert seen == [config]
    record = json.loads(_read(f"{prefix}/keys/v0.marin/record.json"))
    # Sorted by each key's JSON: '"1"' < '"outer"' < '1'.
    assert record["config"]["config"]["__map__"] == [["1", "b"], ["outer", {
        "__map__": [["True", 2], [True, 1]]}], [1, "a"]]  # fmt: skip


def test_a_switch_between_keys_of_two_types_is_drift_not_served(tmp_path: Any) -> None:
    """Through the CLI: under ``--on-drift error`` the other config is drift, never served."""
    from marin.cli import main

    body = (
        "from marin.execution.lazy import apply\n"
        "def fn(config):\n    return sorted(map(repr, config))\n"
        "pipeline = apply('keys', fn, version='v0', config=CONFIG)\n"
    )
    prefix = str(tmp_path / "store")
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("CONFIG = {0: 'x'}\n" + body)
    second.write_text("CONFIG = {'0': 'x'}\n" + body)
    assert main(["run", f"{first}:pipeline", "--prefix", prefix]) == 0
    assert main(["run", f"{second}:pipeline", "--prefix", prefix, "--on-drift", "error"]) != 0
    record = json.loads(_read(f"{prefix}/keys/v0.marin/record.json"))
    assert record["result"] == ["0"]  # still the first config's build, not served as the other


@pytest.mark.parametrize("value", [{1: "a", "1": "b"}, {"outer": {True: 1, "True": 2}}])
def test_result_keys_colliding_as_strings_are_rejected(prefix: str, value: Any) -> None:
    from marin.execution.errors import StepFailedError

    def fn() -> Any:
        return value

    with pytest.raises((ConfigError, StepFailedError), match="both become"):
        run(apply("keys", fn, version="v0"), prefix=prefix)


def _read(url: str) -> str:
    import fsspec

    with fsspec.open(url, "r") as handle:
        return str(handle.read())


@dataclasses.dataclass
class Hparams:
    lr: float
    tags: set[str]
    layers: list[int]


def _record_config(prefix: str, name: str) -> Any:
    import fsspec

    with fsspec.open(f"{prefix}/{name}/v0.marin/record.json", "r") as f:
        return json.load(f)["config"]


def show(hp: Hparams) -> dict[str, Any]:
    return {"lr": hp.lr, "tags": sorted(hp.tags), "layers": list(hp.layers)}


def test_config_mutated_after_apply_builds_what_was_applied(prefix: str) -> None:
    hp = Hparams(lr=0.1, tags={"a"}, layers=[1, 2])
    handle = apply("mut-apply", show, version="v0", hp=hp)
    hp.lr, hp.layers[0] = 0.9, 99
    hp.tags.add("b")
    fresh = lower(apply("mut-apply", show, version="v0", hp=Hparams(0.1, {"a"}, [1, 2])))
    (artifact,) = run(handle, prefix=prefix)
    assert artifact.result == {"lr": 0.1, "tags": ["a"], "layers": [1, 2]}
    assert lower(handle).fingerprint == fresh.fingerprint
    assert _record_config(prefix, "mut-apply")["hp"]["lr"] == 0.1


def test_config_mutated_after_lower_builds_what_was_fingerprinted(prefix: str) -> None:
    hp = Hparams(lr=0.1, tags={"a"}, layers=[1, 2])
    spec = lower(apply("mut-lower", show, version="v0", hp=hp))
    hp.lr, hp.layers[0] = 0.9, 99
    hp.tags.add("b")
    (artifact,) = run(spec, prefix=prefix)
    assert artifact.result == {"lr": 0.1, "tags": ["a"], "layers": [1, 2]}
    # The same definition with the mutated values is another artifact, not a cache hit.
    other = lower(apply("mut-lower", show, version="v0", hp=hp))
    assert other.fingerprint != spec.fingerprint


def test_fn_mutating_its_config_cannot_change_the_snapshot(prefix: str) -> None:
    calls: list[float] = []

    def greedy(hp: Hparams) -> float:
        calls.append(hp.lr)
        hp.lr *= 10
        return hp.lr

    handle = apply("greedy", greedy, version="v0", hp=Hparams(1.0, set(), []))
    before = lower(handle).fingerprint
    run(handle, prefix=prefix)
    assert lower(handle).fingerprint == before
    assert calls == [1.0]


def test_handles_inside_snapshotted_literals_stay_the_same_objects() -> None:
    up = apply("up", train, version="v0", lr=0.5)

    def down(inputs: Any) -> None:
        return None

    handle = apply("down", down, version="v0", inputs=[up, {"dep": up}])
    assert handle.deps == (up,)


def test_apply_keeps_the_fingerprint_guard_only_for_inputs_that_are_not_plain_data(
    prefix: str,
) -> None:
    """Plain-data inputs cannot change after apply() (its copies are private): no guard, no
    second config evaluation per build. An object that apply() cannot copy, whose canonical
    form reads its live state, keeps the guard, which refuses the changed config."""
    import threading

    from marin.execution.errors import StepFailedError
    from marin.execution.lazy import OUT
    from marin.execution.pipeline.canonical import register_fingerprint
    from marin.execution.pipeline.lower import _FingerprintGuard

    plain = lower(apply("plain", train, version="v0", lr=0.5))
    assert not isinstance(plain.run, _FingerprintGuard)
    nested = lower(
        apply("nested", lambda cfg, out: None, version="v0", cfg={"a": [1, 2.5]}, out=OUT)
    )
    assert not isinstance(nested.run, _FingerprintGuard)

    class Knob:
        def __init__(self) -> None:
            self.lr = 0.1
            self.lock = threading.Lock()  # deepcopy fails: apply() keeps the object itself

    register_fingerprint(Knob, lambda knob: {"lr": knob.lr})
    knob = Knob()
    ran: list[float] = []
    spec = lower(apply("knob", lambda knob: ran.append(knob.lr), version="v0", knob=knob))
    assert isinstance(spec.run, _FingerprintGuard)
    knob.lr = 0.9
    with pytest.raises(StepFailedError) as info:
        run(spec, prefix=prefix)
    assert "changed after the step was lowered" in str(info.value.__cause__)
    assert ran == []


def test_hand_made_step_whose_config_changes_after_lower_refuses_to_build(prefix: str) -> None:
    from marin.execution.errors import StepFailedError
    from marin.execution.lazy import ArtifactStep
    from marin.execution.store.records import record_path

    settings = {"lr": 0.1}
    ran: list[float] = []
    handle = ArtifactStep(
        name="hand-made",
        version="v0",
        run=lambda config: ran.append(settings["lr"]),
        build_config=lambda ctx: dict(settings),  # reads live state: not snapshotted
    )
    spec = lower(handle)
    settings["lr"] = 0.9
    with pytest.raises(StepFailedError) as info:
        run(spec, prefix=prefix)
    assert isinstance(info.value.__cause__, ConfigError)
    assert "changed after the step was lowered" in str(info.value.__cause__)
    assert ran == []
    fs, root = fsspec_for(prefix)
    assert not fs.exists(f"{root}/{record_path('hand-made/v0')}")

    settings["lr"] = 0.1  # back to what was fingerprinted: builds
    run(spec, prefix=prefix)
    assert ran == [0.1]


def fsspec_for(prefix: str) -> tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(prefix)


def test_drift_between_key_types_names_each_key_by_its_type() -> None:
    from marin.execution.digest.config_drift import explain_drift

    def fn(config: Any) -> None:
        return None

    old = lower(apply("keys", fn, version="v0", config={0: "x", "b": 1}))
    new = lower(apply("keys", fn, version="v0", config={"0": "x", "b": 2}))
    assert explain_drift(old.fingerprint_payload, new.fingerprint_payload) == [
        "config.config.0: added x",
        "config.config[0]: removed (was x)",
        "config.config.b: 1 -> 2",
    ]


def _fingerprint(**config: Any) -> str:
    def fn(**_: Any) -> None:
        return None

    return lower(apply("keys", fn, version="v0", **config)).fingerprint


def test_an_enum_member_that_is_an_int_or_str_is_not_its_value() -> None:
    """``r17-repro-1.sh``: ``IntEnum``, ``StrEnum``-like and ``HTTPStatus`` members had their
    plain value's fingerprint, as values and as dict keys, so switching served the other."""
    import enum
    import http

    class Level(enum.IntEnum):
        LOW = 0

    class Mode(str, enum.Enum):  # noqa: UP042 (the mixin form the finding used)
        FAST = "fast"

    assert _fingerprint(status=http.HTTPStatus.OK) != _fingerprint(status=200)
    assert _fingerprint(level=Level.LOW) != _fingerprint(level=0)
    assert _fingerprint(mode=Mode.FAST) != _fingerprint(mode="fast")
    assert _fingerprint(keys={Level.LOW: 1}) != _fingerprint(keys={0: 1})
    assert _fingerprint(keys={Mode.FAST: 1}) != _fingerprint(keys={"fast": 1})


def test_a_string_that_spells_a_placeholder_is_not_the_path() -> None:
    """``r17-repro-3.sh``: ``note=OUT`` and ``note="{OUT}"`` (and a handle against the text of
    its placeholder) had one fingerprint; ``fn`` gets a path in one, the text in the other."""
    from marin.execution.lazy import OUT

    def make(**_: Any) -> None:
        return None

    a = apply("a", make, version="v0", out=OUT)
    assert _fingerprint(note=OUT) != _fingerprint(note="{OUT}")
    handle = lower(apply("b", make, version="v0", a=a, x=a))
    text = lower(apply("b", make, version="v0", a=a, x="{DEP:a}"))
    assert handle.fingerprint != text.fingerprint
    # Text that only looks like a placeholder around it keeps its fingerprint-free spelling.
    assert json.loads(text.fingerprint_payload)["config"]["x"] == {"__str__": "{DEP:a}"}
    assert json.loads(handle.fingerprint_payload)["config"]["x"] == "{DEP:a}"
    assert _fingerprint(note="{not a placeholder}") == _fingerprint(note="{not a placeholder}")


def test_a_path_built_from_the_output_placeholder_is_spelled_as_before() -> None:
    """A ``build_config`` that formats ``ctx.output_path`` into a string gets ``{OUT}/...`` in
    the fingerprint, as before round 17 (no pipeline's fingerprint changed), and the same text
    written literally is another config."""
    from marin.execution.lazy import ArtifactStep

    def fn(config: Any) -> None:
        return None

    def made(ctx: Any) -> dict[str, str]:
        return {"ckpt": f"{ctx.output_path}/ckpt"}

    spec = ArtifactStep(name="p", version="v0", run=fn, build_config=made).lower()
    assert json.loads(spec.fingerprint_payload)["config"] == {"ckpt": "{OUT}/ckpt"}
    literal = lower(apply("p", fn, version="v0", config={"ckpt": "{OUT}/ckpt"}))
    assert json.loads(literal.fingerprint_payload)["config"]["config"] == {
        "ckpt": {"__str__": "{OUT}/ckpt"}
    }


class _Text(str):
    """A library's ``str`` subclass (``numpy.str_``), with a ``__str__`` of its own."""

    def __str__(self) -> str:
        return "something else"


def test_a_path_or_str_subclass_spelling_a_placeholder_is_not_the_path() -> None:
    """``r18-repro-1.sh``: round 17 tagged only a plain ``str``; a ``Path`` and a ``str``
    subclass spelling ``{OUT}`` had ``OUT``'s fingerprint (and two such handles in one graph
    were one step)."""
    import pathlib

    from marin.execution.lazy import OUT, ArtifactStep

    out = _fingerprint(note=OUT)
    for spelled in (pathlib.PurePosixPath("{OUT}"), _Text("{OUT}")):
        assert _fingerprint(note=spelled) != out, repr(spelled)
    # A path is its own text, as it was; a str subclass is tagged with its class since round
    # 30 (its own ``__str__`` is what ``fn`` meets: r30-2).
    assert _fingerprint(note=pathlib.PurePosixPath("/a/{b}")) == _fingerprint(note="/a/{b}")
    assert _fingerprint(note=_Text("{OUT}")) != _fingerprint(note="{OUT}")
    assert _fingerprint(keys={_Text("{OUT}"): 1}) != _fingerprint(keys={"{OUT}": 1})  # r31-1

    def fn(config: Any) -> None:
        return None

    def made(ctx: Any) -> dict[str, Any]:
        root = pathlib.PurePosixPath(ctx.output_path)
        return {"ckpt": root / "ckpt", ctx.output_path: 1}

    spec = ArtifactStep(name="p", version="v0", run=fn, build_config=made).lower()
    assert json.loads(spec.fingerprint_payload)["config"] == {"ckpt": "{OUT}/ckpt", "{OUT}": 1}
    literal = lower(apply("p", fn, version="v0", config={"ckpt": "{OUT}/ckpt", "{OUT}": 1}))
    assert literal.fingerprint != spec.fingerprint


def test_a_flag_without_a_member_name_is_its_value() -> None:
    """``r18-repro-2.sh``: ``Perm(0)``, ``Perm(8)`` and ``Perm(16)`` (no member of that name)
    were all ``{"__enum__": "Perm.None"}`` after round 17; their values tell them apart."""
    import enum

    class Perm(enum.IntFlag):
        R = 4
        W = 2

    prints = {_fingerprint(perm=Perm(v)) for v in (0, 8, 16, 6)}
    assert len(prints) == 4


def test_a_time_zone_with_rules_and_fold_are_in_the_fingerprint() -> None:
    """Red team r18-4: an aware datetime kept only its UTC offset: UTC and Europe/London (the
    same offset in winter) were one config, though ``fn`` gets other times from them."""
    import datetime
    import zoneinfo

    winter = datetime.datetime(2026, 1, 5, 12, 0)
    utc = winter.replace(tzinfo=datetime.UTC)
    london = winter.replace(tzinfo=zoneinfo.ZoneInfo("Europe/London"))
    assert utc.utcoffset() == london.utcoffset()
    assert _fingerprint(at=utc) != _fingerprint(at=london)
    assert _fingerprint(at=london) == _fingerprint(at=london.replace())
    assert _fingerprint(at=london) != _fingerprint(at=london.replace(fold=1))
    assert _fingerprint(at=utc) == _fingerprint(
        at=winter.replace(tzinfo=datetime.timezone(datetime.timedelta(0)))
    )


def test_a_dataclass_field_named_like_a_tag_is_escaped() -> None:
    """Red team r18-5: a dataclass with a field ``__dataclass__="A"`` was dataclass ``A``."""

    @dataclasses.dataclass
    class A:
        x: int

    fields = {"__dataclass__": str, "x": int}
    B = dataclasses.make_dataclass("B", list(fields.items()))
    assert _fingerprint(v=A(1)) != _fingerprint(v=B(A.__qualname__, 1))


@dataclasses.dataclass
class Schedule:
    """A schedule whose warmup ``__post_init__`` sets from an ``InitVar``, not a field."""

    steps: int
    warmup_frac: dataclasses.InitVar[float] = 0.1

    def __post_init__(self, warmup_frac: float) -> None:
        self.warmup = int(self.steps * warmup_frac)

    @functools.cached_property
    def half(self) -> int:
        return self.steps // 2


def test_state_a_dataclass_sets_from_an_init_var_is_in_the_fingerprint(prefix: str) -> None:
    """Red team r23-2: ``Schedule(1000, warmup_frac=0.1)`` and ``(..., 0.3)`` were one config,
    and the first build was served for the second."""
    short, long = Schedule(1000, 0.1), Schedule(1000, 0.3)
    assert _fingerprint(s=short) != _fingerprint(s=long)

    def warmup(s: Schedule) -> int:
        return s.warmup

    run(apply("sched", warmup, version="v1", s=short), prefix=prefix)
    with pytest.raises(
        DriftError, match=r"config\.s\.__state__\.warmup: 100 -> 300 \(step sched@v1\)"
    ):
        run(apply("sched", warmup, version="v1", s=long), prefix=prefix, on_drift="error")


@dataclasses.dataclass
class Cached:
    """A config with a ``cached_property`` (a tokenizer, a derived count)."""

    total: int

    @functools.cached_property
    def warmup_steps(self) -> int:
        return self.total // 10

    @functools.cached_property
    def tokenizer(self) -> object:
        return object()


@dataclasses.dataclass
class Box(typing.Generic[typing.TypeVar("T")]):
    item: int


@dataclasses.dataclass
class Shadowed:
    """A ``cached_property`` default that ``__post_init__`` overrides from an ``InitVar``."""

    total: int
    warmup: dataclasses.InitVar[int | None] = None

    def __post_init__(self, warmup: int | None) -> None:
        if warmup is not None:
            self.warmup_steps = warmup

    @functools.cached_property
    def warmup_steps(self) -> int:
        return self.total // 10


@dataclasses.dataclass(frozen=True)
class PreSet:
    """A frozen config that pre-sets its ``cached_property`` through ``self.__dict__``."""

    total: int
    warmup: dataclasses.InitVar[int] = 100

    def __post_init__(self, warmup: int) -> None:
        self.__dict__["warmup_steps"] = warmup

    @functools.cached_property
    def warmup_steps(self) -> int:
        return self.total // 10


@dataclasses.dataclass(frozen=True)
class Helped:
    """A ``cached_property`` a helper method sets, and one a classmethod constructor sets."""

    total: int
    warmup: dataclasses.InitVar[int] = 100

    def __post_init__(self, warmup: int) -> None:
        self._set_warmup(warmup)

    def _set_warmup(self, warmup: int) -> None:
        object.__setattr__(self, "warmup_steps", warmup)

    @classmethod
    def make(cls, total: int, decay: int) -> Helped:
        made = cls(total)
        made.__dict__["decay_steps"] = decay
        return made

    @functools.cached_property
    def warmup_steps(self) -> int:
        return self.total // 10

    @functools.cached_property
    def decay_steps(self) -> int:
        return self.total // 2


@dataclasses.dataclass(init=False)
class HandMade:
    """A dataclass with its own ``__init__`` that keeps a value no field holds."""

    total: int

    def __init__(self, total: int, frac: float = 0.1) -> None:
        self.total = total
        self.warmup = int(total * frac)


class Slotted:
    __slots__ = ("warm",)


@dataclasses.dataclass
class SlottedSchedule(Slotted):
    """``__post_init__`` keeps its derived value in a slot a base class declares."""

    total: int
    frac: dataclasses.InitVar[float] = 0.1

    def __post_init__(self, frac: float) -> None:
        self.warm = int(self.total * frac)


def test_every_state_of_a_dataclass_beyond_its_fields_is_in_the_fingerprint() -> None:
    """Red team r25-4: state was counted only for a class taking an ``InitVar``: a
    hand-written ``__init__``'s, a base class's slot's, one set later were left out. ``fn``
    sees each, so each counts; a dataclass with none has the form it had. A generic's
    ``__orig_class__`` is not config (r26-2); a ``cached_property``'s value present at
    ``apply()`` is, whoever set it (r25-2, rounds 27, 31-34: r26-2 left a read one out, and no
    scan of the class's source told a set one from a read one). State with no JSON form is
    refused naming it as state and the fixes."""
    assert _fingerprint(s=HandMade(1000, 0.1)) != _fingerprint(s=HandMade(1000, 0.3))
    # r25-2: a cached_property its own __post_init__ sets is state, not a cache.
    assert _fingerprint(s=Shadowed(1000)) != _fingerprint(s=Shadowed(1000, 300))
    assert _fingerprint(s=PreSet(1000, 500)) != _fingerprint(s=PreSet(1000, 300))  # r27-2
    # ... and one a helper method or a classmethod constructor sets (r27-2's other forms):
    assert _fingerprint(s=Helped(1000, 500)) != _fingerprint(s=Helped(1000, 300))
    assert _fingerprint(s=Helped.make(1000, 9)) != _fingerprint(s=Helped.make(1000, 7))
    assert _fingerprint(s=SlottedSchedule(10, 0.5)) != _fingerprint(s=SlottedSchedule(10, 0.2))
    later = Cached(1000)
    later.note = "set later"  # type: ignore[attr-defined]
    assert _fingerprint(s=later) != _fingerprint(s=Cached(1000))
    read = Cached(1000)
    assert read.warmup_steps == 100
    # A cached value read before ``apply()`` counts since r33-1 (``fn`` sees it, and whether
    # its class set it cannot be told); one with no JSON form (a tokenizer) is refused.
    cached = Cached(1000)
    cached.__dict__["warmup_steps"] = 100
    assert _fingerprint(s=read) == _fingerprint(s=cached) != _fingerprint(s=Cached(1000))
    assert read.tokenizer is not None
    with pytest.raises(ConfigError, match=r"config\.s\.tokenizer is state of Cached"):
        _fingerprint(s=read)
    assert _fingerprint(b=Box[int](1)) == _fingerprint(b=Box(1))

    @dataclasses.dataclass
    class Plain:
        steps: int

    before = lower(apply("keys", lambda **_: None, version="v0", p=Plain(4))).fingerprint_payload
    assert '"p":{"__dataclass__":"' in before and '"steps":4}' in before

    @dataclasses.dataclass
    class Opaque:
        seed: dataclasses.InitVar[int]

        def __post_init__(self, seed: int) -> None:
            self.rng = object()

    with pytest.raises(
        ConfigError, match=r"config\.o\.rng is state of .*Opaque that is not a field"
    ):
        _fingerprint(o=Opaque(1))


def test_an_enum_members_value_without_a_canonical_form_is_still_told_apart() -> None:
    """Red team r19-1: a member whose value has no canonical form (a ``Decimal``, a class)
    was its name alone: ``Decimal("1.5")`` and ``Decimal("2.5")`` were one config."""
    import decimal
    import enum

    def mode(value: Any) -> Any:
        return enum.Enum("Mode", {"FAST": value}).FAST

    class Relu:  # a class as a member's value (a function would be a method)
        pass

    class Gelu:
        pass

    values = (
        decimal.Decimal("1.5"),
        decimal.Decimal("2.5"),
        (1, decimal.Decimal("1.5")),
        Relu,
        Gelu,
    )
    assert len({_fingerprint(m=mode(v)) for v in values}) == len(values)
    assert _fingerprint(m=mode(Relu)) == _fingerprint(m=mode(Relu))


def test_a_zone_without_a_key_is_told_apart_by_its_rules() -> None:
    """Red team r19-2: a zone with no key (dateutil's, one read from a file) was named by its
    abbreviation: Phoenix and Denver (both MST in January) were one config, though ``fn``'s
    arithmetic crosses Denver's summer time. A fixed offset's own name is kept too."""
    import datetime
    import zoneinfo

    def from_file(name: str) -> datetime.tzinfo:
        with open(f"/usr/share/zoneinfo/{name}", "rb") as f:
            return zoneinfo.ZoneInfo.from_file(f)

    day = datetime.datetime(2024, 1, 1)
    phoenix, denver = (
        day.replace(tzinfo=from_file(n)) for n in ("America/Phoenix", "America/Denver")
    )
    assert phoenix.isoformat() == denver.isoformat()
    assert _fingerprint(at=phoenix) != _fingerprint(at=denver)
    again = day.replace(tzinfo=from_file("America/Denver"))
    assert _fingerprint(at=denver) == _fingerprint(at=again)
    gmt = day.replace(tzinfo=datetime.timezone(datetime.timedelta(0), "GMT"))
    assert _fingerprint(at=gmt) != _fingerprint(at=day.replace(tzinfo=datetime.UTC))


def test_a_tz_file_zone_is_told_apart_by_all_its_rules() -> None:
    """Red team r20-2: dateutil's zones were told apart by their offsets through the
    datetime's year and the next only: New York and Indianapolis (alike from 2006 on) were one
    config at 2006-06-01, though a three-year lookback in ``fn`` differs by an hour. A tz file
    zone is its whole transition table; one without readable rules is sampled from 1850 to
    2100 too. The same zone read twice is one config."""
    import datetime
    import zoneinfo

    from dateutil import tz

    day = datetime.datetime(2006, 6, 1)
    new_york, indianapolis = (
        day.replace(tzinfo=tz.gettz(n))
        for n in ("America/New_York", "America/Indiana/Indianapolis")
    )
    assert new_york.isoformat() == indianapolis.isoformat()
    assert _fingerprint(at=new_york) != _fingerprint(at=indianapolis)
    again = day.replace(tzinfo=tz.tzfile("/usr/share/zoneinfo/America/New_York"))
    assert _fingerprint(at=new_york) == _fingerprint(at=again)

    def from_file(name: str) -> datetime.tzinfo:
        with open(f"/usr/share/zoneinfo/{name}", "rb") as f:
            return zoneinfo.ZoneInfo.from_file(f)

    read = [
        day.replace(tzinfo=from_file(n))
        for n in ("America/New_York", "America/Indiana/Indianapolis")
    ]
    assert _fingerprint(at=read[0]) != _fingerprint(at=read[1])


@pytest.mark.parametrize(
    "one, other",
    [
        ("EET-2EEST,M3.4.4/50,M10.4.4/50", "EET-2EEST,M3.5.0/0,M10.5.0/0"),  # Gaza, Beirut
        ("EST5EDT,M3.2.0,M11.1.0", "EST5EDT,M3.2.0,M11.1.6"),  # summer time ends a day later
        ("EST5EDT,M3.2.0,M11.1.0", "CST5CDT,M3.2.0,M11.1.0"),  # the names alone differ
    ],
)
def test_a_posix_rule_zone_is_told_apart_by_its_rules(one: str, other: str) -> None:
    """Red team r21-1: a zone made from a POSIX TZ string (``gettz("EET-2EEST,...")``) was
    told apart by offsets sampled twice a month, and not by its names: Gaza's and Beirut's
    rules (two days apart) were one config. Its rules' fields are its identity; a zone whose
    rules cannot be read is walked week by week, each change placed to the second."""
    import datetime

    from dateutil import tz

    day = datetime.datetime(2024, 1, 1)
    first, second = (day.replace(tzinfo=tz.gettz(rule)) for rule in (one, other))
    assert _fingerprint(at=first) != _fingerprint(at=second)
    assert _fingerprint(at=first) == _fingerprint(at=day.replace(tzinfo=tz.gettz(one)))

    class Custom(datetime.tzinfo):
        """A class of one's own: summer time from ``start`` to November, an hour."""

        def __init__(self, start: int) -> None:
            self.start = start

        def utcoffset(self, dt: datetime.datetime | None) -> datetime.timedelta:
            return datetime.timedelta(hours=-5) + self.dst(dt)

        def dst(self, dt: datetime.datetime | None) -> datetime.timedelta:
            summer = dt is not None and (3, self.start) <= (dt.month, dt.day) < (11, 1)
            return datetime.timedelta(hours=1 if summer else 0)

        def tzname(self, dt: datetime.datetime | None) -> str:
            return "X"

    assert _fingerprint(at=day.replace(tzinfo=Custom(10))) != _fingerprint(
        at=day.replace(tzinfo=Custom(11))
    )


def test_pytz_and_zoneinfo_and_a_datetime_subclass_are_other_configs() -> None:
    """Red team r22-1: ``pytz``'s ``localize`` and ``ZoneInfo`` of one key were one config,
    though pytz keeps the offset it localized to through later arithmetic; r22-2: a
    ``pendulum.DateTime`` was the plain ``datetime`` it wraps, though it adds a day across a
    change of summer time otherwise. Each is its own config, and the same in every process."""
    import datetime
    import zoneinfo

    import pendulum
    import pytz

    day = datetime.datetime(2024, 1, 1)
    localized = pytz.timezone("America/New_York").localize(day)
    zoned = day.replace(tzinfo=zoneinfo.ZoneInfo("America/New_York"))
    assert localized.isoformat() == zoned.isoformat()
    assert _fingerprint(at=localized) != _fingerprint(at=zoned)
    again = pytz.timezone("America/New_York").localize(day)
    assert _fingerprint(at=localized) == _fingerprint(at=again)
    wrapped = pendulum.instance(zoned)
    assert wrapped.isoformat() == zoned.isoformat() and not wrapped.fold
    assert _fingerprint(at=wrapped) != _fingerprint(at=zoned)
    assert _fingerprint(on=pendulum.date(2024, 1, 1)) != _fingerprint(on=datetime.date(2024, 1, 1))


def test_a_namedtuples_class_is_in_the_fingerprint() -> None:
    """Red team r26-3: ``Adam(0.1, 0.9)`` and ``Sgd(0.1, 0.9)`` (namedtuples) were one config,
    though a step may dispatch on the class; a plain dict spelling the tag is escaped."""

    class Adam(typing.NamedTuple):
        lr: float
        beta: float

    class Sgd(typing.NamedTuple):
        lr: float
        momentum: float

    assert _fingerprint(o=Adam(0.1, 0.9)) != _fingerprint(o=Sgd(0.1, 0.9))
    assert _fingerprint(o=Adam(0.1, 0.9)) != _fingerprint(o=(0.1, 0.9))
    assert _fingerprint(o=Adam(0.1, 0.9)) == _fingerprint(o=Adam(0.1, 0.9))
    spelled = {"__tuple__": Adam.__qualname__, "fields": ["lr", "beta"], "items": [0.1, 0.9]}
    assert _fingerprint(o=spelled) != _fingerprint(o=Adam(0.1, 0.9))


def test_a_namedtuples_field_names_are_in_the_fingerprint() -> None:
    """Red team r27-3: ``N(lr, wd)`` and ``N(wd, lr)`` of one class name and equal values were
    one config, though a dataclass's fields are keyed by name."""
    import collections

    first = collections.namedtuple("N", "lr wd")
    swapped = collections.namedtuple("N", "wd lr")
    assert _fingerprint(o=first(0.1, 0.9)) != _fingerprint(o=swapped(0.1, 0.9))
    assert _fingerprint(o=first(0.1, 0.9)) == _fingerprint(o=first(0.1, 0.9))


def test_a_windows_path_is_the_text_fn_opens() -> None:
    """Red team r24-5: ``PureWindowsPath("a\\b")`` was ``"a/b"``, though on Linux ``fn`` opens
    a file named ``a\\b``; a POSIX path is still its text."""
    import pathlib

    windows = pathlib.PureWindowsPath("a\\b")
    assert _fingerprint(p=windows) != _fingerprint(p="a/b")
    assert _fingerprint(p=windows) == _fingerprint(p="a\\b")
    assert _fingerprint(p=pathlib.PurePosixPath("a/b")) == _fingerprint(p="a/b")


def test_a_time_zone_that_raises_for_some_year_is_a_config_error() -> None:
    """A ``tzinfo`` of one's own that raises for a year the rules walk asks about failed
    lowering with its own exception; a ``ConfigError`` names the field and the fix now."""
    import datetime

    class Modern(datetime.tzinfo):
        def utcoffset(self, dt: datetime.datetime | None) -> datetime.timedelta:
            if dt is not None and dt.year < 1900:
                raise ValueError("no rules before 1900")
            return datetime.timedelta(hours=1)

        def dst(self, dt: datetime.datetime | None) -> datetime.timedelta:
            return datetime.timedelta(0)

        def tzname(self, dt: datetime.datetime | None) -> str:
            return "M"

    at = datetime.datetime(2024, 1, 1, tzinfo=Modern())
    with pytest.raises(ConfigError, match=r"config\.at: its time zone .*Modern raised ValueError"):
        _fingerprint(at=at)


def test_pytz_offsets_differing_only_in_summer_time_are_other_configs() -> None:
    """Red team r23-5: two of Cordoba's ``-02`` summer-time offsets, with one and two hours of
    it, have one ``repr``; a datetime in either was one config though ``dst()`` differs."""
    import datetime

    import pytz

    zone = pytz.timezone("America/Argentina/Cordoba")
    day = datetime.datetime(2008, 1, 1)
    at = [day.replace(tzinfo=info) for info in zone._tzinfos.values()]
    summers = {moment.dst(): moment for moment in at if moment.tzname() == "-02"}
    one, two = summers[datetime.timedelta(hours=1)], summers[datetime.timedelta(hours=2)]
    assert repr(one.tzinfo) == repr(two.tzinfo) and one.isoformat() == two.isoformat()
    assert _fingerprint(at=one) != _fingerprint(at=two)


def test_a_number_of_a_subclass_is_not_the_plain_number() -> None:
    """Red team r23-1: ``numpy.float64(0.001)`` (a ``np.logspace`` sweep's) was the float
    ``0.001``, though numpy promotes ``lr * float32_array`` to float64 and a float does not;
    a number of any subclass is tagged with its class. Plain numbers and bools are as before."""
    import numpy as np

    class Count(int):
        pass

    assert _fingerprint(lr=np.float64(0.001)) != _fingerprint(lr=0.001)
    assert _fingerprint(lr=np.float64(0.001)) == _fingerprint(lr=np.float64(0.001))
    assert _fingerprint(n=Count(3)) != _fingerprint(n=3)
    assert _fingerprint(lr=np.float64("nan")) != _fingerprint(lr=float("nan"))
    assert _fingerprint(n=Count(10**400)) == _fingerprint(n=Count(10**400))
    # Red team r24-1: a plain dict spelling the tag is escaped, as every tag's is.
    spelled = {"__number__": 0.001, "class": "float64"}
    assert _fingerprint(lr=spelled) != _fingerprint(lr=np.float64(0.001))


def test_a_transformed_placeholder_has_one_fingerprint_in_every_process(tmp_path: Any) -> None:
    """Red team r19-3: with a placeholder mark drawn anew in each process, a ``build_config``
    that serialises ``ctx.output_path`` (``json.dumps``, ``.upper()``) drifted on every run."""
    import subprocess
    import sys

    (tmp_path / "pipe19.py").write_text(
        "import json\n"
        "from marin.execution.lazy import ArtifactStep\n"
        "def train(cfg):\n    return None\n"
        "def made(ctx):\n"
        "    return {'args': json.dumps({'out': ctx.output_path}), 'up': ctx.output_path.upper()}\n"
        "step = ArtifactStep(name='rt/js', version='v1', run=train, build_config=made)\n"
        "print(step.lower().fingerprint)\n"
    )
    prints = {
        subprocess.run(
            [sys.executable, str(tmp_path / "pipe19.py")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for _ in range(2)
    }
    assert len(prints) == 1, prints


@dataclasses.dataclass(frozen=True)
class _Rates:
    lrs: dict[str, float]


def test_a_dict_that_answers_a_missing_key_is_refused_naming_the_field() -> None:
    """Red team r28-5: a ``defaultdict``'s factory, a ``Counter``'s zero or a ``__missing__`` of
    one's own was dropped from the fingerprint (``defaultdict(lambda: 0.1)`` and ``(lambda:
    0.2)`` were one config; in a dataclass field ``fn`` gets the factory as it is)."""
    import collections

    with pytest.raises(ConfigError, match=r"config\.lrs is a collections\.defaultdict"):
        _fingerprint(lrs=collections.defaultdict(lambda: 0.1, {"head": 1.0}))
    with pytest.raises(ConfigError, match=r"config\.rates\.lrs is a collections\.defaultdict"):
        _fingerprint(rates=_Rates(collections.defaultdict(lambda: 0.1)))
    with pytest.raises(ConfigError, match=r"config\.counts is a collections\.Counter"):
        _fingerprint(counts=collections.Counter(a=1))

    class Tagged(dict):  # type: ignore[type-arg]
        pass

    tagged = Tagged(a=1)
    tagged.default = 0.1  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"keeps state of its own \(default\)"):
        _fingerprint(lrs=tagged)
    # A dict by another class that behaves as one is its items, as before:
    plain = _fingerprint(lrs={"a": 1.0})
    assert _fingerprint(lrs=collections.defaultdict(None, {"a": 1.0})) == plain
    assert _fingerprint(lrs=collections.OrderedDict(a=1.0)) == plain
    assert _fingerprint(lrs=Tagged(a=1.0)) == plain

    # A returned one is data, as a JSON reader gets it:
    assert to_canonical(collections.Counter(a=2), "result", text_keys=True) == {"a": 2}


def test_a_built_in_types_subclass_with_state_or_its_own_reads_is_refused() -> None:
    """Red team r29-1, r29-2: a dict subclass keeping state in ``__slots__``, a list, str or int
    subclass with attributes, a dict reading its items its own way (``__getitem__``) were
    their contents only; in a dataclass field ``fn`` gets the object, so ``Scaled(2, a=1)``
    was served for ``Scaled(3, a=1)``."""

    class Scaled(dict):  # type: ignore[type-arg]
        __slots__ = ("scale",)

        def __init__(self, scale: int, **items: int) -> None:
            super().__init__(**items)
            self.scale = scale

    class WithDefault(dict):  # type: ignore[type-arg]
        def __getitem__(self, key: str) -> Any:
            return dict.get(self, key, 0.1)

    class Layers(list):  # type: ignore[type-arg]
        pass

    class Seconds(int):
        pass

    layers, seconds = Layers([64]), Seconds(3)
    layers.act = "relu"  # type: ignore[attr-defined]
    seconds.unit = "s"  # type: ignore[attr-defined]
    for value, what in (
        (Scaled(2, a=1), r"keeps state of its own \(scale\)"),
        (WithDefault(a=1), r"reads its items its own way \(__getitem__\)"),
        (layers, r"keeps state of its own \(act\)"),
        (seconds, r"keeps state of its own \(unit\)"),
    ):
        with pytest.raises(ConfigError, match=r"config\.rates\.lrs is a .*" + what):
            _fingerprint(rates=_Rates(value))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=what):
            _fingerprint(lrs=value)
    # Subclasses that add nothing are their contents, as before:
    assert _fingerprint(lrs=Layers([64])) == _fingerprint(lrs=[64])


def test_a_built_in_types_subclass_is_tagged_with_its_class_and_read_from_what_it_holds() -> None:
    """Red team r30-1, r30-2: a list subclass iterating without ``None`` was the list it
    iterated as (``Layers([64, None, 32])`` was ``Layers([64, 32])``), a namedtuple iterating as
    a summary row was that row, an endless ``__iter__`` hung lowering, and a subclass reading
    its items its own way (``Rev``, ``Loud``) was its plain contents: switching to one was
    code drift only. Each is its class and what it holds."""
    import itertools

    class Layers(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return (item for item in list.__iter__(self) if item is not None)

    class Endless(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return itertools.cycle(list.__iter__(self))

    class Stage(typing.NamedTuple):
        width: int
        depth: int

        def __iter__(self) -> Any:
            return iter([self.width * self.depth])

    class Loud(str):
        def __str__(self) -> str:
            return str.upper(self)

    def held(value: Any) -> str:
        return _fingerprint(rates=_Rates(value))

    def form(value: Any) -> Any:  # (``apply()`` snapshots a config with ``copy.deepcopy``)
        return to_canonical(_Rates(value))

    assert form(Layers([64, None, 32])) != form(Layers([64, 32]))
    endless = form(Endless([1, 2]))["lrs"]
    assert endless["__subclass__"].endswith("Endless") and endless["value"] == [1, 2]
    assert held(Layers([64, 32])) != held([64, 32])
    assert held(Stage(4, 8)) != held(Stage(8, 4))
    assert held(Loud("gpt")) != held("gpt")
    assert _fingerprint(layers=Layers([64, None])) == _fingerprint(layers=[64, None])


def test_a_str_subclass_as_a_dict_key_is_its_class_too() -> None:
    """Red team r31-1: a ``str`` subclass was tagged as a value but was its plain text as a
    key, its state dropped: ``{Loud("a"): 1, "b": 2}`` and ``{"a": 1, Loud("b"): 2}`` were one
    config, though ``fn`` formats the keys each its own way."""

    class Loud(str):
        def __format__(self, spec: str) -> str:
            return str.upper(self)

    class Column(str):
        kind: str

    typed = Column("a")
    typed.kind = "int"
    assert _fingerprint(m={Loud("a"): 1, "b": 2}) != _fingerprint(m={"a": 1, Loud("b"): 2})
    assert _fingerprint(m={Loud("a"): 1}) != _fingerprint(m={"a": 1})
    assert _fingerprint(m={Loud("a"): 1}) == _fingerprint(m={Loud("a"): 1})
    with pytest.raises(ConfigError, match=r"keeps state of its own \(kind\)"):
        _fingerprint(m={typed: 1})
    # A returned dict's keys are text, as a JSON reader gets them:
    assert to_canonical({Loud("a"): 1}, "result", text_keys=True) == {"a": 1}


def _fill(config: Any, value: int) -> None:
    config.__dict__["scaled"] = value


@dataclasses.dataclass(frozen=True)
class _Updated:
    """``cached_property`` values set in the shapes red team r31-2 found left out."""

    total: int
    factor: dataclasses.InitVar[int] = 1

    def __post_init__(self, factor: int) -> None:
        self.__dict__.update(scaled=self.total * factor)

    @functools.cached_property
    def scaled(self) -> int:
        return self.total


@dataclasses.dataclass(frozen=True)
class _Helped:
    total: int
    factor: dataclasses.InitVar[int] = 1

    def __post_init__(self, factor: int) -> None:
        _fill(self, self.total * factor)

    @functools.cached_property
    def scaled(self) -> int:
        return self.total


def test_a_cached_property_set_in_any_shape_its_class_may_use_is_state() -> None:
    """Red team r31-2: ``self.__dict__.update(scaled=...)``, a module helper the class hands
    itself to, a computed ``setattr`` name: ``Cfg(1, factor=2)`` and ``Cfg(1, factor=3)`` were
    one config."""
    assert _fingerprint(c=_Updated(1, 2)) != _fingerprint(c=_Updated(1, 3))
    assert _fingerprint(c=_Helped(1, 2)) != _fingerprint(c=_Helped(1, 3))


def _post(self: Any, factor: int) -> None:
    object.__setattr__(self, "scaled", self.total * factor)


@dataclasses.dataclass(frozen=True)
class _Attached:
    """A ``__post_init__`` defined outside the class body (red team r32-1)."""

    total: int
    factor: dataclasses.InitVar[int] = 1
    __post_init__ = _post

    @functools.cached_property
    def scaled(self) -> int:
        return self.total


def test_a_cached_property_set_by_a_function_attached_to_the_class_is_state() -> None:
    """Red team r32-1: ``__post_init__ = _post`` (or a decorator attaching it) was not in the
    class's source, so the value it sets was left out."""
    assert _fingerprint(c=_Attached(1, 2)) != _fingerprint(c=_Attached(1, 3))


@dataclasses.dataclass(frozen=True)
class _Computed:
    """A cached value set under a name computed at run time (red team r33-1)."""

    total: int
    factor: dataclasses.InitVar[int] = 1

    def __post_init__(self, factor: int) -> None:
        self.__dict__["scal" + "ed"] = self.total * factor

    @functools.cached_property
    def scaled(self) -> int:
        return self.total


def test_a_cached_property_value_present_at_apply_counts_whoever_set_it() -> None:
    """Red team r33-1: shapes the class scan cannot see (a computed key, a helper reached
    through another name, a ``partialmethod``) left the value out; a value with a JSON form
    counts whoever set it."""
    assert _fingerprint(c=_Computed(1, 2)) != _fingerprint(c=_Computed(1, 3))
