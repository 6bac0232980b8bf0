"""``BuildRequest``: everything one ``build_step`` call needs, as one value.

A run loop makes one per attempt (its ``StepJob`` carries it to the executor); an engine's task
(the Airflow step task, a Dask worker) makes its own; so does a direct caller
(``build_step(BuildRequest(spec, location))``). An executor that builds elsewhere reads its
fields and sends what can travel (not ``abandon`` nor the open ``location``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.decide import Decision, Upstream
from marin.execution.plan.options import Policy
from marin.execution.store.location import Location
from marin.execution.vocabulary import Wait


@dataclass(frozen=True)
class BuildRequest:
    """One step to build under one opened prefix, with the run's policy and what it knows.

    Making one checks no field and raises nothing: ``build_step`` raises what a build raises.
    """

    spec: StepSpec
    location: Location
    """The prefix, opened and checked once by the run."""
    policy: Policy = field(default_factory=Policy)
    """The run's policy (``RunOptions.policy``); the default serves what is built."""
    region: str | None = None
    decision: Decision | None = None
    """The plan's decision; None: decided here first, from storage (a vanished served step)."""
    upstream: Sequence[Upstream] | None = None
    """Each dependency's current record (lineage, and the decision); None: read at the build."""
    abandon: threading.Event | None = None
    """Once set (a second Ctrl-C in library mode), a build whose ``fn`` still runs never
    commits."""
    wait: Wait = Wait.BLOCK
    """Wait here for another runner's lease and for the step's remote job (``BLOCK``), or
    return ``Pending`` for both (``RETURN``: the run loop) or for a job only (``RETURN_JOB``)."""
    lease_ttl: float | None = None
    """Read once per run (``$MARIN_LEASE_TTL``); None: ``build_step`` reads it."""
    working_dir: str | None = None
    """The checkout the record's provenance names; None: this process's working directory."""
    devices: tuple[int, ...] | None = None
    """The GPU devices the runner's grant assigned (``ctx.devices``); None: none assigned here."""
    awaited_job: str = ""
    """The id of the remote job this build waits for though it did not submit it (an Airflow
    task resuming from its deferral on it): found stopped, it ends the build as cancelled
    (``RemoteBuild.awaited_job``). "": a new build."""
    run: str = ""
    """The run this build belongs to (a run loop's token): a forced step's partial output is
    resumed only by a retry of the forced run that wrote it. "": no such retry (cleared)."""
