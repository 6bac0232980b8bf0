"""The one operator every task of an exported DAG is: call a Marin runtime function.

A generated DAG file imports this module at parse time, so it stays small: Airflow's
``BaseOperator`` and nothing of the pipeline or the Marin core. It is lighter to create than a
``PythonOperator`` (at 10,000 tasks, parse time is mostly operator construction): it has no
template fields, so the step data it holds is never rendered as a Jinja template (no
``literal()`` wrapping needed) and there are no template values to scan for XCom references.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow.sdk import BaseOperator


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

    def execute(self, context: Any) -> dict[str, Any]:
        return self.marin_call(**self.marin_kwargs)
