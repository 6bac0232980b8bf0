"""The names of one artifact outside Marin: its URL, its OpenLineage dataset and its asset key.

The one place these are computed. OpenLineage events, Airflow assets, Prefect assets,
``marin show`` and ``marin plan --json`` all read them from here, so a catalog, an Airflow
asset and a Prefect asset of one artifact always name the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from marin.execution.store.location import Location

if TYPE_CHECKING:
    from marin.execution.pipeline.step_spec import StepSpec


@dataclass(frozen=True, slots=True)
class ArtifactNames:
    """How one step's output is named by each system that can see it."""

    url: str
    """The artifact's URL as Marin prints it: an absolute local path or ``protocol://...``."""
    dataset_namespace: str
    """OpenLineage dataset namespace: ``file`` for local paths, ``s3://bucket``, ``gs://bucket``."""
    dataset_name: str
    """OpenLineage dataset name within the namespace: the path (local) or the object key."""
    asset_uri: str
    """The asset key for Airflow ``Asset(uri=...)`` and Prefect assets: always ``scheme://...``
    (Prefect's escapes what it refuses: ``prefect_asset_key``)."""

    def to_json(self) -> dict[str, str]:
        return {
            "url": self.url,
            "dataset_namespace": self.dataset_namespace,
            "dataset_name": self.dataset_name,
            "asset_uri": self.asset_uri,
        }


def names_for_url(url: str) -> ArtifactNames:
    """The names of the artifact at ``url`` (what ``Location.url_for`` returns).

    OpenLineage's naming convention (spec/Naming.md): a local file is namespace ``file`` and
    its absolute path as name; an object store is ``scheme://bucket`` and the key without a
    leading slash. Other fsspec protocols follow the object-store form. ``memory://`` is
    process-local, so its names are only meaningful within the one process.
    """
    if "://" not in url:
        path = url if url.startswith("/") else "/" + url
        # ``quote`` keeps ``/``: a path with spaces or ``#`` still makes one valid file URI.
        return ArtifactNames(url, "file", path, "file://" + quote(path, safe="/"))
    scheme, rest = url.split("://", 1)
    authority, _, key = rest.partition("/")
    if scheme == "memory":
        # memory:// has no bucket: the first path part is part of the path.
        return ArtifactNames(url, "memory", "/" + rest.lstrip("/"), url)
    return ArtifactNames(url, f"{scheme}://{authority}", key, url)


PREFECT_REFUSED = frozenset("\n\r\t\0 #?&%\"'<>[]{}|\\^`")
"""What Prefect refuses in an asset key (its ``RESTRICTED_ASSET_CHARACTERS``, which
``tests/prefect/test_prefect_names.py`` checks this against; Prefect is not imported here)."""
KEY_ESCAPE = "~"
"""Starts an escape in a Prefect asset key: ``~`` and two hex digits stand for one character."""


def prefect_asset_key(names: ArtifactNames) -> str:
    """The Prefect asset key of an artifact: its URL with what Prefect refuses escaped.

    Prefect refuses ``%`` (so the percent-encoded ``asset_uri`` of ``e/50%`` or of a prefix with
    a space), spaces, quotes, ``#``, ``{}``... in a key. A local artifact's key is ``file://``
    and its raw path, an object store's its URL, with each refused character and ``~`` itself
    written ``~`` and two hex digits: one key per URL (the escape is reversible), and the key
    of a plain URL is its ``asset_uri`` unchanged.
    """
    raw = "file://" + names.dataset_name if names.dataset_namespace == "file" else names.url
    escaped = PREFECT_REFUSED | {KEY_ESCAPE}
    return "".join(f"{KEY_ESCAPE}{ord(c):02X}" if c in escaped else c for c in raw)


def artifact_names(location: Location, output_path: str) -> ArtifactNames:
    """The names of the step output at ``output_path`` (relative) under ``location``."""
    return names_for_url(location.url_for(output_path))


def step_datasets(
    location: Location, spec: StepSpec
) -> tuple[dict[str, ArtifactNames], ArtifactNames]:
    """A step's inputs (its dependencies' outputs, by step id, each once, in dependency order)
    and its own output: what every lineage event of the step names (Marin's own OpenLineage
    events and what Airflow's OpenLineage provider reports for its task)."""
    inputs = {
        dep.step_id: artifact_names(location, dep.output_path)
        for dep in {d.step_id: d for d in spec.deps}.values()
    }
    return inputs, artifact_names(location, spec.output_path)
