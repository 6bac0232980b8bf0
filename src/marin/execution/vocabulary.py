"""The words a run is described in, as ``StrEnum``s: one home, checked by mypy.

Each member *is* its string (``Action.BUILD == "build"``, ``json.dumps`` writes ``"build"``), so
every JSON output, log line and stored file stays byte-identical to the bare strings these
replace. Code compares members, never literals, so a misspelt word is a type error, not a silent
``False``.
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """What the plan does with a step (``action`` in ``marin plan --json``)."""

    BUILD = "build"
    SKIP = "skip"
    """Served from its record."""
    PRUNE = "prune"
    """Not built, and needed by nothing that runs."""


class StoredStatus(StrEnum):
    """What storage holds for a step, as the plan reads it (``status`` in ``marin plan --json``)."""

    BUILT = "built"
    RUN = "run"
    DRIFT = "drift"
    DEV = "dev"
    FAILED_BEFORE = "failed-before"
    FOREIGN = "foreign"
    """The step's metadata folder holds another step's record: never served nor replaced."""


class ShownStatus(StrEnum):
    """The status column of ``marin plan``, ``graph`` and ``why``: what storage holds, in words
    that agree with the action (a pruned step reads ``pruned``, never ``run``; a step rebuilt
    because its upstream is, ``stale``, never ``built``). The JSON keeps ``status`` (a
    :class:`StoredStatus`) and ``action`` apart; this is for people."""

    BUILT = "built"
    STALE = "stale"
    DRIFT = "drift"
    RUN = "run"
    FORCED = "forced"
    DEV = "dev"
    FAILED_BEFORE = "failed-before"
    PRUNED = "pruned"
    FOREIGN = "foreign"


class AttemptState(StrEnum):
    """The ``state`` of a step's status file: how its last attempt stands."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"


class BuildOutcomeKind(StrEnum):
    """How ``build_step`` made sure a step is built (``BuildOutcome.action``)."""

    BUILT = "built"
    """Built here, by this call."""
    CACHED = "cached"
    """Decided again and served from its record (no decision was given)."""
    BUILT_BY_OTHER = "built-by-other"
    """Another runner built it while this one waited for the lease."""


class Wait(StrEnum):
    """How ``build_step`` waits for what another party must finish first: another runner's
    lease on the step, or the step's remote job (``BuildRequest.wait``)."""

    BLOCK = "block"
    """Wait here, on this thread: the build ends, with an outcome or an error."""
    RETURN = "return"
    """Return ``Pending`` for either: the caller waits, and resumes it (the run loop)."""
    RETURN_JOB = "return-job"
    """Wait here for a lease; return ``Pending`` for a running job (a task that defers:
    Airflow's, whose worker slot is given back while the job runs)."""


class RunResult(StrEnum):
    """What happened to one step in a run (``action`` in ``marin run --json``)."""

    BUILT = "built"
    SKIPPED = "skipped"
    PRUNED = "pruned"
    FAILED = "failed"
    BLOCKED = "blocked"
    BUILT_BY_OTHER = "built-by-other"
    UNCHANGED = "unchanged"
    """Planned to build only because an upstream was rebuilt, and served from its record once
    that upstream's new output turned out to be the bytes it had read (early cutoff)."""


class Leftover(StrEnum):
    """What an earlier attempt left at a step's output path, as the lease holder finds it."""

    BUILD = "build"
    """A committed build (a record): a rebuild replaces it."""
    DEBRIS = "debris"
    """An attempt that died or failed: what it wrote is cleared."""


class OutputScope(StrEnum):
    """Where a step writes (Marin's ``OutputScope``): the team's ``<prefix>/<name>/<version>``,
    or the running user's ``<prefix>/users/<user>/<name>/<version>`` (``plan/scope.py``)."""

    SHARED = "shared"
    USER = "user"


class JobState(StrEnum):
    """A remote step's job as its backend reports it (``remote.md``)."""

    RUNNING = "running"
    """Submitted and not ended (queued counts: the job will run)."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    """Cancelled (a lost lease, or by hand): a build that finds it submits a new job."""
    LOST = "lost"
    """The backend does not know it, or it died without a word: a new job is submitted."""


class Claim(StrEnum):
    """Whether stored work (a record, a partial attempt, a job) is a recipe's: the one identity
    rule's verdict (``store/identity.py``)."""

    OURS = "ours"
    NOT_OURS = "not ours"
    UNKNOWN = "unknown"
    """What it claims cannot be compared (an input build or a code digest not recorded):
    never "unchanged"."""


class Mismatch(StrEnum):
    """The first part of a recipe a stored thing's claim differs in (``Claim`` says what that
    makes it), in the order the identity rule compares them."""

    PLACEMENT = "placement"
    CONFIG = "config"
    INPUTS = "inputs"
    CODE = "code"
    INPUTS_UNKNOWN = "inputs unknown"
    CODE_UNKNOWN = "code unknown"
