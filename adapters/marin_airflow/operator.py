"""The operators every task of an exported DAG is: call a Marin runtime function.

A generated DAG file imports this module at parse time, so it stays small: Airflow's
``BaseOperator`` and ``SkipMixin``, the core's vocabulary, and nothing of the pipeline. A
``MarinOperator`` is lighter to create than a ``PythonOperator`` (at 10,000 tasks, parse time is
mostly operator construction): it has no template fields, so the step data it holds is never
rendered as a Jinja template (no ``literal()`` wrapping needed) and there are no template values
to scan for XCom references.

It also answers Airflow's OpenLineage provider (``apache-airflow-providers-openlineage``), when
a user runs it: a step task's events carry the datasets Marin's own events name for the step
(``artifact_names``, under the run's real prefix), not an opaque task. The provider is imported
only when it asks, so a DAG file parses without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseOperator, SkipMixin

from marin.execution.vocabulary import Action
from marin_airflow.contract import XComKey


@dataclass(frozen=True, slots=True)
class TaskDatasets:
    """The OpenLineage datasets of one step task's run, as ``(namespace, name)`` pairs.

    Recorded by the task runtime once it knows the run's prefix: ``inputs`` before the step
    builds, ``output`` only once this task has committed a build of it.
    """

    inputs: Sequence[tuple[str, str]]
    output: tuple[str, str] | None = None


class MarinOperator(BaseOperator):
    """Calls ``marin_call(**marin_kwargs)`` and returns its dict, one XCom per key.

    ``marin_kwargs`` is plain data from the DAG file (strings, numbers, None). The callable
    reads the run's params and task instance itself, from Airflow's current context.
    """

    template_fields = ()
    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        marin_call: Callable[..., dict[str, Any]],
        marin_kwargs: Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        super().__init__(multiple_outputs=True, **kwargs)
        self.marin_call = marin_call
        self.marin_kwargs = marin_kwargs
        self.marin_datasets: TaskDatasets | None = None
        """What this task's run read and wrote (``record_datasets``); None until it knows."""

    def execute(self, context: Any) -> dict[str, Any] | None:
        return self._call(self.marin_kwargs)

    def _call(self, kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
        result = self.marin_call(**kwargs)
        if isinstance(result, dict):
            return result
        # A step's build pending on its remote job (``Pending``): the task defers instead of
        # waiting in this worker slot. The build lets its lease go (the job runs on); the
        # trigger waits for the job, and the task builds again, which collects it.
        from marin_airflow.trigger import RemoteJobTrigger

        job = result.why.job
        result.release(None)
        self.log.info("marin: step %s waits for %s job %s (deferred: slot freed)",
                      result.spec.step_id, job.backend, job.job_id)  # fmt: skip
        self.defer(
            trigger=RemoteJobTrigger(job.backend, job.job_id, dict(job.data)),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Any, event: Any = None) -> dict[str, Any] | None:
        """The job ended (the trigger fired): build again, which collects it and commits. The
        build waits for that job (``awaited_job``): found stopped, the step ends cancelled,
        never with a new job."""
        job_id = event.get("job_id") if isinstance(event, dict) else None
        if not isinstance(job_id, str):  # the event is stored data: only a string is a job id
            return self.execute(context)
        return self._call({**self.marin_kwargs, "awaited_job": job_id[:200]})

    def record_datasets(self, datasets: TaskDatasets) -> None:
        """Called by the task runtime (on this task's own operator, ``context["task"]``, the
        object the provider's listener asks afterwards)."""
        self.marin_datasets = datasets

    # -- Airflow's OpenLineage provider (its DefaultExtractor calls these) ------------------

    def get_openlineage_facets_on_start(self) -> Any:
        """The START names the job only: the datasets are known once the task has read its
        run's prefix (an empty answer; Airflow's provider then reads the declared inlets and
        outlets, asset aliases it cannot name yet, so none)."""
        return _operator_lineage(None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """A build: its dependencies' outputs in, its output out. Found built when it ran
        (another runner built it after the plan): the inputs only, as this run wrote no output.
        A step the plan serves has no task run, so no event at all."""
        return _operator_lineage(self.marin_datasets)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """A failed build committed nothing: the inputs only."""
        datasets = self.marin_datasets
        return _operator_lineage(None if datasets is None else TaskDatasets(datasets.inputs))


def _operator_lineage(datasets: TaskDatasets | None) -> Any:
    # Imported here: only Airflow's OpenLineage provider calls this, and only where installed.
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    if datasets is None:
        return OperatorLineage()
    return OperatorLineage(
        inputs=[Dataset(namespace=ns, name=name) for ns, name in datasets.inputs],
        outputs=[] if datasets.output is None else [Dataset(*datasets.output)],
    )


def step_tasks(downstream: Iterable[Any]) -> list[MarinOperator]:
    """The tasks among ``downstream`` that build a step (``marin_kwargs`` names it)."""
    return [t for t in downstream if isinstance(t, MarinOperator) and "step" in t.marin_kwargs]


def tasks_to_skip(tasks: Sequence[MarinOperator], launch: Iterable[str]) -> list[MarinOperator]:
    """The step tasks that need no launch: neither a step in ``launch`` nor downstream of one.

    A served step downstream of a step that runs (``cascade`` off, or a stale step) keeps its
    task, which ends "cached": skipped, it could not be blocked by a failure upstream, and a
    DAG run whose failed step has only skipped leaves below it would end "success".
    """
    by_id = {t.task_id: t for t in tasks}
    wanted = set(launch)
    running = {t.task_id for t in tasks if t.marin_kwargs["step"] in wanted}
    stack = list(running)
    while stack:  # iterative, O(tasks + edges): a 10,000-step chain has no recursion to hit
        for child in by_id[stack.pop()].downstream_task_ids:
            if child in by_id and child not in running:
                running.add(child)
                stack.append(child)
    return [t for t in tasks if t.task_id not in running]


class MarinPlanOperator(MarinOperator, SkipMixin):
    """The ``marin-plan`` task: decide every step, then skip the task of every step not built.

    The plan task is a direct upstream of every step task, so Airflow's ``SkipMixin.skip`` can
    mark the tasks of served (cached) and pruned steps ``skipped`` before the scheduler ever
    queues them: they cost no task launch, no worker slot, no pod. Step tasks use the
    ``none_failed`` trigger rule, so a skipped upstream never holds back a dependent that must
    build, while a failed one still blocks it (``upstream_failed``).

    The plan's keys (``build``, ``skip``, ``prune``, ``stale``: step ids; the policy used) are
    pushed as XComs before the skip, which ends ``execute`` by raising: that is how a task tells
    its supervisor which downstream tasks to skip. A stale step (its fingerprint in the DAG file
    is not the pipeline's) is never skipped: its task runs and fails, saying to re-export.
    ``inherits_from_skipmixin`` stays False on purpose: with it, Airflow's scheduler would read
    this task's XCom (a list as long as the DAG) for every step task it considers; without it,
    a cleared skipped task simply runs and finds its step built.
    """

    def execute(self, context: Any) -> None:
        tasks = step_tasks(self.downstream_list)
        fingerprints = {t.marin_kwargs["step"]: t.marin_kwargs.get("fingerprint") for t in tasks}
        plan = self.marin_call(**self.marin_kwargs, dag_fingerprints=fingerprints)
        ti = context["ti"]
        for key, value in plan.items():
            ti.xcom_push(key, value)
        skipped = tasks_to_skip(tasks, [*plan[Action.BUILD], *plan[XComKey.STALE]])
        names = {t.marin_kwargs["step"] for t in skipped}
        # What an Airflow user reads for the tasks skipped here (the XComs list them too).
        for action, what in ((Action.SKIP, "cached (served)"), (Action.PRUNE, "pruned")):
            steps = [step for step in plan[action] if step in names]
            if steps:
                self.log.info(
                    "marin: %d step(s) %s, their tasks skipped without a launch: %s",
                    len(steps),
                    what,
                    ", ".join(steps),
                )
        # Raises DownstreamTasksSkipped when there is something to skip; the task still succeeds.
        self.skip(ti, skipped)
