"""The one operator every task of an exported DAG is: call a Marin runtime function.

A generated DAG file imports this module at parse time, so it stays small: Airflow's
``BaseOperator`` and nothing of the pipeline or the Marin core. It is lighter to create than a
``PythonOperator`` (at 10,000 tasks, parse time is mostly operator construction): it has no
template fields, so the step data it holds is never rendered as a Jinja template (no
``literal()`` wrapping needed) and there are no template values to scan for XCom references.

It also answers Airflow's OpenLineage provider (``apache-airflow-providers-openlineage``), when
a user runs it: a step task's events carry the datasets Marin's own events name for the step
(``artifact_names``, under the run's real prefix), not an opaque task. The provider is imported
only when it asks, so a DAG file parses without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseOperator


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

    def execute(self, context: Any) -> dict[str, Any]:
        return self.marin_call(**self.marin_kwargs)

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
        """A build: its dependencies' outputs in, its output out. Found built (cached, or
        built by another runner): the inputs only, as no output was written by this run."""
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
