"""A pipeline file that cannot be loaded is reported one way: exit 2, one line naming the file,
the line and the exception, the pipeline's own frames below it, and advice that fits the cause."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from marin.execution.errors import TargetError
from marin.execution.pipeline.targets import PipelineImportError, Target, load_target
from tests.ux.helpers import EXAMPLE, ROOT, marin, plan_file

BROKEN = {
    "missing_library": (
        "import json\nimport no_such_library_xyz\n",
        2,
        "ModuleNotFoundError: No module named 'no_such_library_xyz'",
        "pip install no_such_library_xyz",
    ),
    "key_error": (
        "CONFIG = {}\n\ndef size():\n    return CONFIG['size']\n\nSIZE = size()\n",
        4,
        "KeyError: 'size'",
        "fix the error at",
    ),
    "syntax_error": (
        "x = 1\ndef broken(:\n    pass\n",
        2,
        "SyntaxError: invalid syntax",
        "fix the syntax at",
    ),
    "type_error": ("x = 1 + 'a'\n", 1, "TypeError: unsupported operand", "fix the error at"),
}


def _write(tmp_path: Path, name: str) -> Path:
    source = BROKEN[name][0]
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_pipeline_file_is_one_line_exit_2_with_its_own_frames(
    tmp_path: Path, name: str
) -> None:
    path = _write(tmp_path, name)
    _, line, exception, advice = BROKEN[name]
    result = marin("plan", f"{path}:pipeline", "--prefix", str(tmp_path / "p"))
    assert result.returncode == 2, result.stderr
    first, *rest = result.stderr.strip().splitlines()
    assert first.startswith(f"error: importing {path} failed at {path}, line {line}: "), first
    assert exception in first and advice in first, first
    assert "Traceback" not in result.stderr
    # The user's frames are shown, the engine's are not.
    assert any(str(path) in frame for frame in rest), rest
    assert not any(os.path.join("src", "marin") in frame for frame in rest), rest


def test_a_missing_library_in_a_module_target_is_not_called_a_missing_module(
    tmp_path: Path,
) -> None:
    (tmp_path / "my_pipeline_mod.py").write_text("import no_such_library_xyz\n")
    result = marin("plan", "my_pipeline_mod:pipeline", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2
    assert "pip install no_such_library_xyz" in result.stderr
    assert "cannot import module 'my_pipeline_mod'" not in result.stderr
    assert "name a file instead" not in result.stderr


def test_a_module_target_that_fails_to_import_shows_the_same_frames_as_a_file(
    tmp_path: Path,
) -> None:
    """``mod:pipeline`` and ``mod.py:pipeline`` print the user's frames only, the same ones
    (a module target showed importlib's own frame)."""
    (tmp_path / "my_broken_mod.py").write_text("import json\nimport no_such_library_xyz\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    outputs = [
        marin("plan", target, "--prefix", str(tmp_path / "p"), env={"PYTHONPATH": path})
        for target in ("my_broken_mod:pipeline", f"{tmp_path / 'my_broken_mod.py'}:pipeline")
    ]
    frames = []
    for result in outputs:
        assert result.returncode == 2, result.stderr
        rest = result.stderr.strip().splitlines()[1:]
        assert rest and all(str(tmp_path) in line for line in rest if "File " in line), rest
        assert "importlib" not in result.stderr and "Traceback" not in result.stderr
        frames.append(rest)
    assert frames[0] == frames[1]


def test_a_misnamed_keyword_is_named_with_did_you_mean_through_the_cli(tmp_path: Path) -> None:
    _, result = plan_file(
        tmp_path,
        "from marin.execution.lazy import apply\n\n"
        "def train(lr, epochs=1):\n    return lr\n\n"
        "pipeline = [apply('train', train, version='v1', learning_rate=0.1)]\n",
    )
    assert result.returncode == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert "train takes no input 'learning_rate' (did you mean lr?)" in first, first
    assert "missing the required input 'lr'" in first, first
    assert "rename learning_rate= to lr=" in first, first
    assert "TypeError: error:" not in first and first.count("error:") == 1, first


def test_a_module_target_that_does_not_exist_says_so() -> None:
    result = marin("plan", "no_such_module_xyz.sub:pipeline")
    assert result.returncode == 2
    assert "cannot import module 'no_such_module_xyz.sub'" in result.stderr


def test_verbose_shows_the_whole_traceback_for_engine_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, "key_error")
    result = marin("-v", "plan", f"{path}:pipeline", "--prefix", str(tmp_path / "p"))
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "targets.py" in result.stderr


def test_a_typo_in_an_attribute_suggests_the_files_own_names(tmp_path: Path) -> None:
    result = marin("plan", EXAMPLE.replace(":pipeline", ":pipelin"))
    assert result.returncode == 2
    assert "did you mean" in result.stderr and ":pipeline?" in result.stderr
    other = tmp_path / "other.py"
    other.write_text(
        "from marin.execution.lazy import apply, OUT\n"
        "def f(out):\n    pass\n"
        "training_runs = [apply('a', f, version='v0', out=OUT)]\n"
    )
    typo = marin("plan", f"{other}:trainig_runs")
    assert typo.returncode == 2
    assert f"did you mean {other}:training_runs?" in typo.stderr
    assert "pipeline" not in typo.stderr.split("did you mean")[1]


def test_an_attribute_with_no_close_match_lists_the_candidates(tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_text(
        "from marin.execution.lazy import apply, OUT\n"
        "def f(out):\n    pass\n"
        "models = [apply('a', f, version='v0', out=OUT)]\n"
    )
    with pytest.raises(
        TargetError, match=r"name one of its handles, lists or functions: f, models"
    ):
        load_target(f"{other}:zzz")


def test_an_error_raised_by_a_target_function_is_a_pipeline_import_error(tmp_path: Path) -> None:
    other = tmp_path / "factory.py"
    other.write_text("def pipeline():\n    return {}['missing']\n")
    with pytest.raises(PipelineImportError, match=re.escape(f"{other}, line 2: KeyError")):
        load_target(f"{other}:pipeline")


@pytest.mark.parametrize(
    "text, location, attr, is_file, stem",
    [
        ("examples/ngram.py:pipeline", "examples/ngram.py", "pipeline", True, "ngram"),
        ("pkg.mod:attr.sub", "pkg.mod", "attr.sub", False, "mod"),
        ("dir/pipe:p", "dir/pipe", "p", True, "pipe"),
        ("C:\\work\\p.py:pipeline", "C:\\work\\p.py", "pipeline", True, "p"),
    ],
)
def test_one_target_grammar(text: str, location: str, attr: str, is_file: bool, stem: str) -> None:
    target = Target.parse(text)
    assert (target.location, target.attr, target.is_file, target.stem) == (
        location,
        attr,
        is_file,
        stem,
    )
    assert str(target) == text


@pytest.mark.parametrize("text", ["", "x", ":attr", "file.py:", 3])
def test_bad_targets_are_target_errors(text: object) -> None:
    with pytest.raises(TargetError):
        Target.parse(text)


def test_every_adapter_parses_targets_with_the_one_grammar() -> None:
    """No adapter splits a target by hand: they all go through ``Target.parse``."""
    hand_split = re.compile(r"""r(?:split|partition)\(":"\)|rsplit\(":", 1\)""")
    offenders = []
    for folder in ("src", "adapters"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "targets.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if hand_split.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
