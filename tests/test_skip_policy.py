"""The skip policy itself: an unexpected skip fails a strict run; allowed ones and lax runs pass."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import skip_policy

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(
    tmp_path: Path, body: str, strict: str, ci: str | None = None
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(body))
    (tmp_path / "test_passing.py").write_text("def test_ok():\n    pass\n")
    env = {**os.environ, "MARIN_STRICT_SKIPS": strict, "PYTHONPATH": str(ROOT)}
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.skip_policy", "-rs", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip


UNEXPECTED = """
    import pytest

    def test_engine():
        pytest.importorskip("no_such_engine_module_xyz")
"""
AT_COLLECTION = """
    import pytest

    pytest.importorskip("no_such_engine_module_xyz")

    def test_engine():
        pass
"""
ALLOWED = """
    import pytest

    @pytest.mark.skipif(True, reason="Graphviz `dot` is not installed")
    def test_dot():
        pass
"""

NO_POSTGRES = """
    import pytest

    def test_celery():
        pytest.skip("PostgreSQL is not installed: apt-get install -y postgresql")
"""


@pytest.mark.parametrize("body", [UNEXPECTED, AT_COLLECTION], ids=["in-test", "at-collection"])
def test_an_unexpected_skip_fails_a_strict_run(tmp_path: Path, body: str) -> None:
    strict = run_pytest(tmp_path, body, "1")
    assert strict.returncode == 1, strict.stdout
    assert "unexpected skip" in strict.stdout and "no_such_engine_module_xyz" in strict.stdout
    lax = run_pytest(tmp_path, body, "0")
    assert lax.returncode == 0, lax.stdout
    assert "SKIPPED" in lax.stdout and "no_such_engine_module_xyz" in lax.stdout  # -rs


def test_an_allowed_skip_passes_a_strict_run(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, ALLOWED, "1")
    assert result.returncode == 0, result.stdout
    assert "SKIPPED" in result.stdout and "Graphviz" in result.stdout


def test_a_system_package_ci_installs_may_skip_only_outside_ci(tmp_path: Path) -> None:
    outside = run_pytest(tmp_path, NO_POSTGRES, "1")
    assert outside.returncode == 0, outside.stdout
    assert "SKIPPED" in outside.stdout and "PostgreSQL is not installed" in outside.stdout
    in_ci = run_pytest(tmp_path, NO_POSTGRES, "1", ci="true")
    assert in_ci.returncode == 1, in_ci.stdout
    assert "unexpected skip: PostgreSQL is not installed" in in_ci.stdout


def test_strict_by_default_where_the_extras_are_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MARIN_STRICT_SKIPS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    import importlib.util

    installed = all(importlib.util.find_spec(n) for n in skip_policy.EXTRAS)
    assert skip_policy.strict() is installed
    monkeypatch.setenv("CI", "true")
    assert skip_policy.strict()
    monkeypatch.setenv("MARIN_STRICT_SKIPS", "0")
    assert not skip_policy.strict()
