"""Canonical JSON: one byte string per config, so that equal configs hash equally.

Only values with an unambiguous, address-free meaning are accepted. Values that JSON would
spell alike but that mean something else carry a type tag (``{"__set__": [...]}``,
``{"__datetime__": "..."}``); a tuple is a list, as in Marin and in a config read from JSON or
YAML (docs/caching.md, "The fingerprint: what is the same config"). A lambda, an open file or any
object whose ``repr`` holds a memory address would make the fingerprint depend on the process, so
it is rejected with the dotted path of the field that holds it.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import functools
import hashlib
import json
import math
import os
import pathlib
import re
from collections.abc import Callable
from typing import Any

from marin.execution.digest.library_values import float_text
from marin.execution.errors import ConfigError
from marin.execution.pipeline.context import PLACEHOLDER_MARK as MARK

_SCALARS = (str, int, bool, type(None))

# Types whose canonical form is built in: registering one would silently change every
# fingerprint that holds such a value (and the fast paths above never look it up).
_BUILT_IN = (str, int, float, bool, type(None), list, tuple, dict, set, frozenset, bytes)

# The keys of the type tags below; a plain dict holding one is escaped as ``{"__dict__": ...}``.
_TAGS = frozenset(
    f"__{tag}__"
    for tag in (
        "set",
        "datetime",
        "date",
        "bytes",
        "float",
        "number",
        "enum",
        "dataclass",
        "registered",
        "tuple",
        "subclass",
    )
) | {"__dict__", "__map__", "__str__", "__text__"}

_registered: dict[type, Callable[[Any], Any]] = {}
_lookup_cache: dict[type, tuple[type, Callable[[Any], Any]] | None] = {}


def register_fingerprint(kind: type, fn: Callable[[Any], Any]) -> None:
    """Give values of ``kind`` (and of its subclasses) the canonical form ``fn(value)``.

    ``fn`` returns plain data that says exactly what the value means (``fn(value)`` is itself
    canonicalised); the fingerprint then holds ``{"__registered__": "<qualname>", "value":
    ...}``, so it is stable across processes instead of being refused. A subclass uses the
    nearest registered class along its MRO, tagged with its own name (and the dataclass fields
    it declares itself). Registering a class again replaces its function.

    Raises:
        ConfigError: ``kind`` is not a class, ``fn`` is not callable, or ``kind`` already has a
            canonical form (a built-in type such as ``str``, ``dict`` or ``object``).
    """
    if not isinstance(kind, type):
        raise ConfigError(
            f"register_fingerprint got {kind!r}, not a class", "pass the class itself"
        )
    if not callable(fn):
        raise ConfigError(
            f"register_fingerprint({kind.__qualname__}, {fn!r}): fn is not callable",
            "pass a function from a value to plain data",
        )
    if kind in _BUILT_IN or kind is object:
        raise ConfigError(
            f"register_fingerprint({kind.__qualname__}, ...): {kind.__qualname__} already has "
            "a canonical form",
            "register your own class (a subclass of it is fine)",
        )
    _registered[kind] = fn
    _lookup_cache.clear()


def _registered_for(kind: type) -> tuple[type, Callable[[Any], Any]] | None:
    try:
        return _lookup_cache[kind]
    except KeyError:
        pass
    found = next(((base, _registered[base]) for base in kind.__mro__ if base in _registered), None)
    _lookup_cache[kind] = found
    return found


@dataclasses.dataclass(frozen=True)
class Canonical:
    """A value already in canonical form, as a job's JSON outcome carries it (``fn`` ran in
    another process, which made the form): the record keeps it as it is."""

    value: Any


class _NeedsPath(Exception):
    """Raised by the path-free pass when a value is rejected: redo it, naming the field."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Walk:
    """What one canonicalisation is for: the step named in errors, and whether dict keys become
    JSON text (a result, which readers get as JSON) or keep their type (a config, which ``fn``
    gets as it is: ``{0: x}`` and ``{"0": x}`` are two configs)."""

    step: str | None
    text_keys: bool


def to_canonical(
    value: Any, path: str = "config", step: str | None = None, *, text_keys: bool = False
) -> Any:
    """Return a JSON-ready structure for ``value``; ``path`` names the field in errors.

    A dict with a key that is not a string is ``{"__map__": [[key, item], ...]}`` (sorted by
    the key's JSON) unless ``text_keys`` (a result), which spells every key as text
    (``str(key)``, an enum member's name) and refuses keys that would collide as text.
    """
    walk = _Walk(step, text_keys)
    # Lowering 100,000 steps canonicalises half a million values, so the first pass does not
    # build a dotted path for every field; only a rejected value pays for a second, naming pass.
    try:
        try:
            return _canonical(value, None, walk)
        except _NeedsPath:
            return _canonical(value, path, walk)
    except RecursionError:
        raise ConfigError(
            f"{path} is nested too deeply to fingerprint, or the forms register_fingerprint "
            "functions return lead back to one another",
            "flatten the value, and make each register_fingerprint function return plain data",
            walk.step,
        ) from None


def as_stored(value: Any) -> Any:
    """A canonical form as a record stores it and every later reader parses it: each dict's
    keys in sorted order. A reader in the same run gets this too, never the order ``fn`` or
    ``build_config`` happened to build (which the record, the output digest and early cutoff
    do not see)."""
    if isinstance(value, dict):
        return {key: as_stored(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [as_stored(item) for item in value]
    return value


def _canonical(value: Any, path: str | None, walk: _Walk) -> Any:
    """``value``'s canonical form; ``path`` is None on the first, fast pass (``to_canonical``)."""
    kind = type(value)
    if kind is str:
        return value if "{" not in value and MARK not in value else _canonical_text(value)
    if kind is int or kind is bool or value is None:
        return value
    if kind is list or kind is tuple:
        if path is None:
            return [_canonical(item, None, walk) for item in value]
        return [_canonical(item, f"{path}[{i}]", walk) for i, item in enumerate(value)]
    if kind is dict:
        return _canonical_dict(value, path, walk)
    if _registered:
        found = _registered_for(kind)
        if found is not None:
            return _registered_form(value, found, path, walk)
    return _canonical_other(value, path, walk)


_SPELLED = r"(OUT|PREFIX|REGION|ARG:[^{}]*|DEP:[^{}]*)\}"
_PLACEHOLDER = re.compile(r"\{" + re.escape(MARK) + _SPELLED)
_LOOKS_LIKE_ONE = re.compile(r"\{" + _SPELLED)


def _canonical_text(value: str) -> Any:
    """A string with a brace or the placeholder mark in it: the placeholders a fingerprinting
    context handed ``build_config`` (``ctx.output_path``, ``f"{ctx.output_path}/ckpt"``) spelled
    as ``{OUT}``, as always; a string that spells a placeholder itself (``"{OUT}"``,
    ``"{DEP:a}"``) or holds the mark elsewhere is ``{"__str__": value}``, never a path's form."""
    if _LOOKS_LIKE_ONE.search(value) is None:
        spelled = _PLACEHOLDER.sub(r"{\1}", value) if MARK in value else value
        if MARK not in spelled:
            return spelled
    return {"__str__": value}


def _canonical_dict(value: dict[Any, Any], path: str | None, walk: _Walk) -> Any:
    """A dict of string keys as a JSON object (escaped as ``{"__dict__": ...}`` if a key spells
    a type tag); any other dict as ``_typed_map`` makes it, unless ``walk.text_keys``."""
    if not walk.text_keys and not all(_is_plain_key(key) for key in value):
        return _typed_map(value, path, walk)
    out = {}
    for key, item in value.items():
        if not _is_text_key(key) and not isinstance(key, enum.Enum | int | float):
            raise _key_error(key, path, walk)
        text = _key_text(key, walk)
        if text in out:
            if path is None:
                raise _NeedsPath
            first = next(k for k in value if k is not key and _key_text(k, walk) == text)
            raise ConfigError(
                f"{path} has keys {first!r} and {key!r}, which both become {text!r}",
                "use keys that stay distinct as strings; JSON keys are strings",
                walk.step,
            )
        out[text] = _canonical(item, None if path is None else f"{path}.{key}", walk)
    # A dict that spells a type tag is wrapped, so it never means what the tag means.
    return out if _TAGS.isdisjoint(out) else {"__dict__": out}


def _typed_map(value: dict[Any, Any], path: str | None, walk: _Walk) -> dict[str, Any]:
    """A config dict with a key that is not a string: ``{"__map__": [[key, item], ...]}``,
    each key in its own canonical form (``0``, ``0.0``, ``false``, ``{"__enum__": ...}``) and
    sorted by its JSON, so that ``{0: x}``, ``{"0": x}`` and ``{False: x}`` stay three configs
    (``fn`` tells them apart) and key order still does not matter."""
    pairs: dict[str, tuple[Any, Any]] = {}
    for key, item in value.items():
        if not _is_text_key(key) and not isinstance(key, enum.Enum | int | float):
            raise _key_error(key, path, walk)
        plain = _is_text_key(key) and not _user_subclass(type(key))
        form = _text_form(key) if plain else _canonical(key, path, walk)
        text = json.dumps(form, sort_keys=True)
        if text in pairs:  # two NaN keys: one form, two entries
            if path is None:
                raise _NeedsPath
            raise ConfigError(
                f"{path} has two keys that are both {key!r}", "use distinct keys", walk.step
            )
        pairs[text] = (form, _canonical(item, None if path is None else f"{path}.{key}", walk))
    return {"__map__": [list(pairs[text]) for text in sorted(pairs)]}


def _is_text_key(key: Any) -> bool:
    return type(key) is str or (isinstance(key, str) and not isinstance(key, enum.Enum))


def _is_plain_key(key: Any) -> bool:
    """A config key that is a JSON object's key as it is: text, not spelling a placeholder
    itself (``"{OUT}"`` is ``{"__str__": ...}``, which only ``_typed_map`` can hold)."""
    if type(key) is str and "{" not in key and MARK not in key:
        return True
    if _user_subclass(type(key)):  # ``Loud("a")``: its class, as a value's (red team r31-1)
        return False
    return _is_text_key(key) and isinstance(_text_form(key), str)


def _text_form(key: str) -> Any:
    """A text key's canonical form: its text (a ``str`` subclass's own, never its ``__str__``),
    with a context's placeholders spelled ``{OUT}`` (``ctx.output_path`` as a key)."""
    text = str.__str__(key)
    return text if "{" not in text and MARK not in text else _canonical_text(text)


def _key_error(key: Any, path: str | None, walk: _Walk) -> Exception:
    if path is None:
        return _NeedsPath()
    return ConfigError(
        f"{path} has a key of type {type(key).__name__}",
        "use keys that are strings, numbers, booleans or enum members",
        walk.step,
    )


def _enum_form(member: enum.Enum, walk: _Walk) -> dict[str, Any]:
    """An enum member: its class's qualified name, its name and its value (``fn`` sees the
    value: a member whose value was edited, or a class of the same name elsewhere whose member
    has another value, is another config). The module is left out: it depends on how a runner
    loads the pipeline file (``__main__``, a file path), and a fingerprint may not. A value with
    no canonical form is spelled as ``_value_text`` says."""
    form: dict[str, Any] = {"__enum__": f"{type(member).__qualname__}.{member.name}"}
    try:
        form["value"] = _canonical(member.value, "value", walk)
    except (ConfigError, _NeedsPath):
        text = _value_text(member.value)
        if text is not None:
            form["value"] = {"__text__": text}
    return form


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _value_text(value: Any) -> str | None:
    """An enum member's value that has no canonical form (red team r19-1: ``Decimal("1.5")``,
    a function, a class), as text that tells such values apart: a function's or a class's
    qualified name, else its ``repr`` unless that names a memory address. None then: the name
    alone stands for the member, and the code digest sees the class that defines it."""
    if callable(value) and isinstance(getattr(value, "__qualname__", None), str):
        return f"{type(value).__qualname__}:{value.__qualname__}"
    try:
        text = repr(value)
    except Exception:
        return None
    return None if _ADDRESS.search(text) else text


def _subclass(value: datetime.date) -> dict[str, str]:
    """``{"class": ...}`` for a subclass of ``date`` or ``datetime`` (its qualified name: the
    module depends on how a pipeline file is loaded), else nothing."""
    if type(value) in (datetime.date, datetime.datetime):
        return {}
    return {"class": type(value).__qualname__}


def _datetime_form(value: datetime.datetime) -> dict[str, Any]:
    """Tagged (issue 49): a point in time is not the string that spells it, nor a day. Naive
    and aware datetimes differ by the offset their ISO form carries; a time zone with rules
    (``ZoneInfo("Europe/London")``, not a fixed offset) is named too (``_zone``), since ``fn``
    gets other times from it than from UTC, and so is ``fold`` (which of a repeated hour). A
    subclass's name is kept (red team r22-2: ``pendulum.DateTime`` adds a day across a change
    of summer time otherwise than ``datetime``)."""
    form: dict[str, Any] = {"__datetime__": value.isoformat(), **_subclass(value)}
    if value.tzinfo is not None:
        zone = _zone(value.tzinfo)
        if zone is not None:
            form["zone"] = zone
    if value.fold:
        form["fold"] = 1
    return form


def _zone(zone: datetime.tzinfo) -> Any:
    """What tells a time zone apart beyond the offset the ISO form carries: a fixed offset's
    own name (``timezone(timedelta(0), "GMT")``, None for a default one); a zone's key (a
    ``ZoneInfo``'s, pytz's); else a digest of its rules: a tz file's whole transition table
    (dateutil's ``tzfile``, whose path would differ between machines: red team r20-2), a POSIX
    rule's fields (``tzstr``, ``tzrange``: r21-1), or what a walk over 1850-2100 finds it
    does (``_scanned``: ``ZoneInfo.from_file``, a class of one's own, r19-2)."""
    if isinstance(zone, datetime.timezone):
        name = zone.tzname(None)
        return None if name == datetime.timezone(zone.utcoffset(None)).tzname(None) else name
    key = getattr(zone, "key", None)
    if isinstance(key, str) and key:
        return key
    key = getattr(zone, "zone", None)
    if isinstance(key, str) and key:
        # pytz: ``localize`` gives the datetime one fixed offset of its zone, which later
        # arithmetic keeps (red team r22-1: not ``ZoneInfo``'s behaviour); its repr names both,
        # but not the summer time that offset holds (r23-5: Argentina's ``-02`` is one or two
        # hours of it), which ``dst()`` gives (pytz answers for the tzinfo a datetime holds).
        summer = datetime.datetime(2000, 1, 1, tzinfo=zone).dst()
        return {
            type(zone).__qualname__: _value_text(zone) or key,
            "dst": None if summer is None else summer.total_seconds(),
        }
    rules = _transitions(zone) or _posix_rules(zone) or _scanned(zone)
    return {type(zone).__qualname__: rules}


def _digest(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), default=repr)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _transitions(zone: datetime.tzinfo) -> str | None:
    """A digest of a tz file's rules as dateutil's ``tzfile`` holds them: every transition
    (UTC seconds) and the offset, DST flag and name after it, and those before the first and
    after the last; None for a zone without them."""
    times, infos = getattr(zone, "_trans_list_utc", None), getattr(zone, "_trans_idx", None)
    if not isinstance(times, (list, tuple)) or not isinstance(infos, (list, tuple)):
        return None

    def spelled(info: Any) -> Any:
        if info is None:
            return None
        fields = ("offset", "delta", "isdst", "abbr", "dstoffset")
        return [str(getattr(info, name, None)) for name in fields]

    ends = [
        spelled(getattr(zone, name, None))
        for name in ("_ttinfo_before", "_ttinfo_std", "_ttinfo_dst")
    ]
    return _digest([[[int(t), spelled(i)] for t, i in zip(times, infos, strict=False)], ends])


_POSIX_FIELDS = ("_std_abbr", "_dst_abbr", "_std_offset", "_dst_offset", "_start_delta",
                 "_end_delta", "_dst_base_offset_", "hasdst")  # fmt: skip


def _posix_rules(zone: datetime.tzinfo) -> str | None:
    """A digest of a rule-defined zone's rules as dateutil's ``tzrange`` and ``tzstr`` (a
    POSIX TZ string, ``EST5EDT,M3.2.0,M11.1.0``) hold them: names, offsets, and when summer
    time starts and ends (red team r21-1: Gaza's and Beirut's rules, two days apart, were one
    config); None for a zone without them."""
    if not all(hasattr(zone, name) for name in _POSIX_FIELDS):
        return None
    return _digest([repr(getattr(zone, name)) for name in _POSIX_FIELDS])


_SCANNED: dict[int, tuple[datetime.tzinfo, str]] = {}
_FIRST, _LAST = datetime.datetime(1850, 1, 1), datetime.datetime(2101, 1, 1)


def _scanned(zone: datetime.tzinfo) -> str:
    """A digest of what a zone whose rules cannot be read (``ZoneInfo.from_file``, a class of
    one's own, the machine's ``tzlocal``) does from 1850 to 2100: its offset, summer time and
    name, and each change of them, found on a weekly walk and placed to the second. Worked out
    once per zone object in a process (about a tenth of a second for a tz database zone)."""
    kept = _SCANNED.get(id(zone))
    if kept is not None and kept[0] is zone:
        return kept[1]
    state = functools.partial(_state, zone)
    changes: list[Any] = []
    week = datetime.timedelta(days=7)
    at, now = _FIRST, state(_FIRST)
    while at < _LAST:
        ahead = min(at + week, _LAST)
        if state(ahead) == now:
            at = ahead
            continue
        low, high = at, ahead  # the state at ``low`` is ``now``; at ``high`` it is not
        while high - low > datetime.timedelta(seconds=1):
            middle = (low + (high - low) / 2).replace(microsecond=0)
            low, high = (middle, high) if state(middle) == now else (low, middle)
        at, now = high, state(high)
        changes.append([high.isoformat(), now])
    found = _digest([state(_FIRST), changes])
    if len(_SCANNED) > 256:
        _SCANNED.clear()
    _SCANNED[id(zone)] = (zone, found)
    return found


def _state(zone: datetime.tzinfo, wall: datetime.datetime) -> tuple[Any, Any, Any]:
    moment = wall.replace(tzinfo=zone)
    offset, summer = moment.utcoffset(), moment.dst()
    return (
        None if offset is None else offset.total_seconds(),
        None if summer is None else summer.total_seconds(),
        moment.tzname(),
    )


def _canonical_other(value: Any, path: str | None, walk: _Walk) -> Any:
    """The canonical form of a value that is not exactly a str, int, bool, None, list, tuple or
    dict, nor of a registered type: tagged where its JSON would be ambiguous."""
    # An enum member before its mixin's type: ``IntEnum``, ``StrEnum``, ``HTTPStatus`` members
    # are ints or strs too, but not their values (``fn`` sees ``.name``, ``repr``, the class).
    if isinstance(value, enum.Enum):
        return _enum_form(value, walk)
    if not walk.text_keys:  # a returned one is its contents, as a JSON reader gets it
        _refuse_own_behaviour(value, path, walk)
        if _user_subclass(type(value)):
            return _subclass_form(value, path, walk)
    # A str subclass (``numpy.str_``) and a path are their text, placeholders and all: a path
    # spelling ``{OUT}`` is tagged as that text is (red team r18-1).
    if isinstance(value, str):
        return _canonical(str.__str__(value), path, walk)
    if isinstance(value, pathlib.PureWindowsPath) and os.name != "nt":
        # ``fn`` opens its own text here (``a\\b``, one name), not ``a/b`` (red team r24-5).
        return _canonical(str(value), path, walk)
    if isinstance(value, pathlib.PurePath):
        return _canonical(value.as_posix(), path, walk)
    if isinstance(value, int | float) and type(value) not in (int, float, bool):
        # A number of a subclass (``numpy.float64``): ``fn`` meets that type's arithmetic and
        # promotion rules, not a float's (red team r23-1): tagged with its class's name.
        # Read from the value itself: a subclass's own ``__float__`` is not what it holds.
        number = float.__float__(value) if isinstance(value, float) else int.__int__(value)
        finite = isinstance(number, int) or math.isfinite(number)
        spelled = number if finite else float_text(number)  # a NaN's sign: red team r37-4
        return {"__number__": spelled, "class": type(value).__qualname__}
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": float_text(value)}
    if isinstance(value, datetime.datetime):
        return _datetime_checked(value, path, walk)
    if isinstance(value, datetime.date):
        return {"__date__": value.isoformat(), **_subclass(value)}
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if isinstance(value, dict):
        return _canonical(dict(value), path, walk)
    if isinstance(value, tuple) and hasattr(type(value), "_fields") and not walk.text_keys:
        return _namedtuple_form(value, path, walk)  # a returned one is its items
    if isinstance(value, list | tuple):
        return _canonical(list(value), path, walk)
    if isinstance(value, set | frozenset):
        # Tagged (issue 49): its members, in no order, are not a list; a set and a frozenset
        # of the same members are one value (as in Marin).
        items = [_canonical(item, None if path is None else f"{path}{{}}", walk) for item in value]
        return {"__set__": sorted(items, key=lambda item: json.dumps(item, sort_keys=True))}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _dataclass_form(value, path, walk)
    if path is None:
        raise _NeedsPath
    raise ConfigError(
        f"{path} holds a {type(value).__module__}.{type(value).__qualname__}, "
        "which has no stable JSON form",
        "pass plain data (str, numbers, lists, dicts, dataclasses, enums, paths) "
        "or a step handle instead",
        walk.step,
    )


_BUILT_IN_BASES = (dict, list, tuple, set, frozenset, str, bytes, int, float, pathlib.PurePath)
"""Types whose subclasses' values are read as the base's: state a subclass adds of its own
(``own_behaviour``) is refused, never dropped; its class is tagged (``_subclass_form``)."""
_CONTAINERS_AND_TEXT = (dict, list, tuple, set, frozenset, str, bytes, pathlib.PurePath)
_DICT_READS = frozenset(
    {"__missing__", "__getitem__", "get", "__contains__", "__iter__", "keys", "items", "values",
     "__len__"}
)  # fmt: skip
"""A dict subclass defining one of these reads its items its own way (``WithDefault``)."""
_STANDARD = frozenset(
    {object, *_BUILT_IN_BASES, collections.OrderedDict, collections.defaultdict,
     pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.Path, pathlib.PosixPath,
     pathlib.WindowsPath}
)  # fmt: skip
"""Classes whose own slots and methods are the standard ones (an ``OrderedDict``'s, a path's)."""


def _user_subclass(kind: type) -> bool:
    """A class of a project or a library derived from a built-in container, text or path type
    (``class Layers(list)``, ``numpy.str_``), not from the standard library's own classes; a
    number's (tagged by ``__number__``) and a namedtuple's (``_namedtuple_form``) have forms
    of their own."""
    if kind in _STANDARD or not issubclass(kind, _CONTAINERS_AND_TEXT):
        return False
    return not issubclass(kind, int | float) and not hasattr(kind, "_fields")


def _subclass_form(value: Any, path: str | None, walk: _Walk) -> dict[str, Any]:
    """A user subclass of a built-in type: its class, as its methods are what ``fn`` meets
    (``Rev([1, 2])`` reads backwards: red team r30-2), and what it holds, read from the value
    itself, never through its own ``__iter__`` or ``__str__`` (r30-1: ``Layers([64, None])``
    iterating without ``None`` was ``Layers([64])``)."""
    return {"__subclass__": type(value).__qualname__, "value": _canonical(_held(value), path, walk)}


def _held(value: Any) -> Any:
    """What a value of a subclass of a built-in type holds, as that built-in type."""
    if isinstance(value, dict):
        return dict(dict.items(value))
    if isinstance(value, list):
        return list.__getitem__(value, slice(None))
    if isinstance(value, tuple):
        return tuple.__getitem__(value, slice(None))
    if isinstance(value, set | frozenset):
        return set(value)  # copied from its table, not through its ``__iter__``
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes):
        return bytes(memoryview(value))
    return pathlib.PurePath.__str__(value)


def _namedtuple_form(value: tuple[Any, ...], path: str | None, walk: _Walk) -> dict[str, Any]:
    """A config's namedtuple: its class, as a step may dispatch on it (``Adam`` or ``Sgd`` of
    equal values: red team r26-3), its field names, as a dataclass's count (``N(lr, wd)`` and
    ``N(wd, lr)``: r27-3), and its items; its module is left out, as a dataclass's is."""
    names = getattr(type(value), "_fields", ())
    fields = [str(name) for name in names] if isinstance(names, tuple) else [repr(names)]
    items = _canonical(list(tuple.__iter__(value)), path, walk)  # never its own ``__iter__``
    return {"__tuple__": type(value).__qualname__, "fields": fields, "items": items}


def own_behaviour(value: Any) -> str | None:
    """What a value of a subclass of a built-in type (``_BUILT_IN_BASES``) adds that its items,
    text or number do not say, or None: state of its own (attributes, slots set), or, for a
    dict, items answered its own way (a ``defaultdict``'s factory, ``Counter``, a
    ``__missing__``, ``__getitem__`` or ``get`` of its own). Such a config is refused (red team
    r28-5, r29-1, r29-2: ``Scaled(2, a=1)`` and ``Scaled(3, a=1)`` were one config, though a
    dataclass field hands ``fn`` the object as it is)."""
    kind = type(value)
    if kind in _BUILT_IN_BASES or not isinstance(value, _BUILT_IN_BASES):
        return None
    own = [c for c in kind.__mro__ if c not in _STANDARD]
    if isinstance(value, dict):
        reads = {name for c in own for name in vars(c)} & _DICT_READS
        if isinstance(value, collections.defaultdict) and value.default_factory is not None:
            reads.add("a default factory")
        if reads:
            return f"reads its items its own way ({', '.join(sorted(reads))})"
    state = sorted(getattr(value, "__dict__", None) or ()) + _slots_set(value, own)
    if state:
        return f"keeps state of its own ({', '.join(state)})"
    return None


def _slots_set(value: Any, classes: list[type]) -> list[str]:
    """The ``__slots__`` of ``classes`` that ``value`` has set, read without running its code."""
    found = []
    for klass in classes:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            descriptor = klass.__dict__.get(name)
            if name in ("__dict__", "__weakref__") or descriptor is None:
                continue
            try:
                descriptor.__get__(value, klass)
            except AttributeError:
                continue  # a slot never set
            found.append(name)
    return found


def _refuse_own_behaviour(value: Any, path: str | None, walk: _Walk) -> None:
    """A ``ConfigError`` naming the field of a value with ``own_behaviour``."""
    what = own_behaviour(value)
    if what is None:
        return
    if path is None:
        raise _NeedsPath
    kind = type(value)
    raise ConfigError(
        f"{path} is a {kind.__module__}.{kind.__qualname__}, which {what}: the fingerprint "
        "would see only its contents",
        "pass a plain dict, list, str or number, or give the class a canonical form with "
        "register_fingerprint",
        walk.step,
    )


def _datetime_checked(value: datetime.datetime, path: str | None, walk: _Walk) -> Any:
    """``_datetime_form``, or a ``ConfigError`` naming the field when its time zone raises."""
    try:
        return _datetime_form(value)
    except Exception as exc:  # a tzinfo of one's own, asked about 1850-2100 (``_scanned``)
        if path is None:
            raise _NeedsPath from None
        raise ConfigError(
            f"{path}: its time zone {type(value.tzinfo).__qualname__} raised "
            f"{type(exc).__name__}: {exc} when asked its offset, summer time or name "
            "between 1850 and 2100",
            "make the tzinfo answer for any date, or use a zoneinfo.ZoneInfo",
            walk.step,
        ) from None


def _dataclass_form(value: Any, path: str | None, walk: _Walk) -> dict[str, Any]:
    """A dataclass instance: its class's qualified name and its fields, and its other state
    (``_instance_state``) as ``__state__`` (red team r23-2, r25-2, r25-4)."""

    def spelled(name: str, item: Any) -> Any:
        return _canonical(item, None if path is None else f"{path}.{name}", walk)

    kind = type(value)
    fields = {f.name: spelled(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)}
    state = {
        name: _state_form(value, name, item, path, walk) for name, item in _instance_state(value)
    }
    if state:
        return {"__dataclass__": kind.__qualname__, "__dict__": fields, "__state__": state}
    if not _TAGS.isdisjoint(fields):  # a field named like a tag (red team r18-5)
        return {"__dataclass__": kind.__qualname__, "__dict__": fields}
    return {"__dataclass__": kind.__qualname__, **fields}


def _instance_state(value: Any) -> list[tuple[str, Any]]:
    """A dataclass instance's attributes that are not fields, sorted by name: what
    ``__post_init__`` set from an ``InitVar``, a hand-written ``__init__`` or a classmethod
    set, one set later, in ``__dict__`` or a slot a base class declares. ``fn`` sees them, so
    the fingerprint does: a config with such state has a fingerprint of its own (with none, the
    form is as before). A ``cached_property``'s value present when ``apply()`` takes the config
    counts too, whoever set it: whether its class set it (and in which shape) cannot be told
    from its source (red team rounds 27, 31-34); one with no JSON form is refused as state."""
    declared = getattr(type(value), "__dataclass_fields__", {})
    found = {
        name: item
        for name, item in getattr(value, "__dict__", {}).items()
        if name not in declared and name != "__orig_class__"  # ``Box[int](1)``: Python's own
    }
    for klass in type(value).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in declared or name in ("__dict__", "__weakref__"):
                continue
            stored = f"_{klass.__name__.lstrip('_')}{name}" if _mangled(name) else name
            try:
                found.setdefault(stored, object.__getattribute__(value, stored))
            except AttributeError:
                continue  # a slot never set
    return sorted(found.items())


def _mangled(name: str) -> bool:
    return name.startswith("__") and not name.endswith("__")


def _state_form(value: Any, name: str, item: Any, path: str | None, walk: _Walk) -> Any:
    """The canonical form of one attribute of ``_instance_state``, or an error saying it is
    state, not a field, and how to give it a form."""
    if path is None:
        return _canonical(item, None, walk)
    try:
        return _canonical(item, f"{path}.{name}", walk)
    except ConfigError as exc:
        kind = type(value).__qualname__
        raise ConfigError(
            f"{path}.{name} is state of {kind} that is not a field (set by __init__, "
            f"__post_init__, a cached_property or later; fn sees it): {exc.what}",
            f"make it a field, compute it in fn (read a cached_property after apply()), or "
            f"give {kind} a canonical form with register_fingerprint",
            walk.step,
        ) from None


def not_utf8(form: Any, path: str = "") -> str | None:
    """The dotted path in a canonical form (a lowered payload) of the first key or string that
    UTF-8 cannot encode (a lone surrogate), or None."""

    def bad(text: str) -> bool:
        return not text.isascii() and any("\ud800" <= char <= "\udfff" for char in text)

    if isinstance(form, str):
        return (path or "the value") if bad(form) else None
    items = (
        form.items()
        if isinstance(form, dict)
        else enumerate(form)
        if isinstance(form, list)
        else ()
    )
    for key, item in items:
        where = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
        if isinstance(key, str) and bad(key):
            return f"{path}[{key!r}]"  # escaped: the key itself cannot be printed
        found = not_utf8(item, where)
        if found is not None:
            return found
    return None


def _registered_form(
    value: Any, found: tuple[type, Callable[[Any], Any]], path: str | None, walk: _Walk
) -> Any:
    base, fn = found
    try:
        form = fn(value)
    except Exception as exc:
        if path is None:
            raise _NeedsPath from None
        raise ConfigError(
            f"{path}: the fingerprint function registered for {base.__qualname__} raised "
            f"{type(exc).__name__}: {exc}",
            "fix the function passed to register_fingerprint",
            walk.step,
        ) from None
    if _registered_for(type(form)) == found:  # it would be encoded by fn again, for ever
        if path is None:
            raise _NeedsPath
        raise ConfigError(
            f"{path}: the fingerprint function registered for {base.__qualname__} returned a "
            f"{type(form).__qualname__}, which that same function would encode again",
            "return plain data from the function passed to register_fingerprint (a dict of its "
            "fields, a string)",
            walk.step,
        )
    kind = type(value)
    name = kind.__qualname__
    if kind is not base and any(c.__qualname__ == name for c in kind.__mro__[1:]):
        name = f"{kind.__module__}.{name}"  # ``fancy.Tok(base.Tok)``: r29-4, r30-5
    tagged = {"__registered__": name, "value": _canonical(form, path, walk)}
    if kind is not base:  # a subclass is its own config (an ``np.matrix`` is no ``ndarray``)
        own = _fields_below(value, base, path, walk)
        if own:
            tagged["fields"] = own
    return tagged


def _fields_below(value: Any, base: type, path: str | None, walk: _Walk) -> dict[str, Any]:
    """The dataclass fields a subclass of a registered ``base`` declares itself: the function
    registered for ``base`` does not know them (red team r28-1)."""
    inherited = getattr(base, "__dataclass_fields__", {})
    if not dataclasses.is_dataclass(value):
        return {}
    declared = [f.name for f in dataclasses.fields(value)]  # no ``InitVar``: r30-6
    return {
        name: _canonical(getattr(value, name), None if path is None else f"{path}.{name}", walk)
        for name in sorted(declared)
        if name not in inherited
    }


def _key_text(key: Any, walk: _Walk) -> str:
    if isinstance(key, enum.Enum) and type(key) is not str:
        return key.name
    if isinstance(key, str):  # its own text, never a subclass's ``__str__``
        return str.__str__(key) if walk.text_keys else str(_text_form(key))
    return str(key)
