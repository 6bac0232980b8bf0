"""What ``run`` hands back: where a built step lives and what its record says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marin.execution.records import ArtifactRecord
    from marin.execution.step_spec import StepSpec


@dataclass(frozen=True)
class Artifact:
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
