"""Prefect's settings where our code may start its temporary server: analytics off, and in
tests nothing under the user's home folder (not even the memo store or local result storage).

Each check runs in a fresh interpreter, since Prefect reads its settings once, at import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("prefect")

ROOT = Path(__file__).resolve().parents[2]

SHOW_SETTINGS = """
import json, sys
{setup}
from prefect.settings import get_current_settings
s = get_current_settings()
print(json.dumps({{
    "analytics": s.server.analytics_enabled,
    "home": str(s.home),
    "memo_store": str(s.server.memo_store_path),
    "results": str(s.results.local_storage_path),
}}))
"""


def settings_after(setup: str, tmp_path: Path, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    # The child imports the code under test: this checkout first, then the parent's own path.
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    clean.update({"HOME": str(tmp_path / "user-home"), "PYTHONPATH": path, **env})
    proc = subprocess.run(
        [sys.executable, "-c", SHOW_SETTINGS.format(setup=setup)],
        capture_output=True, text=True, env=clean, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_importing_marin_prefect_turns_server_analytics_off(tmp_path: Path) -> None:
    bare = settings_after("", tmp_path)
    assert bare["analytics"] is True, "Prefect's own default changed: revisit docs/prefect.md"
    ours = settings_after("import marin_prefect", tmp_path)
    assert ours["analytics"] is False
    # The user's own choice wins.
    kept = settings_after("import marin_prefect", tmp_path, PREFECT_SERVER_ANALYTICS_ENABLED="true")
    assert kept["analytics"] is True


def test_test_helpers_keep_prefect_out_of_the_users_home(tmp_path: Path) -> None:
    setup = (
        "from marin_testing.prefect import isolate_prefect_home\n"
        "home = isolate_prefect_home()\n"
        "print(json.dumps({'isolated': home}))"
    )
    got = settings_after(setup, tmp_path)
    user_home = str(tmp_path / "user-home")
    assert got["analytics"] is False
    for key in ("home", "memo_store", "results"):
        assert not str(got[key]).startswith(user_home), (key, got[key])
        assert "marin-prefect-home-" in str(got[key]), (key, got[key])


def test_test_helpers_remove_their_temporary_prefect_home_at_exit(tmp_path: Path) -> None:
    # The home is made in the child's TMPDIR, so the check sees only this child's folders.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    setup = (
        "from pathlib import Path\n"
        "from marin_testing.prefect import isolate_prefect_home\n"
        "home = isolate_prefect_home()\n"
        "Path(home, 'written-by-prefect').write_text('x')\n"
        "print(json.dumps({'isolated': home}))"
    )
    got = settings_after(setup, tmp_path, TMPDIR=str(tmp))
    assert str(got["home"]).startswith(str(tmp)), got
    assert list(tmp.glob("marin-prefect-home-*")) == [], "the child left its Prefect home behind"
