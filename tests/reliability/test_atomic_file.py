"""The one atomic local write: old or new bytes, never a prefix, and no debris on failure."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marin.execution.atomic_file import TMP_MARK, write_file_atomically

# A child whose files may not grow past 1 KiB: a real EFBIG in the middle of a write, as a
# full disk would give.
_LIMITED_WRITE = textwrap.dedent(
    """
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
    {body}
    """
)


def _run_limited(body: str) -> subprocess.CompletedProcess[str]:
    code = _LIMITED_WRITE.format(body=textwrap.dedent(body))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_replaces_the_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    target.write_bytes(b"old")
    write_file_atomically(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["f.json"]


def test_makes_parents_only_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "f"
    with pytest.raises(FileNotFoundError):
        write_file_atomically(str(target), b"x")
    write_file_atomically(str(target), b"x", make_parents=True)
    assert target.read_bytes() == b"x"


@pytest.mark.parametrize("fsync", [False, True])
def test_a_write_that_fails_midway_keeps_the_old_bytes_and_no_debris(
    tmp_path: Path, fsync: bool
) -> None:
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    result = _run_limited(
        f"""
        from marin.execution.atomic_file import write_file_atomically
        try:
            write_file_atomically({str(target)!r}, b"x" * 100_000, fsync={fsync})
        except OSError as exc:
            print("raised", exc.errno)
        """
    )
    assert "raised" in result.stdout, result.stderr
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_an_interrupt_while_writing_leaves_no_debris(tmp_path: Path) -> None:
    target = tmp_path / "f"

    def interrupt(_: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_file_atomically(str(target), b"data", on_open=interrupt)
    assert list(tmp_path.iterdir()) == []
    assert TMP_MARK == ".tmp-"


def test_a_dag_export_that_fails_midway_leaves_no_temporary_file(tmp_path: Path) -> None:
    dag = tmp_path / "dags" / "big_dag.py"
    result = _run_limited(
        f"""
        from marin_airflow.export import ExportResult, write_export
        result = ExportResult(
            path={str(dag)!r}, text="x" * 100_000, tasks=(), dag_id="big_dag", command="", root=""
        )
        try:
            write_export(result)
        except OSError as exc:
            print("raised", exc.errno)
        """
    )
    assert "raised" in result.stdout, result.stderr
    assert list((tmp_path / "dags").iterdir()) == []
