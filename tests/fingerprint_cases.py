"""Pipelines whose fingerprints are pinned by ``tests/test_fingerprint_golden.py``.

Every fingerprint a user has stored names a built artifact: if lowering computed another one for
the same definition, every step would look drifted. These cases cover the example pipeline and
each kind of value a config may hold, so a faster lowering cannot silently change the bytes.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import pathlib
from typing import Any, NamedTuple

from marin.execution.lazy import OUT, ArtifactStep, apply, lower
from marin.execution.pipeline.context import StepContext
from marin.execution.step_spec import StepSpec


def fn(**kwargs: Any) -> None:
    return None


def take(x: Any = None, out_path: str = "", data: Any = None, items: Any = None) -> None:
    return None


class Color(enum.Enum):
    RED = 1
    BLUE = "b"


class Level(enum.IntEnum):
    LOW = 1


@dataclasses.dataclass
class Opt:
    lr: float
    path: pathlib.Path
    tags: tuple[str, ...] = ("a",)


@dataclasses.dataclass(frozen=True)
class Frozen:
    n: int
    inner: Opt | None = None


class Point(NamedTuple):
    x: int
    y: float


class MyList(list):  # type: ignore[type-arg]
    pass


class MyDict(dict):  # type: ignore[type-arg]
    pass


def _hand_made_config(ctx: StepContext) -> dict[str, Any]:
    return {
        "out": ctx.output_path,
        "prefix": ctx.prefix,
        "region": ctx.region,
        "deps": ctx.dep_paths,
    }


def rich_cases() -> list[ArtifactStep | StepSpec]:
    """One step per kind of config value, plus handles nested in containers and hand-made steps."""
    a = apply("data/a", take, version="v0", out_path=OUT)
    b = apply("data/b", take, version="v1", x=1, out_path=OUT)
    b2 = apply("other/b", take, version="v2", out_path=OUT)
    spec_dep = apply("data/pre", take, version="v3", out_path=OUT).lower()
    values: dict[str, Any] = {
        "scalars": {"s": 'héllo "q" \\ \n', "i": -3, "big": 2**70, "t": True, "n": None},
        "floats": [0.1, -0.0, 1e300, float("nan"), float("inf"), float("-inf"), 3.0],
        "containers": {"l": [1, [2, (3, 4)]], "t": (), "e": {}, "nested": {"k": {"k2": []}}},
        "keys": {1: "int", 2.5: "float", False: "bool", Color.RED: "enum", "z": "str"},
        "rich": {
            "set": {3, 1, 2},
            "fs": frozenset({"b", "a"}),
            "enum": Color.BLUE,
            "intenum": Level.LOW,
            "path": pathlib.PurePosixPath("/x/y"),
            "dt": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
            "date": datetime.date(2026, 11, 30),
            "bytes": b"\x00\xff",
            "nt": Point(1, 2.5),
            "dc": Opt(0.1, pathlib.Path("/m"), ("x", "y")),
            "frozen": Frozen(2, Opt(1e-3, pathlib.Path("rel/p"))),
            "od": collections.OrderedDict([("b", 1), ("a", 2)]),
            "mylist": MyList([1, 2]),
            "mydict": MyDict(q=1),
        },
        "handles": {"l": [a, (b,)], "d": {"k": b2}, "spec": spec_dep, "out": OUT},
        "unicode": {"ключ": "値", "emoji": "🙂"},
    }
    steps: list[ArtifactStep | StepSpec] = [
        apply(f"rich/{key}", take, version="v0", x=value, out_path=OUT)
        for key, value in values.items()
    ]
    # Two dependencies with one name (different versions): the payload keys the second by id.
    b_v2 = apply("data/b", take, version="v2", out_path=OUT)
    steps.append(apply("rich/same-name", take, version="v0", data=[b, b_v2], out_path=OUT))
    steps.append(apply("rich/options", take, version="v0", data=a).with_options(retries=2))
    steps.append(
        ArtifactStep(
            name="rich/hand-made",
            version="v9",
            run=lambda config: None,
            build_config=_hand_made_config,
            deps=(a, spec_dep),
        )
    )
    steps.append(ArtifactStep(name="rich/no-config", version="v0", run=lambda config: None))
    return steps


def fingerprints(targets: list[Any]) -> dict[str, str]:
    from marin.execution.pipeline.graph import collect_steps

    return {spec.step_id: spec.fingerprint for spec in collect_steps(lower(list(targets)))}
