"""A history's runs on the other runners: the compiled Prefect flow and ``airflow dags test``.

An engine run has no ``run --json``: after it, the executor checks what ``marin plan`` serves
under the run's own options and under ``rebuild``/``rebuild`` (the same checks as after a CLI
run), that each ``fn`` started once per recipe, and that the run succeeded unless a failure
was injected. The Prefect flow runs in this process against the shared test harness; each
Airflow run exports the pipeline again (a changed config makes a stale DAG) and runs
``airflow dags test`` in a sandbox, in a subprocess.
"""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any

from tests.oracle.ops import RunOpts
from tests.ux.helpers import environ

if TYPE_CHECKING:
    from tests.oracle.executor import Executor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PrefectEngine:
    """``to_prefect_flow(target, ...)()``: one flow run per run."""

    name = "prefect"

    def run(self, ex: Executor, opts: RunOpts, injected: bool) -> None:
        from marin_testing.prefect import start_harness

        start_harness()
        from marin.execution.plan.options import RunOptions
        from marin_prefect import to_prefect_flow

        world = ex.world
        run_id = world.new_run_id()
        env = world.env(opts.ctx.user, run_id)
        force = [f"o/s{i}" for i in opts.force]
        with environ(env):
            options = RunOptions(
                on_drift=opts.on_drift,
                on_code_drift=opts.on_code_drift,
                force=force,
                cascade=opts.cascade,
            )
            flow = to_prefect_flow(world.target, options=options, prefix=world.prefix)
            state = flow(return_state=True)
            ok, said = bool(state.is_completed()), str(state.message or "")
        ex.script.emit(
            "from marin_prefect import to_prefect_flow  # Prefect's harness or server needed",
            "from marin.execution.plan.options import RunOptions",
            f"os.environ.update(env({opts.ctx.user!r}, {run_id!r}))",
            f"to_prefect_flow(TARGET, prefix=PREFIX, options=RunOptions(on_drift={opts.on_drift!r}, "
            f"on_code_drift={opts.on_code_drift!r}, force={force!r}, "
            f"cascade={opts.cascade!r}))(return_state=True)",
        )
        ex.check_engine_run(opts, run_id, ok, injected, self.name, said)


class AirflowEngine:
    """``marin export airflow`` then ``airflow dags test`` with the run's options as conf."""

    name = "airflow"

    def __init__(self) -> None:
        self._sandbox: Any = None
        self._runs = itertools.count()

    @property
    def sandbox(self) -> Any:
        if self._sandbox is None:
            from marin_testing.airflow import AirflowSandbox

            self._sandbox = AirflowSandbox(pythonpath=[ROOT])
            self._sandbox.migrate()
        return self._sandbox

    def run(self, ex: Executor, opts: RunOpts, injected: bool) -> None:
        from marin_airflow.export import build_export, write_export

        world = ex.world
        run_id = world.new_run_id()
        dags = os.path.join(self.sandbox.root, f"dags-{next(self._runs)}")
        dag_id = f"oracle_{world.stem}_{run_id}"
        write_export(build_export(world.target, dags, dag_id=dag_id))
        conf = {
            "prefix": world.prefix,
            "on_drift": opts.on_drift,
            "on_code_drift": opts.on_code_drift,
            "force": [f"o/s{i}" for i in opts.force],
            "cascade": opts.cascade,
        }
        proc = self.sandbox.dags_test(dag_id, dags, conf=conf, env=world.env(opts.ctx.user, run_id))
        ex.script.emit(
            f"# airflow: marin export airflow TARGET -o DAGS --dag-id {dag_id}, then",
            f"#   airflow dags test {dag_id} --conf {conf!r}  (env as for marin)",
        )
        ex.check_engine_run(
            opts,
            run_id,
            proc.returncode == 0,
            injected,
            self.name,
            proc.stdout[-3000:] + proc.stderr[-2000:],
        )


ENGINES = {"prefect": PrefectEngine, "airflow": AirflowEngine}
