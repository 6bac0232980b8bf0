"""Run params are untrusted: whoever triggers a DAG run sets them. Each wrong type is a clear
error naming the param, never a bare ``TypeError`` or a silent default, and an error repeats
only a bounded part of what it was given. These call the runtime's functions directly (no
Airflow needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marin.execution.errors import InvalidStepError
from marin_airflow import runtime
from marin_airflow.contract import target_reference
from marin_airflow.export import build_export

HERE = Path(__file__).resolve().parent
TOY = f"{HERE / 'airflow_pipelines.py'}:toy"
MAX_MESSAGE = 2000


def _policy(**params: Any) -> Any:
    return runtime.run_policy({"params": params}, "warn", {})


@pytest.mark.parametrize("prefix", [5, 0, ["/tmp/x"], {"a": 1}, True], ids=repr)
def test_a_prefix_param_that_is_not_a_string_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: Any
) -> None:
    """Not a bare TypeError from deep in the storage code, and not (for a falsy 0) silently
    the default prefix: the task fails before the pipeline is imported."""
    with pytest.raises(InvalidStepError, match=r"param prefix=.* is a .*, not a path or URL"):
        runtime.choose_prefix(prefix, str(tmp_path / "baked"))
    dags = str(tmp_path / "dags")
    result = build_export(TOY, dags, prefix=str(tmp_path / "baked"))
    monkeypatch.setattr(runtime, "_airflow_context", lambda: {"params": {"prefix": prefix}})
    with pytest.raises(InvalidStepError, match="param prefix="):
        runtime.plan_steps(target=target_reference(TOY, dags), dag_dir=dags)
    task = result.tasks[0]
    with pytest.raises(InvalidStepError, match="param prefix="):
        runtime.run_step(
            target=target_reference(TOY, dags),
            step=task.step_id,
            fingerprint=task.fingerprint,
            dag_dir=dags,
        )
    assert not (tmp_path / "baked").exists(), "nothing may be built under the default"
    runtime.clear_cache()


@pytest.mark.parametrize(
    "on_drift", [0, False, [], ["warn"], "WARN", "x" * 100_000], ids=lambda v: repr(v)[:12]
)
def test_an_on_drift_param_that_is_not_a_policy_is_an_error_not_the_default(
    on_drift: Any,
) -> None:
    with pytest.raises(InvalidStepError) as caught:
        _policy(on_drift=on_drift)
    assert "on_drift=" in str(caught.value) and "warn, rebuild, error" in str(caught.value)
    assert len(str(caught.value)) < MAX_MESSAGE


def test_unset_params_take_their_defaults(tmp_path: Path) -> None:
    """Absent, None and "" mean unset, for every param alike."""
    assert runtime.choose_prefix("", str(tmp_path / "baked")) == str(tmp_path / "baked")
    policy = _policy(on_drift="", force="", cascade=None)
    assert (policy.on_drift, policy.force, policy.cascade) == ("warn", frozenset(), True)
    assert _policy(on_drift="rebuild").on_drift == "rebuild"


def test_a_hundred_thousand_unknown_force_names_give_a_short_error() -> None:
    names = [f"no-such-step-{i}" for i in range(100_000)]
    with pytest.raises(InvalidStepError) as caught:
        _policy(force=names)
    message = str(caught.value)
    assert len(message) < MAX_MESSAGE, f"{len(message)} characters"
    assert "no-such-step-0" in message and "and 99990 more" in message


@pytest.mark.parametrize("force", [[1] * 100_000, ["x" * 100_000, 1]], ids=["ints", "huge"])
def test_a_force_param_of_the_wrong_type_is_a_bounded_error(force: Any) -> None:
    with pytest.raises(InvalidStepError) as caught:
        _policy(force=force)
    message = str(caught.value)
    assert "force=" in message and "list of step names" in message
    assert len(message) < MAX_MESSAGE, f"{len(message)} characters"


def test_a_huge_cascade_param_is_a_bounded_error() -> None:
    with pytest.raises(InvalidStepError, match="cascade=") as caught:
        _policy(cascade="x" * 100_000)
    assert len(str(caught.value)) < MAX_MESSAGE


@pytest.mark.parametrize("keep_going", ["false", 1, []], ids=repr)
def test_a_keep_going_param_that_is_not_a_boolean_is_an_error(keep_going: Any) -> None:
    """The string "false" was truthy, so fail-fast was silently switched off."""
    with pytest.raises(InvalidStepError, match="keep_going="):
        runtime.failed_task_in_run({"params": {"keep_going": keep_going}})


@pytest.mark.parametrize("setting", [None, "0.25"])
def test_a_deferred_tasks_trigger_waits_at_most_the_poll_setting(setting: str | None) -> None:
    """``MARIN_REMOTE_POLL_MAX_S`` bounds the trigger's backoff as the poller's (30 s unset):
    the trigger is made in the task's process, whose environment the deployment sets."""
    code = (
        "from marin_airflow.trigger import RemoteJobTrigger\n"
        "print(RemoteJobTrigger('local', 'j', {}).serialize()[1]['max_delay_s'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "MARIN_REMOTE_POLL_MAX_S"}
    env.update({} if setting is None else {"MARIN_REMOTE_POLL_MAX_S": setting})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == (30.0 if setting is None else 0.25)


@pytest.mark.parametrize("setting", ["soon", "-1", "0", "nan", "inf"])
def test_a_poll_setting_that_is_not_positive_seconds_warns_and_keeps_the_default(
    setting: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo in ``MARIN_REMOTE_POLL_MAX_S`` failed every import of the poller (the CLI's
    too) with a bare ``ValueError``; zero or a negative number would have polled in a loop."""
    from marin.execution.remote.poller import POLL_MAX_ENV, poll_max_s

    monkeypatch.setenv(POLL_MAX_ENV, setting)
    with caplog.at_level("WARNING", logger="marin"):
        assert poll_max_s(30.0) == 30.0
    assert POLL_MAX_ENV in caplog.text and "positive number of seconds" in caplog.text


def test_an_empty_poll_setting_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    from marin.execution.remote.poller import POLL_MAX_ENV, poll_max_s

    monkeypatch.setenv(POLL_MAX_ENV, "")
    assert poll_max_s(30.0) == 30.0
    monkeypatch.setenv(POLL_MAX_ENV, "0.25")
    assert poll_max_s(30.0) == 0.25
