"""Resource kinds: a typo of a standard kind is caught with did-you-mean, wherever it is
written; a custom kind stays possible and is said to be custom (issue 49)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin.execution.errors import InvalidStepError
from marin.execution.lazy import apply
from marin.execution.pipeline.resources import ResourcePool, parse_capacity, parse_resources
from tests.ux.helpers import EXAMPLE, marin, plan_file


def _noop() -> None:
    return None


@pytest.mark.parametrize(
    ("typo", "meant"), [("cpus", "cpu"), ("gpus", "gpu"), ("memroy", "memory")]
)
def test_a_typo_of_a_standard_kind_is_caught_in_a_step_and_in_a_capacity(
    typo: str, meant: str
) -> None:
    amount = "1GiB" if meant == "memory" else 1
    with pytest.raises(InvalidStepError, match=f"did you mean {meant}\\?") as info:
        apply("train", _noop, version="v1").with_options(resources={typo: amount})
    assert info.value.step == "train@v1" and f"{typo}=" not in info.value.fix
    with pytest.raises(InvalidStepError, match=f"'{typo}'.*did you mean {meant}\\?"):
        parse_capacity(f"{typo}={amount}")


def test_an_uppercase_standard_kind_gets_did_you_mean() -> None:
    with pytest.raises(InvalidStepError, match="did you mean cpu\\?"):
        parse_resources({"CPU": 1}, "train@v1")


@pytest.mark.parametrize("kind", ["tpu", "npu", "gpu_a100", "license"])
def test_a_custom_kind_stays_possible_and_is_said_to_be_custom(kind: str) -> None:
    request = parse_resources({kind: 2, "cpu": 1})
    assert dict(request.extra) == {kind: 2.0}
    assert parse_capacity(f"cpu=4,{kind}=2").extra == ((kind, 2.0),)
    problem = ResourcePool(parse_capacity("cpu=4")).shortfall(request)
    assert problem is not None
    assert f"{kind}=2 but the machine has 0 ({kind}: a custom kind" in problem[0]


def test_the_cli_catches_a_typo_in_resources(tmp_path: Path) -> None:
    result = marin("run", EXAMPLE, "--prefix", str(tmp_path / "p"), "--resources", "cpus=4")
    assert result.returncode == 2, result.stderr
    assert "names the resource kind 'cpus'" in result.stderr
    assert "did you mean cpu?" in result.stderr
    assert not (tmp_path / "p").exists()  # refused before anything ran


def _one_step(resources: str) -> str:
    return (
        "from marin.execution.lazy import apply\n\n"
        "def f():\n    return 1\n\n"
        f"pipeline = [apply('a', f, version='v1').with_options(resources={resources})]\n"
    )


def test_a_step_declaring_a_typo_fails_plan_with_did_you_mean_not_capacity_advice(
    tmp_path: Path,
) -> None:
    path, result = plan_file(tmp_path, _one_step("{'cpus': 1}"))
    assert result.returncode == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: importing {path} failed at {path}, line 6: "), first
    assert "did you mean cpu?" in first and "--resources" not in first, first
    # Only the user's frames: not dataclasses.replace's, nor a dataclass's generated __init__.
    assert "dataclasses" not in result.stderr and "<string>" not in result.stderr


def test_plan_says_a_custom_kind_is_custom(tmp_path: Path) -> None:
    _, result = plan_file(tmp_path, _one_step("{'tpu': 2}"))
    assert result.returncode == 0, result.stderr
    assert "[tpu=2 (tpu: custom)]" in result.stdout, result.stdout
