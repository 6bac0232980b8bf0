"""What ``run`` hands back: where a built step lives and what its record says.

Also the public home of the two identity errors Marin's users import from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.execution.errors import (
    ArtifactTypeMismatchError,
    FingerprintMismatchError,
    StorageError,
)

if TYPE_CHECKING:
    from marin.execution.pipeline.step_spec import StepSpec
    from marin.execution.store.location import Location
    from marin.execution.store.records import ArtifactRecord

__all__ = ["Artifact", "ArtifactTypeMismatchError", "FingerprintMismatchError", "load_dependency"]


@dataclass(frozen=True)
class Artifact:
    """A built (or served) step: its spec, where consumers read it, and its record."""

    spec: StepSpec
    url: str
    record: ArtifactRecord | None
    """None only for a dry run, which builds nothing."""

    def path(self) -> str:
        return self.url

    @property
    def result(self) -> Any:
        """The JSON value ``fn`` returned when it built this artifact."""
        return self.record.result if self.record else None


def load_dependency(location: Location, spec: StepSpec, step_id: str) -> Artifact:
    """The ``Artifact`` of ``spec``'s dependency ``step_id`` (``ctx.resolved``'s loader).

    The runner built or served every dependency before this step runs; a record that is gone
    now was deleted in between, and building on a guess would be wrong.
    """
    from marin.execution.store.records import read_record

    dep = next(d for d in spec.deps if d.step_id == step_id)
    record = read_record(location, dep.output_path)
    if record is None:
        raise StorageError(
            f"dependency {step_id} has no record at {location.url_for(dep.output_path)} any more",
            "run again: a dependency whose record is gone is rebuilt first",
            spec.step_id,
        )
    return Artifact(dep, dep.data_url(location.url), record)
