"""Marin's typed outputs: ``artifact_type=JsonArtifact`` (or ``Dataset``, ``Checkpoint``) on a
handle, so that ``handle.resolve()`` returns the typed value, and the manual payload API
``read_artifact`` / ``write_artifact``.

A data artifact (``Dataset``, ``Checkpoint``) is a reference to its output: ``load(path)`` reads
nothing. A value artifact is a ``JsonArtifact`` subclass declaring its fields (``class
Metrics(JsonArtifact): loss: float``); a ``run`` that returns one has those fields recorded as the
build's ``result``, and ``load`` reads them back from the record, checked against the fields
(stored data is untrusted). Subclasses become keyword-only dataclasses by themselves, as
Marin's pydantic models need no decorator; no pydantic here (the core needs fsspec and rich
only), so a field's type is checked for the plain JSON types and kept as is otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, get_type_hints

if TYPE_CHECKING:
    from marin.execution.store.records import ArtifactRecord

# The store (fsspec, the records) is imported where it is used: a job process imports its
# pipeline file, hence this module, and most jobs never read a record.

T = TypeVar("T", bound="TypedArtifact")
J = TypeVar("J", bound="JsonArtifact")
PAYLOAD_FILE = "artifact.json"
"""``write_artifact``'s file, inside the output (Marin's record file name)."""

__all__ = [
    "Checkpoint",
    "Dataset",
    "JsonArtifact",
    "TypedArtifact",
    "payload_of",
    "read_artifact",
    "write_artifact",
]


def record_at(url: str) -> ArtifactRecord | None:
    """The record of the output at ``url`` (absolute, or relative to ``$MARIN_PREFIX``), read
    from its metadata folder beside it; None when it has none (or another step's).

    Raises:
        StorageError: the location cannot be opened or read.
    """
    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import read_record

    if "://" not in url and not url.startswith("/"):
        return read_record(open_prefix(None), url.strip("/"))
    parent, _, leaf = url.rstrip("/").rpartition("/")
    return read_record(open_prefix(parent or "/"), leaf)


class TypedArtifact:
    """Marin's ``Artifact`` base (renamed: ``Artifact`` here is what ``run`` returns): a built
    output's ``path``, its ``record`` (read at most once), and ``load``.

    The base is a data reference: ``load(source)`` reads nothing, and nothing is recorded as its
    ``result``.
    """

    path: str

    def __init__(self, path: str = "", record: ArtifactRecord | None = None) -> None:
        self._bind(path, record)

    def _bind(self, path: str, record: ArtifactRecord | None) -> None:
        self.path = path
        # Declared here, not on the class: a subclass's type hints (``model_validate``) would
        # need ``ArtifactRecord``, which this module imports only for type checking.
        self._record: ArtifactRecord | None = record
        self._record_read: bool = record is not None

    @property
    def record(self) -> ArtifactRecord | None:
        """The record beside ``path`` (the one the build returned, else read once).

        Raises:
            StorageError: the record's location cannot be read.
        """
        if not self._record_read:
            self._record = record_at(self.path) if self.path else None
            self._record_read = True
        return self._record

    @classmethod
    def load(cls: type[T], source: str) -> T:
        """A reference to the output at ``source``; reads nothing.

        Raises:
            TypeError: never for a data reference (value artifacts check their record).
        """
        return cls(path=source)

    @classmethod
    def of(cls: type[T], artifact: Any) -> T:
        """The typed value of a run's ``Artifact`` (its URL and record), with no read.

        Raises:
            ValueError: a value artifact whose record holds no valid value.
        """
        return cls(path=artifact.url, record=artifact.record)

    def result_payload(self) -> dict[str, Any] | None:
        """What a build records as ``result`` when ``run`` returns this: nothing for a data
        reference."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={self.path!r})"


class Dataset(TypedArtifact):
    """A dataset (a tokenized cache, shards) at ``path``: a data reference."""


class Checkpoint(TypedArtifact):
    """A model checkpoint folder at ``path``: a data reference."""


_JSON_TYPES: dict[Any, tuple[type, ...]] = {
    str: (str,),
    int: (int,),
    float: (int, float),
    bool: (bool,),
    list: (list,),
    dict: (dict,),
}


class JsonArtifact(TypedArtifact):
    """A computed value recorded as the build's ``result``: subclass it and declare the fields
    (``class Metrics(JsonArtifact): loss: float``); the subclass is a keyword-only dataclass."""

    _fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(kw_only=True)(cls)
        cls._fields = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        self._bind("", None)

    @classmethod
    def model_validate(cls: type[J], data: Any) -> J:
        """An instance from stored data (untrusted): a JSON object holding every required field,
        each of its declared JSON type; other keys are ignored (as Marin's ``extra``).

        Raises:
            ValueError: ``data`` is not an object, lacks a field, or a field has another type.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__qualname__}: the stored value is not a JSON object")
        try:
            hints = get_type_hints(cls)
        except Exception:  # an annotation that does not evaluate here: no type checks
            hints = {}
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            if field.name not in data:
                required = field.default is field.default_factory is dataclasses.MISSING
                if required:
                    raise ValueError(f"{cls.__qualname__}: the stored value lacks {field.name!r}")
                continue
            value = data[field.name]
            kinds = _JSON_TYPES.get(hints.get(field.name))
            if kinds is not None and (
                not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))
            ):
                raise ValueError(
                    f"{cls.__qualname__}.{field.name} is stored as a {type(value).__name__}, "
                    f"not {hints[field.name].__name__}"
                )
            values[field.name] = value
        return cls(**values)

    def model_dump(self) -> dict[str, Any]:
        """The declared fields, as a dict (what the record's ``result`` holds)."""
        return {name: getattr(self, name) for name in self._fields}

    def result_payload(self) -> dict[str, Any] | None:
        return self.model_dump()

    @classmethod
    def load(cls: type[J], source: str) -> J:
        """The value recorded beside the output at ``source`` (one read).

        Raises:
            FileNotFoundError: no record is there.
            ValueError: the record's ``result`` does not hold this class's fields.
        """
        record = record_at(source)
        if record is None:
            raise FileNotFoundError(f"no artifact record at {source}")
        return cls._loaded(source, record)

    @classmethod
    def of(cls: type[J], artifact: Any) -> J:
        if artifact.record is None:
            raise ValueError(f"{artifact.url} has no record (a dry run builds nothing)")
        return cls._loaded(artifact.url, artifact.record)

    @classmethod
    def _loaded(cls: type[J], path: str, record: ArtifactRecord) -> J:
        value = cls.model_validate(record.result)
        value._bind(path, record)
        return value

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({fields})"


def payload_of(value: Any) -> Any:
    """What a build records as ``result`` for ``value`` that ``run`` returned: a typed
    artifact's payload, anything else as it is."""
    if isinstance(value, TypedArtifact):
        return value.result_payload()
    return value


def _plain(value: Any) -> Any:
    """``value`` as JSON data: a typed artifact's payload, a pydantic model's dump, a
    dataclass's fields."""
    if isinstance(value, TypedArtifact):
        return value.result_payload()
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def write_artifact(value: Any, output_path: str) -> None:
    """Write ``value`` (a ``JsonArtifact``, a pydantic model, a dataclass or JSON data) into
    ``output_path/artifact.json``, Marin's manual save API: inside a step, into its own output
    (``ctx.output_path``), where the output digest sees it. Never a record: only a build
    commits one.

    Raises:
        TypeError: ``value`` has no JSON form.
        OSError: the file cannot be written.
    """
    import fsspec

    from marin.execution.atomic_file import write_file_atomically

    data = (json.dumps({"result": _plain(value)}, sort_keys=True) + "\n").encode()
    if "://" in output_path:
        with fsspec.open(f"{output_path.rstrip('/')}/{PAYLOAD_FILE}", "wb", auto_mkdir=True) as f:
            f.write(data)
        return
    write_file_atomically(os.path.join(output_path, PAYLOAD_FILE), data, make_parents=True)


def read_artifact(output_path: str, schema: type[T] | Any) -> Any:
    """The typed payload of the output at ``output_path``: its record's ``result`` when a build
    recorded one, else what ``write_artifact`` wrote there, validated as ``schema`` (a
    ``JsonArtifact`` subclass, a pydantic model, or a dataclass).

    Raises:
        TypeError: ``schema`` is none of those.
        FileNotFoundError: neither a recorded result nor ``artifact.json`` is there.
        ValueError: the payload does not fit ``schema``.
    """
    validate = getattr(schema, "model_validate", None)
    if not isinstance(schema, type) or not (callable(validate) or dataclasses.is_dataclass(schema)):
        raise TypeError(
            f"schema must be a JsonArtifact subclass, a pydantic model or a dataclass, "
            f"got {schema!r}"
        )
    record = record_at(output_path)
    payload = record.result if record is not None else None
    if payload is None:
        payload = _read_payload_file(output_path)
    if callable(validate):
        return validate(payload)
    if not isinstance(payload, dict):
        raise ValueError(f"the payload at {output_path} is not a JSON object")
    names = {f.name for f in dataclasses.fields(schema)}
    return schema(**{k: v for k, v in payload.items() if k in names})


def _read_payload_file(output_path: str) -> Any:
    import fsspec

    from marin.execution.store.location import open_prefix
    from marin.execution.store.records import parse_json

    path = f"{output_path.rstrip('/')}/{PAYLOAD_FILE}"
    if "://" not in path and not path.startswith("/"):
        path = open_prefix(None).url_for(path)
    try:
        with fsspec.open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"no artifact payload at {output_path}") from None
    data = parse_json(raw.decode())
    if not isinstance(data, dict) or "result" not in data:
        raise ValueError(f"{path} is not an artifact payload")
    return data["result"]
