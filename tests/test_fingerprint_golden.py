"""Golden fingerprints: lowering must compute byte-identical fingerprints across releases.

A fingerprint names a stored artifact. If a change to lowering (a faster walk, another JSON
encoder, a fused config pass) computed another fingerprint for the same definition, every built
step of every user would show as drifted. The values below were computed by the lowering before
the speed-up of issue 10 and must never change without a migration note.

Migration (issue 49): sets, frozensets, datetimes and dates got type tags, so a set is no longer
the list of its members nor a datetime its ISO string. Only ``rich/rich@v0``, whose config holds
those four values, changed; ``test_only_the_tagged_values_changed`` proves that untagging them
gives back its old fingerprint byte for byte.

Migration (red team round 17): an enum member's tag holds its value (``{"__enum__":
"Level.LOW", "value": 1}``). Only ``rich/rich@v0`` and ``rich/keys@v0`` hold enum members;
taking the values off gives back their fingerprints before, byte for byte.

Migration (red team round 26): a namedtuple in a config is tagged with its class
(``{"__tuple__": "Point", "fields": [...], "items": [...]}``, field names since r27-3); only
``rich/rich@v0`` holds one, and taking the tag off gives back its fingerprint before, byte for
byte.
"""

from __future__ import annotations

import json
import os
from typing import Any

from marin.execution.pipeline.targets import load_target
from marin.execution.step_spec import fingerprint_of
from tests.fingerprint_cases import Level, fingerprints, rich_cases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NGRAM = {
    "ngram/corpus@v1": "9c6eb2ebce12ea7b08cd777c1eddff1298c11e863ef87f2b6891969c78af28d3",
    "ngram/dataset@v1": "f194444e137bf12b6f966e80e2d8ec789312b049abfab6f5ac6b940f5e05c7f0",
    "ngram/eval/bigram-add-k@v1": "7c13c55e787d15264dff530628dc9b948734f6f1db255c44db0ca75aa31bc805",
    "ngram/eval/trigram-interpolated@v1": "c979cdc599e4c8a935420fda98d40ca783dec34a44c00c5d1c8906fca890e12d",
    "ngram/models/bigram-add-k@v1": "d25000c8da23ae3bfd74c81efb315a0b82ffda37049270d0b38350ff3e3e4a0d",
    "ngram/models/trigram-interpolated@v1": "108fcd0bfbcaedafa10a280ccc3d8fe316a5656779b62ac639c00f9025a7bbc2",
    "ngram/report@v1": "359096d9ee3908e985a63cbb3ba94ee3ae11ede9c0bad56891331b28a3042ab2",
    "ngram/tokens/shard-00@v1": "45c3cb5c1654ede7b0ab795f555593423fd4a17a0d3cc8dd683a56b81c12f879",
    "ngram/tokens/shard-01@v1": "f735af57a3e074e765bfd071b48a97a53528d31a190f9a2d1a41d8d28e51d889",
    "ngram/tokens/shard-02@v1": "8c102d2c5015f7ef8e29f8d7a0644b020d4c1b3c199bd59847408831fbb9e2cb",
    "ngram/tokens/shard-03@v1": "9b670e2134d82926893c74acba004dfc3149aa67241c89bf9af2bae092b65fd8",
}

RICH = {
    "data/a@v0": "77157398e8ce23f4b1775fe264840bf8a3995df5829297c7815fa6dcefcc1972",
    "data/b@v1": "dc4b743c04b649631e9219621783f4f75ef0141c6130dc545baaf9d30a19f5f2",
    "data/b@v2": "85824836aa79ade3f57ad8aa226fe27b7dc98b0d60bea702f9d0307b5f13f043",
    "data/pre@v3": "ae6cbd40c0f179ff663f2451c1e6dcc695d326e69a245b7e3030ee83f5c9ac34",
    "other/b@v2": "4728e91e060de08e1a238fb05dab28e4371cff4579d3e26096df75077f435f87",
    "rich/containers@v0": "56563b7e144e4127a0b86049eaa20d76cf49b5ae20b2b013b8a59ea2c4b440cc",
    "rich/floats@v0": "7d30e06a5c548f880e6b4f433f327d5f488df24df755e86d96402ea9a8d3c734",
    "rich/hand-made@v9": "34a100e7046430dba2b4f920e7daa2ed4ac385689336735b9c92d75e49bc48e9",
    "rich/handles@v0": "6c1362fa73870a970a89d4d120c4562364478cbab23feeda73f85d4c1ec7a37a",
    "rich/keys@v0": "e0757917f72b7e778b6d5bc3df68cf0ddcd5147e3efe07a5562d05f7e59824a8",
    "rich/no-config@v0": "3520fc99a889e811b18738231874244d98b6491b988b094d2238a6d317585e83",
    "rich/options@v0": "e5d7419b3d11cd4505a3fbcebc488094761c928cae08917132a9d09d9f98ace4",
    "rich/rich@v0": "20d08d479deef150db65c85034287e0dae62b47a6516bdf8f0cb92d0792512f2",
    "rich/same-name@v0": "0d1d697a6d48ae6fd261335b98bfab01e803eb8c73093289682ccbb18db14939",
    "rich/scalars@v0": "eedc7b8e6a4db4a8cfbd6f0484a805a413df033d6946d943f4c918dbb70d18ba",
    "rich/unicode@v0": "b1216865319806ee9c9c4f952e9832a5ed6fa4734684c29381f1d0e64188d7b1",
}


def test_example_pipeline_fingerprints_are_unchanged() -> None:
    targets = load_target(os.path.join(ROOT, "examples", "ngram.py") + ":pipeline")
    assert fingerprints(targets) == NGRAM


def test_fingerprints_of_every_kind_of_config_value_are_unchanged() -> None:
    assert fingerprints(rich_cases()) == RICH


def test_fingerprints_do_not_depend_on_a_shared_memo() -> None:
    """Lowering through one memo (the slow, fully checked path) gives the same fingerprints."""
    from marin.execution.lazy import lower
    from marin.execution.pipeline.graph import collect_steps

    memo: dict[object, object] = {}
    cases = rich_cases()
    first = {s.step_id: s.fingerprint for s in collect_steps(lower(cases[:3], memo=memo))}
    rest = {s.step_id: s.fingerprint for s in collect_steps(lower(cases, memo=memo))}
    assert {**first, **rest} == RICH



RICH_BEFORE_ISSUE_49 = "c08837a777198cc5c9c9260762bf3369342aef9418a943c3b73556ccb143b705"
TAGS = ("__set__", "__datetime__", "__date__")


def _untagged(value: Any) -> Any:
    """The canonical form as it was before issue 49: tags of the new kinds taken off."""
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)) in TAGS:
            return _untagged(next(iter(value.values())))
        if set(value) == {"__tuple__", "fields", "items"}:  # red team rounds 26, 27
            return _untagged(value["items"])
        return {k: _untagged(v) for k, v in _no_enum_value(value).items()}
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    return value


def _no_enum_value(form: dict[str, Any]) -> dict[str, Any]:
    """An enum member's form as it was before red team round 17 (its name, not its value)."""
    if "__enum__" in form:
        return {"__enum__": form["__enum__"]}
    return form


def _without_enum_values(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_enum_values(v) for k, v in _no_enum_value(value).items()}
    if isinstance(value, list):
        return [_without_enum_values(v) for v in value]
    return value


RICH_KEYS_BEFORE_ROUND_17 = "698d8f69b8fd9b12b0dc1339ee9d701220b702b9858810e36fb85bbde6d822d5"


def test_only_the_enum_values_changed_the_keys_case() -> None:
    from marin.execution.lazy import lower
    from marin.execution.pipeline.graph import collect_steps

    spec = next(s for s in collect_steps(lower(rich_cases())) if s.step_id == "rich/keys@v0")
    payload = json.loads(spec.fingerprint_payload)
    assert '"value":' in spec.fingerprint_payload  # its enum keys carry their values
    assert fingerprint_of(_without_enum_values(payload))[0] == RICH_KEYS_BEFORE_ROUND_17


def test_only_the_tagged_values_changed() -> None:
    from marin.execution.lazy import lower
    from marin.execution.pipeline.graph import collect_steps

    spec = next(s for s in collect_steps(lower(rich_cases())) if s.step_id == "rich/rich@v0")
    payload = json.loads(spec.fingerprint_payload)
    tagged = payload["config"]["x"]
    assert tagged["set"] == {"__set__": [1, 2, 3]} and tagged["fs"] == {"__set__": ["a", "b"]}
    assert tagged["dt"] == {"__datetime__": "2026-01-02T03:04:05+00:00"}
    assert tagged["date"] == {"__date__": "2026-11-30"}
    # Red team round 17: an IntEnum member is tagged as an enum too; before, it was its value.
    assert tagged["intenum"] == {"__enum__": "Level.LOW", "value": 1}
    tagged["intenum"] = Level.LOW.value
    assert fingerprint_of(_untagged(payload))[0] == RICH_BEFORE_ISSUE_49
