"""What a build reads: each input's build as the build starts, and still that build at its commit.

A dependency being rebuilt (its lease live) is waited out, then its record read afresh: that
build is the one this build consumes and records. Right before the commit every input must
still hold it (a rebuilder deletes a record before it touches the output, so an unchanged
record proves ``fn`` read a whole, committed input); an adoption among the inputs must still
adopt the builds it did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from marin.execution.builder.lease_wait import wait_out
from marin.execution.errors import InputChangedError
from marin.execution.pipeline.step_spec import StepSpec
from marin.execution.plan.decide import Upstream
from marin.execution.store.lease import LeaseInfo, read_lease
from marin.execution.store.location import Location
from marin.execution.store.placement import adopted_now, recorded_adoption, unbuilt_step_folders
from marin.execution.store.records import (
    GC_DELETING,
    NO_SHARED_BUILD,
    ArtifactRecord,
    read_record,
    read_status_file,
)


def inputs_at_start(
    spec: StepSpec, location: Location, upstream: Sequence[Upstream], lease_ttl: float
) -> list[Upstream]:
    """Each dependency's build as this build starts from it: never one being rebuilt.

    A dependency whose lease is live is being rebuilt by its holder, who deletes its record
    before it touches its output, then writes it anew: wait for that build to end. Then the
    dependency's record is read afresh: that build is the one this build consumes and records in
    its ``inputs``. A dependency that had a record when the run decided and has none now was
    being rebuilt and did not commit: this build fails, naming it, before ``fn`` runs.

    One record read per dependency; the lease is read only when that record is not the build
    the run knows (missing, or another build). A record still holding the known build proves no
    rebuild has got past its first write: one that took the lease since will delete this very
    record before it touches the output, and ``check_inputs_unchanged`` then refuses to commit.
    """
    if not upstream:
        return []
    deps = {dep.step_id: dep for dep in spec.deps}
    fresh: list[Upstream] = []
    for up in upstream:
        dep = deps.get(up.step_id)
        if dep is None:
            fresh.append(up)
            continue
        record = read_record(location, dep.output_path, up.record, (dep.name, dep.version))
        known = None if up.record is None else up.record.build_id
        if record is None or record.build_id != known:

            def live(dep: StepSpec = dep) -> LeaseInfo | None:
                info = read_lease(location, dep.output_path, lease_ttl)
                return info if info is not None and info.live else None

            wait_out(
                spec, dep.step_id, live, f"input {dep.step_id} is being rebuilt; lease held by"
            )
            record = read_record(location, dep.output_path, step=(dep.name, dep.version))
        if record is None and up.record is not None:
            raise InputChangedError(
                f"input {dep.step_id} has no record any more: it {_input_gone(location, dep)} "
                "after this run decided",
                f"build {dep.step_id} again (or wait for the runner rebuilding it), then run "
                "this step again; nothing was started for it",
                spec.step_id,
            )
        adopts = None if record is None else _adopted_at_start(spec, location, dep, record)
        kept = (up.replaced, up.shared) if record is None else ("", NO_SHARED_BUILD)
        fresh.append(Upstream(up.step_id, record, up.rebuilt, up.committed, *kept, adopts=adopts))
    return fresh


def check_inputs_unchanged(
    spec: StepSpec, location: Location, upstream: Sequence[Upstream]
) -> None:
    """Right before the commit: every dependency still holds the build this one started from.

    A rebuilder deletes a dependency's record before it touches that dependency's output, so an
    unchanged record here proves ``fn`` read a whole, committed input. One record read per
    dependency.
    """
    if not upstream:
        return
    deps = {dep.step_id: dep for dep in spec.deps}
    for up in upstream:
        dep = deps.get(up.step_id)
        if dep is None or up.record is None:
            continue
        now = read_record(location, dep.output_path, up.record, (dep.name, dep.version))
        if now is not None and now.build_id == up.record.build_id:
            _check_adopted_unchanged(spec, location, dep, now, up.adopts)
        else:
            became = (
                _input_gone(location, dep)
                if now is None
                else "was rebuilt by another runner (it holds a new build now)"
            )
            raise InputChangedError(
                f"input {dep.step_id} {became} while this step was being built from it; this "
                "attempt is discarded",
                f"nothing was committed for this step; run again to build it from the new "
                f"{dep.step_id}",
                spec.step_id,
            )


def _adopted_at_start(
    spec: StepSpec, location: Location, dep: StepSpec, record: ArtifactRecord
) -> dict[str, str] | None:
    """For an adoption among the inputs: the builds its data lies in or holds as this build
    starts from it (None: not an adoption), which the commit checks again.

    Builds other than the ones its record names were rebuilt before this build started: the
    plan's business (a stale adoption served under ``--no-cascade``, or a shared one a user's
    run reads), never a reason to refuse, or no run could build its reader. One of them being
    built now, or left with no build, is: its data is not whole.

    Raises:
        InputChangedError: a build its data lies in or holds is being built now, or has none.
    """
    if record.source is None:
        return None
    now = adopted_now(location, dep.output_path, record)
    if now == recorded_adoption(record):
        return now
    unbuilt = unbuilt_step_folders(location, dep.output_path, record.source)
    if not unbuilt:
        return now
    doing = "another runner is building now" if any(unbuilt.values()) else "has no build"
    raise InputChangedError(
        f"input {dep.step_id} adopts data ({record.source}) in a build that {doing} "
        f"({urls(location, list(unbuilt))}); nothing was started for this step",
        "run again once that build is committed (`marin run` with it among the steps)",
        spec.step_id,
    )


def _check_adopted_unchanged(
    spec: StepSpec,
    location: Location,
    dep: StepSpec,
    record: ArtifactRecord,
    started: Mapping[str, str] | None,
) -> None:
    """An adoption among the inputs still adopts the builds it did when this build started
    (``started``; None: the ones its record names): its data lies in (or holds) builds another
    runner may rebuild, clearing what this step reads.

    Raises:
        InputChangedError: one of them was rebuilt, removed, or is being built now.
    """
    if record.source is None:
        return
    was = dict(started) if started is not None else recorded_adoption(record)
    if adopted_now(location, dep.output_path, record) == was:
        return
    raise InputChangedError(
        f"input {dep.step_id} adopts data ({record.source}) in a build that was rebuilt or "
        "removed while this step was being built from it; this attempt is discarded",
        "nothing was committed for this step; run again to build it from the new data",
        spec.step_id,
    )


def _input_gone(location: Location, dep: StepSpec) -> str:
    """What happened to a dependency whose record is gone, as its folder says: deleted by
    ``marin gc`` (its mark), being rebuilt (a live lease), a rebuild that failed (a status),
    else deleted by gc or by hand (nothing left)."""
    try:
        status = read_status_file(location, dep.output_path)
        if status is not None and status.get("error") == GC_DELETING:
            return "was deleted by `marin gc`"
        info = read_lease(location, dep.output_path)
    except OSError:  # storage failing now: say what is certain
        return "lost its record"
    if info is not None and info.live:
        return "is being rebuilt by another runner (no record while it builds)"
    if status is not None:
        return "was being rebuilt by another runner, which did not commit"
    return "had its record deleted (by `marin gc`, or by hand)"


def urls(location: Location, paths: list[str]) -> str:
    return ", ".join(location.url_for(p) for p in paths)
