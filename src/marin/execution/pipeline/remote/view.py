"""What ``marin plan`` and ``run --json`` say about a remote step's job (advisory: a backend
that cannot answer makes the state ``unknown``, never an error)."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from marin.execution.names import METADATA_SUFFIX
from marin.execution.pipeline.remote.fence import is_this_steps
from marin.execution.pipeline.remote.job_record import JOB_ID, JobRecord, UnreadableJob, load_job
from marin.execution.pipeline.remote.registry import get_backend
from marin.execution.store.identity import Recipe, claim_of, judge_claim
from marin.execution.store.location import Location
from marin.execution.vocabulary import Claim, Mismatch

log = logging.getLogger("marin")


def job_view(
    location: Location, output_path: str, recipe: Recipe, on_code_drift: str = "warn"
) -> dict[str, Any] | None:
    """The step's recorded job with its state now and its age in seconds; None without one.
    ``other_config``: the job is not ``recipe``'s by the one identity rule (``other_recipe``
    says why: the next run cancels or replaces it). A record that cannot be read is shown as
    such (``state: unreadable``): the next run refuses to build the step over it."""
    job = load_job(location, output_path)
    if isinstance(job, UnreadableJob):
        return {"backend": "?", "job_id": job.job_id or "?", "state": "unreadable",
                "why": job.why, "path": job.path}  # fmt: skip
    if job is None or not JOB_ID.fullmatch(job.job_id):
        return None
    try:
        if not is_this_steps(job, location, output_path):
            return None  # a record the run would ignore: its job is never touched
        state: str = get_backend(job.backend).status(job.handle).state
    except Exception as exc:  # an unreachable cluster, an unregistered backend
        log.debug("could not ask about job %s: %s", job.job_id, exc)
        state = "unknown"
    age = _age(job)
    verdict = judge_claim(recipe, claim_of(job), on_code_drift)
    other = verdict.claim != Claim.OURS
    view = {**job.to_json(), "state": state, "age_s": age, "other_config": other}
    if verdict.differs == Mismatch.CODE and on_code_drift == "error":
        view["refused"] = "it runs other code (on_code_drift=error)"  # the run stops there
    if other:
        view["other_recipe"] = verdict.reason
        view["differs"] = _DIFFERS[verdict.differs] if verdict.differs else "another recipe"
    elif verdict.note:
        view["note"] = verdict.note  # other code, reattached under on_code_drift=warn
    view.pop("code", None)  # long; ``marin show`` of the record names the code
    return view


_DIFFERS = {
    Mismatch.PLACEMENT: "another placement",
    Mismatch.CONFIG: "another config",
    Mismatch.INPUTS: "other input builds",
    Mismatch.CODE: "other code",
    Mismatch.INPUTS_UNKNOWN: "input builds not recorded",
    Mismatch.CODE_UNKNOWN: "code unknown",
}
"""How ``marin plan`` names what makes a recorded job another recipe's."""


def _age(job: JobRecord) -> float | None:
    """Seconds since the job was submitted (None: its time cannot be read)."""
    try:
        return max(0.0, time.time() - datetime.fromisoformat(job.submitted_at).timestamp())
    except ValueError:
        return None


def other_version_jobs(location: Location, output_path: str) -> list[dict[str, Any]]:
    """The running jobs of the same step at another version (``<name>/<other>.marin/job.json``,
    one listing of the name's folder): left behind by a version bump, they run on for nothing.
    Advisory: anything that cannot be read, trusted or asked is left out, never an error."""
    name, _, version = output_path.rpartition("/")
    try:
        entries = location.fs.ls(location.path(name), detail=False)
    except Exception as exc:  # no such folder yet, a store that cannot list
        log.debug("could not list %s: %s", name, exc)
        return []
    found = []
    for entry in sorted(str(e).rstrip("/").rpartition("/")[2] for e in entries):
        other = entry.removesuffix(METADATA_SUFFIX)
        if other in (entry, version) or not other:
            continue
        path = f"{name}/{other}"
        try:
            job = load_job(location, path)
            if not isinstance(job, JobRecord) or not is_this_steps(job, location, path):
                continue  # none, unreadable, or not this step's: never asked about
            state = str(get_backend(job.backend).status(job.handle).state)
        except Exception as exc:  # an unreachable cluster: say nothing
            log.debug("could not ask about the job of %s: %s", path, exc)
            continue
        if state == "running":
            view = {**job.to_json(), "state": state, "age_s": _age(job), "version": other}
            view.pop("code", None)  # long; ``marin show`` names it
            found.append(view)
    return found


def describe_other_job(view: dict[str, Any]) -> str:
    """``warning: local job marin-ab12 of v1 still runs (2h05m), for another version``."""
    age = view.get("age_s")
    since = "" if age is None else f" ({_short_duration(age)})"
    return (
        f"warning: {view['backend']} job {view['job_id']} of version {view['version']} still "
        f"runs{since}: nothing will use it (`marin gc --cancel-orphans` cancels it)"
    )


def describe_job(view: dict[str, Any]) -> str:
    """``reattach: local job marin-ab12, running 3m`` (the next run's action on it)."""
    state = view["state"]
    if state == "unreadable":
        return f"refuse: {view['path']} cannot be read ({view['why']}); stop its job first"
    if view.get("refused"):
        return f"refuse: {view['backend']} job {view['job_id']}, {state}: {view['refused']}"
    verb = {"running": "reattach", "succeeded": "collect", "failed": "collect"}.get(
        state, "resubmit"
    )
    if view.get("other_config"):
        differs = view.get("differs", "another recipe")
        verb = f"cancel ({differs})" if state == "running" else f"replace ({differs})"
    age = view.get("age_s")
    since = "" if age is None else f" {_short_duration(age)}"
    note = " (it runs other code; on_code_drift=warn)" if view.get("note") else ""
    return f"{verb}: {view['backend']} job {view['job_id']}, {state}{since}{note}"


def _short_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m" if minutes else f"{secs}s"
