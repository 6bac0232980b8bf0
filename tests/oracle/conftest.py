"""The soak (``@pytest.mark.soak``) runs only when asked: ``pytest -m soak``.

It is deselected, never skipped: a skip fails a CI run (tests/skip_policy.py), and the plain
``pytest`` of the README must not spend an hour on it.
"""

from __future__ import annotations

from typing import Any


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if "soak" in (config.getoption("markexpr", "") or ""):
        return
    keep = [item for item in items if item.get_closest_marker("soak") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
