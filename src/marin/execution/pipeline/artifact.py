"""What ``run`` hands back: where a built step lives and what its record says.

Also the public home of the two identity errors Marin's users import from here, of Marin's typed
outputs (``JsonArtifact``, ``Dataset``, ``Checkpoint``, ``read_artifact``, ``write_artifact``:
``artifact_types.py``), and of ``Artifact.from_id``, which resolves a registered id
(``store/registry.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.execution.errors import (
    ArtifactTypeMismatchError,
    FingerprintMismatchError,
    StorageError,
)
from marin.execution.pipeline.artifact_types import (
    Checkpoint,
    Dataset,
    JsonArtifact,
    TypedArtifact,
    read_artifact,
    record_at,
    write_artifact,
)

if TYPE_CHECKING:
    from marin.execution.pipeline.step_spec import StepSpec
    from marin.execution.store.location import Location
    from marin.execution.store.records import ArtifactRecord

__all__ = [
    "Artifact",
    "ArtifactTypeMismatchError",
    "Checkpoint",
    "Dataset",
    "FingerprintMismatchError",
    "JsonArtifact",
    "TypedArtifact",
    "load_dependency",
    "read_artifact",
    "read_record",
    "write_artifact",
]


@dataclass(frozen=True)
class Artifact:
    """A built (or served) step: its spec, where consumers read it, and its record."""

    spec: StepSpec | None
    """None for an artifact resolved from the registry (``from_id``): its record says what it
    is."""
    url: str
    record: ArtifactRecord | None
    """None only for a dry run, which builds nothing."""

    def path(self) -> str:
        return self.url

    @property
    def result(self) -> Any:
        """The JSON value ``fn`` returned when it built this artifact."""
        return self.record.result if self.record else None

    @classmethod
    def from_id(
        cls,
        id: str,
        version: str | None = None,
        /,
        artifact_type: type | None = None,
        *,
        prefix: str | None = None,
    ) -> Any:
        """The build registered as ``id`` (``"ns/name/tag"``, or Marin's ``("ns/name",
        "tag")``) under ``prefix`` (default ``$MARIN_PREFIX``), resolved with two reads: its
        manifest, which names the step and build and holds that build's record, served as
        registered, and the record at its path, which must not be another build's. A
        registered build is frozen (no commit replaces it in place); one replaced by hand is
        refused, and one deleted by hand is only seen when its data is read. With a typed
        ``artifact_type`` (``JsonArtifact`` subclass, ``Dataset``, ...) the typed value, else
        an ``Artifact``.

        Raises:
            InvalidArtifactIdError: ``id`` is not ``namespace/name/tag``.
            ArtifactNotFoundError: nothing is registered as ``id`` under the prefix.
            ArtifactRegistryError: its manifest cannot be trusted, or its path holds another
                build now (the registered build is gone).
            StorageError: the prefix cannot be opened, or storage kept failing.
            ValueError: a typed ``artifact_type`` whose fields the recorded value lacks.
        """
        from marin.execution.store.location import open_prefix
        from marin.execution.store.registry import RegistryId, resolve

        reg_id = RegistryId.parse(id, version)
        location = open_prefix(prefix)
        manifest = resolve(location, reg_id)  # its record is checked on parse, then its path
        artifact = cls(None, manifest.url(location), manifest.record)
        if isinstance(artifact_type, type) and issubclass(artifact_type, TypedArtifact):
            return artifact_type.of(artifact)
        return artifact


read_record = record_at
"""Marin's ``read_record(output_path)``: the record beside an output URL (or a path relative to
``$MARIN_PREFIX``), or None. (``marin.execution.store.records.read_record(location, path)`` is
the engine's own reader.)"""


def load_dependency(location: Location, spec: StepSpec, step_id: str) -> Artifact:
    """The ``Artifact`` of ``spec``'s dependency ``step_id`` (``ctx.resolved``'s loader).

    The runner built or served every dependency before this step runs; a record that is gone
    now was deleted in between, and building on a guess would be wrong.
    """
    from marin.execution.store.records import read_record

    dep = next(d for d in spec.deps if d.step_id == step_id)
    record = read_record(location, dep.output_path, step=(dep.name, dep.version))
    if record is None:
        raise StorageError(
            f"dependency {step_id} has no record at {location.url_for(dep.output_path)} any more",
            "run again: a dependency whose record is gone is rebuilt first",
            spec.step_id,
        )
    return Artifact(dep, dep.data_url(location.url), record)
