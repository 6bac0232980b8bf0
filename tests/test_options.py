"""``RunOptions``: defaults written once, every option checked once, engine parameters checked
like any argument (``RunOptions.from_params``, which the Airflow tasks use)."""

from __future__ import annotations

from typing import Any

import pytest

from marin.execution.errors import OptionError
from marin.execution.plan.options import DEFAULT_ON_DRIFT, RunOptions


def test_missing_or_null_params_take_the_defaults() -> None:
    assert RunOptions.from_params({}) == RunOptions()
    assert RunOptions.from_params(None) == RunOptions()
    nulls = {"on_drift": None, "force": None, "cascade": None, "keep_going": None}
    exported = RunOptions(on_drift="rebuild")
    assert RunOptions.from_params(nulls, defaults=exported) == exported
    assert RunOptions.from_params({"prefix": "/p", "unrelated": 1}).on_drift == DEFAULT_ON_DRIFT


def test_params_are_read_and_normalised() -> None:
    options = RunOptions.from_params(
        {"on_drift": "error", "force": "b, a,,", "cascade": False, "keep_going": True}
    )
    assert options == RunOptions(on_drift="error", force=("a", "b"), cascade=False, keep_going=True)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"on_drift": 0}, r"on_drift=0 is not a drift policy"),  # not the default
        ({"on_drift": ["warn"]}, r"on_drift=\['warn'\]"),
        ({"force": {"a": 1}}, r"force=\{'a': 1\}: use a list of step names"),
        ({"force": [1]}, r"force=\[1\]"),
        ({"cascade": "false"}, r"cascade='false': use True or False"),
        ({"keep_going": 1}, r"keep_going=1"),
        ({"max_concurrent": 0}, r"max_concurrent=0: use a whole number >= 1"),
    ],
)
def test_bad_params_are_option_errors(params: dict[str, Any], match: str) -> None:
    with pytest.raises(OptionError, match=match):
        RunOptions.from_params(params)


def test_an_error_lists_a_bounded_number_of_values() -> None:
    with pytest.raises(OptionError) as caught:
        RunOptions.from_params({"force": list(range(10_000))})
    assert "(and 9990 more)" in caught.value.what
    assert len(str(caught.value)) < 300
    with pytest.raises(OptionError) as long:
        RunOptions.from_params({"on_drift": "x" * 10_000})
    assert len(str(long.value)) < 300


def test_not_a_mapping_is_an_option_error() -> None:
    with pytest.raises(OptionError, match="run parameters"):
        RunOptions.from_params(["on_drift", "warn"])  # type: ignore[arg-type]


def test_airflow_task_params_go_through_the_same_checks() -> None:
    from marin_airflow.runtime import run_policy

    with pytest.raises(OptionError, match="on_drift=0"):
        run_policy({"params": {"on_drift": 0}}, DEFAULT_ON_DRIFT, {})
    assert run_policy({"params": {"on_drift": None}}, "rebuild", {}).on_drift == "rebuild"


def test_force_names_are_resolved_against_the_steps() -> None:
    from marin.execution.errors import InvalidStepError
    from marin.execution.lazy import OUT, apply, lower

    def fn(out_path: str) -> None: ...

    specs = [lower(apply(f"o/s{i}", fn, version="v0", out_path=OUT)) for i in range(3)]
    assert RunOptions(force=("o/s1",)).policy(specs).force == {"o/s1@v0"}
    with pytest.raises(InvalidStepError, match=r"o/n0, .*\(and 2 more\)"):
        RunOptions(force=tuple(f"o/n{i}" for i in range(12))).policy(specs)


def test_a_keep_going_failure_lists_a_bounded_number_of_steps() -> None:
    from marin.execution.errors import PipelineFailedError

    error = PipelineFailedError({f"s{i}@v0": RuntimeError("boom") for i in range(50)}, [])
    assert "s9@v0: RuntimeError: boom (and 40 more)]" in error.what
    assert "s10@v0" not in error.what and error.what.startswith("50 step(s) failed")


def test_an_empty_param_is_unset_like_an_empty_form_field() -> None:
    defaults = RunOptions(on_drift="rebuild", max_concurrent=3)
    options = RunOptions.from_params(
        {"on_drift": "", "force": "", "max_concurrent": None}, defaults=defaults
    )
    assert (options.on_drift, options.force, options.max_concurrent) == ("rebuild", (), 3)
