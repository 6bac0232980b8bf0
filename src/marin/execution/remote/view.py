"""What ``marin plan`` and ``run --json`` say about a remote step's job (advisory: a backend
that cannot answer makes the state ``unknown``, never an error)."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from marin.execution.names import METADATA_SUFFIX
from marin.execution.remote.fence import UnseenJobError, is_this_steps, unrecorded_writer
from marin.execution.remote.protocol import peek
from marin.execution.remote.registry import get_backend
from marin.execution.store.identity import Recipe, claim_of, judge_claim
from marin.execution.store.location import Location
from marin.execution.store.step_folder import JOB_ID, JobRecord, UnreadableJob, load_job
from marin.execution.vocabulary import Claim, Mismatch

log = logging.getLogger("marin")


def job_view(
    location: Location,
    output_path: str,
    recipe: Recipe,
    on_code_drift: str = "warn",
    remote: str | None = None,
    not_reused: str = "",
) -> dict[str, Any] | None:
    """The step's recorded job with its state now and its age in seconds; None without one.
    ``other_config``: the job is not ``recipe``'s by the one identity rule (``other_recipe``
    says why: the next run cancels or replaces it). A record that cannot be read is shown as
    such (``state: unreadable``), and so is a job this driver cannot see or judge (``state:
    unseen``, ``why``: another host or user, an unknown backend, an edited record), and a job
    of the step's backend (``remote``) that writes the output though the record does not name
    it (``state: unrecorded``): the next run refuses to build the step over any of them.
    ``not_reused``: why the next run cancels or replaces the job whatever its recipe
    (``forced``; ``marin gc`` was deleting the step)."""
    job = load_job(location, output_path)
    if isinstance(job, UnreadableJob):
        return {"backend": "?", "job_id": job.job_id or "?", "state": "unreadable",
                "why": job.why, "path": job.path}  # fmt: skip
    stray = _unrecorded(location, output_path, remote, job.job_id if job is not None else "")
    if stray is not None:
        return stray
    if job is None or not JOB_ID.fullmatch(job.job_id):
        return None
    try:
        if not is_this_steps(job, location, output_path):
            return None  # a record the run would ignore: its job is never touched
        state: str = peek(get_backend(job.backend), job.handle).state
    except UnseenJobError as exc:  # it may run where this driver cannot see: the run refuses
        unseen = {"state": "unseen", "why": exc.why, "fix": exc.fix, "age_s": job_age(job)}
        return {**job.to_json(code=False), **unseen}
    except Exception as exc:  # an unreachable cluster, an unregistered backend
        log.debug("could not ask about job %s: %s", job.job_id, exc)
        state = "unknown"
    age = job_age(job)
    verdict = judge_claim(recipe, claim_of(job), on_code_drift)
    other = verdict.claim != Claim.OURS or bool(not_reused)
    view = {**job.to_json(), "state": state, "age_s": age, "other_config": other}
    ranks = job_ranks(job)
    if ranks:
        view["ranks"] = ranks  # a gang: each rank's host and state
    if verdict.differs == Mismatch.CODE and on_code_drift == "error":
        view["refused"] = "it runs other code (on_code_drift=error)"  # the run stops there
    if not_reused:
        view["other_recipe"] = view["differs"] = not_reused
    elif other:
        view["other_recipe"] = verdict.reason
        view["differs"] = _DIFFERS[verdict.differs] if verdict.differs else "another recipe"
    elif verdict.note:
        view["note"] = verdict.note  # other code, reattached under on_code_drift=warn
    view.pop("code", None)  # long; ``marin show`` of the record names the code
    return view


def job_note(location: Location, output_path: str) -> str:
    """What ``marin unlock`` adds about the step's recorded job ("" without one): breaking a
    lease never stops a job, and a job this driver cannot see still blocks a build from here.
    Advisory: never raises."""
    job = load_job(location, output_path)
    if isinstance(job, UnreadableJob):
        return f"{job.path} cannot be read ({job.why}): a run refuses to build over it"
    if job is None or not JOB_ID.fullmatch(job.job_id):
        return ""
    what = f"its {job.backend} job {job.job_id}"
    try:
        if not is_this_steps(job, location, output_path):
            return ""
        state = peek(get_backend(job.backend), job.handle).state
    except UnseenJobError as exc:
        return (
            f"{what} may still run where this driver cannot see it ({exc.why}): a run from "
            f"here refuses to build the step over it: {exc.fix}"
        )
    except Exception as exc:  # an unreachable cluster
        return f"{what} could not be asked about ({exc}): the next run asks again"
    if state == "running":
        return f"{what} still runs: the next run reattaches to it (unlocking never stops it)"
    return ""


def _unrecorded(
    location: Location, output_path: str, remote: str | None, recorded: str
) -> dict[str, Any] | None:
    """A running job of the step's backend that writes its output although ``job.json`` does
    not name it (the run refuses to build beside it); None if none (or it cannot be asked)."""
    if remote is None:
        return None
    try:
        found = unrecorded_writer(get_backend(remote), location, output_path, recorded)
    except Exception as exc:  # advisory
        log.debug("could not list the running jobs of %s: %s", remote, exc)
        return None
    if found is None:
        return None
    return {"backend": remote, "job_id": found[0], "build_id": found[1], "state": "unrecorded"}


def job_ranks(job: JobRecord) -> list[dict[str, Any]]:
    """A gang job's ranks as its backend lists them (``ranks``, optional): each one's
    ``rank``, ``host`` and ``state``; advisory (never raises; none when it cannot say)."""
    try:
        listing = getattr(get_backend(job.backend), "ranks", None)
        return list(listing(job.handle)) if callable(listing) else []
    except Exception as exc:  # an unreachable cluster: say nothing
        log.debug("could not list the ranks of job %s: %s", job.job_id, exc)
        return []


_DIFFERS = {
    Mismatch.PLACEMENT: "another placement",
    Mismatch.CONFIG: "another config",
    Mismatch.INPUTS: "other input builds",
    Mismatch.CODE: "other code",
    Mismatch.INPUTS_UNKNOWN: "input builds not recorded",
    Mismatch.CODE_UNKNOWN: "code unknown",
}
"""How ``marin plan`` names what makes a recorded job another recipe's."""


def job_age(job: JobRecord) -> float | None:
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
            state = str(peek(get_backend(job.backend), job.handle).state)
        except Exception as exc:  # an unreachable cluster: say nothing
            log.debug("could not ask about the job of %s: %s", path, exc)
            continue
        if state == "running":
            view = {**job.to_json(), "state": state, "age_s": job_age(job), "version": other,
                    "step": f"{name}@{other}"}  # fmt: skip
            view.pop("code", None)  # long; ``marin show`` names it
            found.append(view)
    return found


def describe_other_job(view: dict[str, Any]) -> str:
    """``warning: local job marin-ab12 of version v1 still runs (2h05m): nothing will use it
    (`marin cancel a@v1` stops it)``."""
    age = view.get("age_s")
    since = "" if age is None else f" ({short_duration(age)})"
    return (
        f"warning: {view['backend']} job {view['job_id']} of version {view['version']} still "
        f"runs{since}: nothing will use it (`marin cancel {view.get('step', '')}` stops it)"
    )


def describe_job(view: dict[str, Any]) -> str:
    """``reattach: local job marin-ab12, running 3m`` (the next run's action on it)."""
    state = view["state"]
    if state == "unreadable":
        return f"refuse: {view['path']} cannot be read ({view['why']}); stop its job first"
    if state == "unrecorded":
        job = f"{view['backend']} job {view['job_id']}"
        return f"refuse: {job} runs for this output, but job.json does not name it"
    if state == "unseen":
        job = f"{view['backend']} job {view['job_id']}"
        return f"refuse: {job} may still run where this driver cannot see it: {view['why']}"
    if view.get("refused"):
        return f"refuse: {view['backend']} job {view['job_id']}, {state}: {view['refused']}"
    verb = {"running": "reattach", "succeeded": "collect", "failed": "collect"}.get(
        state, "resubmit"
    )
    if view.get("other_config"):
        differs = view.get("differs", "another recipe")
        verb = f"cancel ({differs})" if state == "running" else f"replace ({differs})"
    age = view.get("age_s")
    since = "" if age is None else f" {short_duration(age)}"
    note = " (it runs other code; on_code_drift=warn)" if view.get("note") else ""
    lost = view.get("preemptions")
    if isinstance(lost, int) and lost > 0:
        note += f", after {lost} preemption{'s' if lost > 1 else ''}"
    ranks = view.get("ranks") or []
    if ranks:
        note += "; ranks: " + ", ".join(f"{r['rank']} {r['state']} on {r['host']}" for r in ranks)
    return f"{verb}: {view['backend']} job {view['job_id']}, {state}{since}{note}"


def short_duration(seconds: float) -> str:
    """``45s``, ``3m``, ``2h05m``: how long a job has run, as ``plan`` and ``cancel`` say it."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m" if minutes else f"{secs}s"
