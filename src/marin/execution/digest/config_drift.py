"""Explain why two fingerprints differ, one field per line.

The Marin maintainers' complaint was that a dry run said a hash changed but not why. Both the
stored and the current fingerprint payloads are canonical JSON, so a structural diff of the two
names every changed field by its dotted path.
"""

from __future__ import annotations

import json
import re
from typing import Any

_MISSING = object()


_PLAIN = re.compile(r"^[\w.@/:{}+-]+$")


MAX_VALUE_CHARS = 80
OUTSIDE_CONFIG_AND_DEPS = "payload changed outside config and deps"


def _short(value: Any) -> str:
    if isinstance(value, str) and _PLAIN.match(value):
        text = value  # `deps.tokens: v1 -> v2` reads better without quotes
    else:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    if len(text) <= MAX_VALUE_CHARS:
        return text
    return text[: MAX_VALUE_CHARS - 3] + "..."


def _keyed(value: Any) -> Any:
    """A typed map (``{"__map__": [[key, item], ...]}``: a config dict with a key that is not a
    string) as a dict by each key's display: a string as itself, another key as ``[<its
    JSON>]`` (``config.sizes[0]``, not ``config.sizes.0``, which is the key ``"0"``)."""
    if not (isinstance(value, dict) and len(value) == 1 and isinstance(value.get("__map__"), list)):
        return value
    try:
        return {
            key if isinstance(key, str) else f"[{json.dumps(key, sort_keys=True)}]": item
            for key, item in value["__map__"]
        }
    except (TypeError, ValueError):  # a stored payload is untrusted: shown as it is
        return value


def _walk(old: Any, new: Any, path: str, out: list[str]) -> None:
    old, new = _keyed(old), _keyed(new)
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            at = f"{path}{key}" if key.startswith("[") else f"{path}.{key}"
            _walk(old.get(key, _MISSING), new.get(key, _MISSING), at, out)
        return
    if isinstance(old, list) and isinstance(new, list):
        # Element by element; a longer or shorter list shows as items added or removed at the end.
        for i in range(max(len(old), len(new))):
            a = old[i] if i < len(old) else _MISSING
            b = new[i] if i < len(new) else _MISSING
            _walk(a, b, f"{path}[{i}]", out)
        return
    if old == new:
        return
    if old is _MISSING:
        out.append(f"{path}: added {_short(new)}")
    elif new is _MISSING:
        out.append(f"{path}: removed (was {_short(old)})")
    else:
        out.append(f"{path}: {_short(old)} -> {_short(new)}")


def explain_drift(old_payload: str, new_payload: str, limit: int = 20) -> list[str]:
    """One line per changed field, at most ``limit`` lines plus a "... and N more" line.

    ``config.lr: 0.1 -> 0.2`` (nested fields by dotted path, list items as ``[i]``),
    ``config.seed: added 3``, ``config.old: removed (was 1)``, and a dependency whose version
    changed as ``deps.ngram/dataset: v1 -> v2``.
    """
    try:
        old, new = json.loads(old_payload), json.loads(new_payload)
    except (ValueError, RecursionError):
        return ["stored fingerprint payload is unreadable"]
    if not (isinstance(old, dict) and isinstance(new, dict)):
        # Stored payloads are checked when a record is read (``ArtifactRecord.from_json``);
        # this keeps the function total for any caller.
        return ["stored fingerprint payload is unreadable"]
    lines: list[str] = []
    for section in ("config", "deps", "fn"):  # fn: what a partial step function binds
        _walk(old.get(section, _MISSING), new.get(section, _MISSING), section, lines)
    if not lines and old != new:
        lines.append(OUTSIDE_CONFIG_AND_DEPS)
    if len(lines) > limit:
        hidden = len(lines) - limit
        lines = [*lines[:limit], f"... and {hidden} more changed field(s)"]
    return lines


def bumped_inputs(old_payload: str, new_payload: str) -> list[tuple[str, str]]:
    """The dependencies whose version changed between two payloads, with the new version:
    ``[("ngram/dataset", "v2")]`` when the dataset was bumped but its reader was not."""
    try:
        old, new = json.loads(old_payload), json.loads(new_payload)
    except (ValueError, RecursionError):
        return []
    old_deps = old.get("deps") if isinstance(old, dict) else None
    new_deps = new.get("deps") if isinstance(new, dict) else None
    if not (isinstance(old_deps, dict) and isinstance(new_deps, dict)):
        return []
    both = sorted(set(old_deps) & set(new_deps))
    return [(name, str(new_deps[name])) for name in both if old_deps[name] != new_deps[name]]
