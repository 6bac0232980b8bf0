"""``tools/relayout.py``'s import rewrite, on the forms the tree uses (issue 44)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "relayout", Path(__file__).resolve().parents[1] / "tools" / "relayout.py"
)
assert _spec is not None and _spec.loader is not None
relayout = importlib.util.module_from_spec(_spec)
sys.modules["relayout"] = relayout
_spec.loader.exec_module(relayout)


def code(text: str) -> str:
    return relayout.rewrite_text(text, doc=False, in_engine=False)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "from marin.execution.storage import open_prefix\n",
            "from marin.execution.store.location import open_prefix\n",
        ),
        (
            "from marin.execution.lease.core import Lease\n",
            "from marin.execution.store.lease.core import Lease\n",
        ),
        (
            "from marin.execution import records, faults as f\n",
            "from marin.execution import faults as f\nfrom marin.execution.store import records\n",
        ),
        (
            "from marin.execution import orchestrate\n",
            "from marin.execution.run import loop as orchestrate\n",
        ),
        (
            "import marin.execution.build as build\n",
            "import marin.execution.build.commit as build\n",
        ),
        (
            'monkeypatch.setattr("marin.execution.storage.RETRY_BASE_DELAY", 0)\n',
            'monkeypatch.setattr("marin.execution.store.location.RETRY_BASE_DELAY", 0)\n',
        ),
        (
            'importlib.import_module("marin.execution.isolated_child")\n',
            'importlib.import_module("marin.execution.pipeline.isolated_child")\n',
        ),
        (
            'mock.patch("marin.execution.lazy.run")\n',
            'mock.patch("marin.execution.run.api.run")\n',
        ),
        (
            "from marin.execution.lazy import OUT, _flatten, run\n",
            "from marin.execution.lazy import OUT, run\n"
            "from marin.execution.pipeline.handles import _flatten\n",
        ),
        (
            "from marin.execution import lazy\n",
            "from marin.execution.pipeline import handles as lazy\n",
        ),
    ],
)
def test_an_old_import_is_rewritten_once(old: str, new: str) -> None:
    assert code(old) == new
    assert code(new) == new  # a second run changes nothing


def test_the_engine_imports_the_implementation_and_docs_keep_marin_paths() -> None:
    line = "from marin.execution.lazy import ArtifactStep, run\n"
    engine = relayout.rewrite_text(line, doc=False, in_engine=True)
    assert engine == (
        "from marin.execution.pipeline.handles import ArtifactStep\n"
        "from marin.execution.run.api import run\n"
    )
    assert relayout.rewrite_text(line, doc=True, in_engine=False) == line
    doc = "see `marin.execution.storage` and src/marin/execution/orchestrate.py"
    assert relayout.rewrite_text(doc, doc=True, in_engine=False) == (
        "see `marin.execution.store.location` and src/marin/execution/run/loop.py"
    )
    inline = "call `from marin.execution.context import current_context`."
    assert relayout.rewrite_text(inline, doc=True, in_engine=False) == (
        "call `from marin.execution.pipeline.context import current_context`."
    )


def test_the_new_build_package_is_not_taken_for_the_old_module() -> None:
    for text in (
        "from marin.execution.build import commit, lineage\n",
        "from marin.execution.build.lineage.model import BuildEvent\n",
        "x = 'marin.execution.build.commit.build_step'\n",
    ):
        assert code(text) == text
    assert code("from marin.execution.build import build_step\n") == (
        "from marin.execution.build.commit import build_step\n"
    )


def test_a_statement_inside_a_string_is_left_whole() -> None:
    text = 'src = "from marin.execution.lazy import apply, OUT\\n"\n'
    assert code(text) == text


def test_a_long_docstring_line_is_wrapped_only_where_the_rewrite_made_it_long() -> None:
    before = (
        '"""Run ``python -m marin.execution.isolated_child IN OUT`` in a child, a fresh one."""\n'
    )
    after = relayout.wrap_long_prose(code(before), before)
    assert all(len(line) <= 100 for line in after.splitlines())
    assert "marin.execution.pipeline.isolated_child" in after
    long_code = "x = 1  # " + "y" * 120 + "\n"
    assert relayout.wrap_long_prose(long_code, "") == long_code  # a code line is never split
