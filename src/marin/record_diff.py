"""``marin diff A B``: the field-level difference between two steps' records.

Two versions of one step, or two points of a sweep: both records' fingerprint payloads are
compared by the differ drift uses (``marin.execution.digest.config_drift``), so ``marin diff`` and
``marin plan`` name a changed field the same way.
"""

from __future__ import annotations

from marin.execution.digest.config_drift import OUTSIDE_CONFIG_AND_DEPS, explain_drift
from marin.execution.store.records import ArtifactRecord, read_record
from marin.terminal_text import safe_text

DIFF_LIMIT = 200
"""Changed fields listed before "... and N more"."""


def read_built(what: str, prefix: str | None) -> ArtifactRecord:
    """The record ``what`` (as ``marin show`` takes it) names, or a ``NotFoundError``."""
    from marin.catalog import NotFoundError, closest_hint, resolve_show_target

    location, output_path = resolve_show_target(what, prefix)
    record = read_record(location, output_path)
    if record is None:
        name = output_path.rpartition("/")[0] or output_path
        raise NotFoundError(
            f"{what} has no record under {location.url} (it is not built)",
            closest_hint(location, name),
            what,
        )
    return record


def diff_records(a: ArtifactRecord, b: ArtifactRecord) -> list[str]:
    """One line per changed field of config and deps (empty: the same definition)."""
    if a.fingerprint_payload == b.fingerprint_payload:
        return []
    pairs = (("name", a.name, b.name), ("version", a.version, b.version))
    identity = [f"{key}: {x} -> {y}" for key, x, y in pairs if x != y]
    fields = explain_drift(a.fingerprint_payload, b.fingerprint_payload, DIFF_LIMIT)
    if identity and fields == [OUTSIDE_CONFIG_AND_DEPS]:
        fields = []  # the name or version is what changed outside config and deps
    return identity + fields


def render_diff(a: ArtifactRecord, b: ArtifactRecord) -> str:
    lines = [f"--- {safe_text(a.step_id)} (fingerprint {a.fingerprint[:12]})"]
    lines.append(f"+++ {safe_text(b.step_id)} (fingerprint {b.fingerprint[:12]})")
    changed = diff_records(a, b)
    if changed:
        lines += [safe_text(line) for line in changed]
    else:
        lines.append("no difference in config or dependencies")
    return "\n".join(lines) + "\n"
