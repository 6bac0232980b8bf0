"""``marin ls`` and ``marin show``: what is built under a prefix, and one artifact's record.

Both read only the metadata folders beside the outputs (``<name>/<version>.marin/``), through
fsspec, so they work on any prefix. ``ls`` walks the prefix without descending into outputs: a
folder ``X.marin`` marks ``X`` as an artifact, and ``X`` itself (possibly thousands of data
files) is only measured, never listed.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from marin.execution.builder.lineage.names import artifact_names, prefect_asset_key
from marin.execution.errors import MarinError
from marin.execution.names import METADATA_SUFFIX
from marin.execution.store.lease import LeaseInfo, read_lease
from marin.execution.store.location import Location, open_prefix
from marin.execution.store.records import (
    RUNNING,
    USERS_FOLDER,
    ArtifactRecord,
    ForeignRecord,
    load_record,
    log_path,
    read_attempt,
    read_record,
    record_path,
)
from marin.execution.store.registry import REGISTRY_FOLDER
from marin.execution.vocabulary import OutputScope
from marin.terminal_text import cell_width, cut_middle, safe_text, table_lines

IO_PARALLELISM = 32
MEMORY_LOG_LINES = 20
"""``marin show`` of a ``memory://`` step prints its log's last lines: no URL can open it."""
MEMORY_ELSEWHERE = (
    "memory:// is one process's own store: a new `marin` command starts with it empty; read "
    "it in the process that built it (marin.cli.main([...])), or build under a path or bucket"
)


class NotFoundError(MarinError, LookupError):
    """No record (and no status) for what ``marin show`` was asked about."""


@dataclass(frozen=True)
class Entry:
    """One step found under a prefix (``marin ls``/``show``): its record or last attempt's status,
    and its output's size when measured."""

    output_path: str
    """Relative to the prefix: ``name/version``."""
    record: ArtifactRecord | None
    status: dict[str, Any] | None
    size: int | None

    @property
    def step_id(self) -> str:
        if self.record is not None:
            return self.record.step_id
        name, _, version = self.output_path.rpartition("/")
        return f"{name}@{version}"

    @property
    def scope(self) -> str:
        """``shared``, or ``user:<name>`` for a user-scope build (``users/<name>/...``): the
        words ``marin plan`` uses, so a user's build and the team's are told apart."""
        head, _, rest = self.output_path.partition("/")
        user, _, below = rest.partition("/")
        if head == USERS_FOLDER and user and below:
            return f"{OutputScope.USER}:{user}"
        return str(OutputScope.SHARED)


def human_size(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_time(iso: str | None) -> str:
    if not iso:
        return "-"
    try:
        when = datetime.datetime.fromisoformat(iso)
        if when.tzinfo is not None:
            when = when.astimezone(datetime.UTC)
    except (ValueError, OverflowError):  # a stored time such as year 1 at +14:00 has no UTC
        return iso
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def who(record: ArtifactRecord) -> str:
    prov = record.provenance or {}
    user, host = prov.get("user"), prov.get("host")
    return f"{user or '?'}@{host or '?'}"


def engine_of(record: ArtifactRecord) -> dict[str, Any] | None:
    """The engine unit that built the record (``provenance.engine``), if it names one.

    Stored JSON is untrusted: anything but a mapping is shown as absent.
    """
    engine = (record.provenance or {}).get("engine")
    return engine if isinstance(engine, dict) else None


def engine_text(record: ArtifactRecord) -> str:
    """``airflow dag_id=d run_id=r task_id=t try_number=2 map_index=-1``, or ``-``."""
    engine = engine_of(record)
    if engine is None:
        return "-"
    ids = " ".join(f"{k}={v}" for k, v in engine.items() if k != "name" and v is not None)
    return f"{engine.get('name', '?')} {ids}".strip()


def job_text(record: ArtifactRecord) -> str:
    """``local job marin-ab12 (submitted ...)``: the remote job that built it, or ``""``.
    Stored JSON is untrusted: only a mapping of strings is shown."""
    job = (record.provenance or {}).get("job")
    if not isinstance(job, dict):
        return ""
    backend, job_id, at = (str(job.get(k, "?")) for k in ("backend", "job_id", "submitted_at"))
    return f"{backend} job {job_id} (submitted {at})"


def _job_of(record: ArtifactRecord) -> dict[str, Any]:
    """The job that built the record, as its provenance says ({} if none, or not a mapping)."""
    job = (record.provenance or {}).get("job")
    return job if isinstance(job, dict) else {}


def preemptions(record: ArtifactRecord) -> int:
    """How many preemptions (lost jobs, submitted again) the build survived; 0 if none."""
    found = _job_of(record).get("preemptions")
    return found if isinstance(found, int) and not isinstance(found, bool) and found > 0 else 0


def ranks_text(ranks: Any) -> str:
    """A gang's ranks in one line: ``0 returned on host-a, 1 running on host-b``; "" for
    none. Stored JSON and backends' listings are untrusted: only well-formed entries, cut."""
    shown = []
    for entry in ranks[:1000] if isinstance(ranks, list) else []:
        rank = entry.get("rank") if isinstance(entry, dict) else None
        if isinstance(rank, int) and not isinstance(rank, bool):
            state, host = (str(entry.get(k, "?"))[:40] for k in ("state", "host"))
            shown.append(f"{rank} {state} on {host}")
    return ", ".join(shown)


def _rank_lines(step: str, ranks: Any) -> list[str]:
    """``marin show``'s lines on a gang's ranks, and how to read one rank's log."""
    text = ranks_text(ranks)
    if not text:
        return []
    return [f"  ranks        {text}", f"  rank log     marin logs {step} --rank N"]


# --- ls ------------------------------------------------------------------------------------------


def _relative(location: Location, fs_path: str) -> str:
    root = location.root.rstrip("/")
    fs_path = fs_path.rstrip("/")
    if fs_path == root:
        return ""
    return fs_path[len(root) :].lstrip("/") if fs_path.startswith(root + "/") else fs_path


def find_artifacts(location: Location) -> list[str]:
    """Relative output paths that have a metadata folder beside them, sorted."""
    fs = location.fs
    found: list[str] = []
    frontier = [location.root]

    def listing(path: str) -> list[dict[str, Any]]:
        try:
            return list(fs.ls(path, detail=True))
        except (FileNotFoundError, NotADirectoryError):
            return []

    with ThreadPoolExecutor(IO_PARALLELISM, "marin-ls") as pool:
        while frontier:
            following: list[str] = []
            for entries in pool.map(listing, frontier):
                dirs = [e["name"].rstrip("/") for e in entries if e.get("type") == "directory"]
                outputs = {d[: -len(METADATA_SUFFIX)] for d in dirs if d.endswith(METADATA_SUFFIX)}
                found.extend(_relative(location, o) for o in outputs)
                following.extend(
                    d for d in dirs if not d.endswith(METADATA_SUFFIX) and d not in outputs
                )
            frontier = following
    registry = REGISTRY_FOLDER.removesuffix(METADATA_SUFFIX)
    return sorted(p for p in found if p != registry)  # the registry is no step's


def _size(location: Location, output_path: str) -> int | None:
    path = location.path(output_path)
    if location.is_local and os.path.islink(path):
        return None  # measuring would walk whatever the link points to
    try:
        if not location.fs.exists(path):
            return None
        return int(location.fs.du(path, total=True))
    except (OSError, ValueError):
        return None


def list_entries(location: Location, *, sizes: bool = True) -> list[Entry]:
    paths = find_artifacts(location)

    def entry(path: str) -> Entry:
        found = load_record(location, path)
        if isinstance(found, ForeignRecord):
            return Entry(path, None, _foreign_status(found), None)
        status = None if found is not None else judged(location, path, read_attempt(location, path))
        if found is None and status is None:
            status = unread_record_status(location, path)
        size = _size(location, path) if sizes and found is not None else None
        return Entry(path, found, status, size)

    if not paths:
        return []
    with ThreadPoolExecutor(min(IO_PARALLELISM, len(paths)), "marin-ls") as pool:
        return list(pool.map(entry, paths))


FOREIGN_STATE = "FOREIGN"
"""The state ``ls`` and ``show`` give a step whose folder holds another step's record."""


UNREADABLE_STATE = "UNREADABLE"
"""The state ``ls`` and ``show`` give a step whose record this Marin cannot read (red team
r23-4: it said "no record", and ``show`` suggested the very name typed)."""


def unread_record_status(location: Location, output_path: str) -> dict[str, Any] | None:
    """With no readable record and no status: ``UNREADABLE`` when a ``record.json`` is there
    (a newer Marin's, or damaged: a build reads it as not built and refuses its data), else
    None."""
    path = record_path(output_path)
    if not location.has_file(location.path(path)):
        return None
    why = "this Marin cannot read its record (a newer Marin's, or damaged)"
    return {"state": UNREADABLE_STATE, "error": f"{why}: {location.url_for(path)}"}


def _foreign_status(found: ForeignRecord) -> dict[str, Any]:
    """How ``ls`` and ``show`` report another step's record in a step's place: not built."""
    return {"state": FOREIGN_STATE, "error": f"{found.why}: {found.path}"}


def ls_json(location: Location, entries: list[Entry]) -> dict[str, Any]:
    from marin.execution.remote.timing import record_timing

    return {
        "prefix": location.url,
        "artifacts": [
            {
                "step": e.step_id,
                "scope": e.scope,
                "name": e.record.name,
                "version": e.record.version,
                "output_path": location.url_for(e.output_path),
                "fingerprint": e.record.fingerprint,
                "finished_at": e.record.finished_at,
                **record_timing(e.record).to_json(),  # a reattached job's own time
                "user": (e.record.provenance or {}).get("user"),
                "host": (e.record.provenance or {}).get("host"),
                "pid": (e.record.provenance or {}).get("pid"),
                "engine": engine_of(e.record),
                "git_commit": (e.record.provenance or {}).get("git_commit"),
                "size_bytes": e.size,
            }
            for e in entries
            if e.record is not None
        ],
        "unfinished": [
            {
                "step": e.step_id,
                "output_path": location.url_for(e.output_path),
                "state": (e.status or {}).get("state"),
                "error": (e.status or {}).get("error"),
            }
            for e in entries
            if e.record is None
        ],
    }


def _built_row(e: Entry, where: bool, scoped: bool) -> list[str]:
    """One built step's cells, as plain (safe) text."""
    from marin.execution.remote.timing import record_timing

    assert e.record is not None
    row = [
        safe_text(e.step_id),
        *([safe_text(e.scope)] if scoped else []),
        safe_text(human_time(e.record.finished_at)),
        safe_text(who(e.record)),
        human_size(e.size),
        f"{record_timing(e.record).duration_s:.2f}s",
    ]
    if where:
        row += [
            safe_text(str((e.record.provenance or {}).get("pid", "?"))),
            safe_text(engine_text(e.record)),
        ]
    return row


LS_STEP_MIN_WIDTH = 24


def _built_table(
    rows: list[list[str]], color: bool, where: bool, width: int, scoped: bool
) -> list[str]:
    from rich.table import Table
    from rich.text import Text

    columns = ["step", *(["scope"] if scoped else []), "built at", "by", "size", "took"]
    columns += ["pid", "engine"] if where else []
    # In terminal cells, not characters: a wide character (日) takes two.
    widths = [max(len(c), *(cell_width(r[i]) for r in rows)) for i, c in enumerate(columns)]
    # The step column takes what the others leave (two spaces between columns).
    room = width - sum(widths[1:]) - 2 * (len(columns) - 1)
    widths[0] = min(widths[0], max(LS_STEP_MIN_WIDTH, room))
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column, column_width in zip(columns, widths, strict=True):
        right = column in ("size", "took")
        table.add_column(
            column, justify="right" if right else "left", no_wrap=True, width=column_width
        )
    for row in rows:
        # Text objects, never markup: names like ``sweep[lr=0.1]`` are shown as they are.
        table.add_row(Text(cut_middle(row[0], widths[0])), *(Text(cell) for cell in row[1:]))
    return table_lines(table, max(width, sum(widths) + 2 * (len(columns) - 1)), color)


def ls_table(
    location: Location,
    entries: list[Entry],
    *,
    color: bool = False,
    where: bool = False,
    width: int | None = None,
) -> str:
    """The ``marin ls`` table; ``where`` adds where each step was built: pid and engine unit.

    It fits ``width`` (default: the terminal's): a long step name is cut in the middle, and
    ``--json`` has it whole. A ``scope`` column appears when a user-scope build is listed."""
    from marin.plan_view import terminal_width

    built = [e for e in entries if e.record is not None]
    unfinished = [e for e in entries if e.record is None]
    scoped = any(e.scope != OutputScope.SHARED for e in built)
    lines: list[str] = []
    if built:
        rows = [_built_row(e, where, scoped) for e in built]
        lines += _built_table(rows, color, where, width or terminal_width(), scoped)
    total = sum(e.size or 0 for e in built)
    lines.append(f"{len(built)} artifact(s), {human_size(total)} under {safe_text(location.url)}")
    for e in unfinished:
        state = (e.status or {}).get("state", "no record")
        error = (e.status or {}).get("error")
        detail = safe_text(f"{state}: {error}" if error else state)
        step = safe_text(e.step_id)
        lines.append(f"not built: {step} ({detail}) — marin show {step}")
    return "\n".join(lines) + "\n"


UNFINISHED = "UNFINISHED"
"""The state ``ls`` and ``show`` give an attempt whose lease no longer protects it (its holder
is gone, or the lease expired): what the next run takes over, never ``RUNNING``."""


def judged(location: Location, output_path: str, status: dict[str, Any] | None) -> Any:
    """``status``, with a ``RUNNING`` one (a lease) judged as a run judges it: a lease whose
    holder is gone, expired, skewed or unreadable makes it ``UNFINISHED``, saying why."""
    if not status or status.get("state") != RUNNING:
        return status
    try:
        info = read_lease(location, output_path)
    except OSError:  # cannot tell: shown as stored
        return status
    if info is not None and info.live:
        return status
    return {**status, "state": UNFINISHED, "error": f"{_lease_gone(info)}; the next run takes over"}


def _lease_gone(info: LeaseInfo | None) -> str:
    """Why a lease protects nothing any more, in the run's words."""
    if info is None:
        return "its lease is gone"
    if info.garbled:
        return "its lease is unreadable"
    if info.holder_dead:
        parts = info.holder.split(":")  # host:pid:thread
        return f"holder pid {parts[-2] if len(parts) >= 3 else '?'} gone"
    if info.skewed:
        return "its lease expires beyond its TTL (a skewed clock or a planted lease)"
    return f"its lease expired {time.time() - info.expires_at:.0f}s ago"


def _duration_text(record: ArtifactRecord) -> str:
    """``25.300s (reattached: the job's time; 0.2s waited here)``: a record's duration
    (``record_timing``) and what it means."""
    from marin.execution.remote.timing import record_timing

    timing = record_timing(record)
    return f"{timing.duration_s:.3f}s" + (f" ({timing.note})" if timing.note else "")


def _job_lines(location: Location, output_path: str) -> list[str]:
    """``marin show``'s lines on a step's recorded job: backend, id, state and its log."""
    from marin.step_jobs import JobRefusedError, step_job

    step = "@".join(output_path.rsplit("/", 1))
    try:
        found = step_job(location, output_path, step)
    except JobRefusedError as exc:
        return [f"  job          {exc.what}"]
    if found is None:
        return []
    from marin.execution.remote.view import job_ranks

    where = found_log(found)
    return [
        f"  job          {found.describe()}",
        *([f"  job log      {where}"] if where else []),
        *_rank_lines(step, job_ranks(found.job)),
        f"  follow       marin logs {step} -f; stop: marin cancel {step}",
    ]


def found_log(found: Any) -> str:
    """Where a job's own log is (its backend's ``log_location``), or ``""``."""
    from marin.execution.remote.registry import get_backend

    where = getattr(get_backend(found.job.backend), "log_location", None)
    return str(where(found.job.handle)) if callable(where) else ""


# --- show ----------------------------------------------------------------------------------------


def _strip_metadata(path: str) -> str:
    path = path.rstrip("/")
    for tail in ("/record.json", "/status.json", "/log.txt", "/lease.json"):
        if path.endswith(tail):
            path = path[: -len(tail)]
    if path.endswith(METADATA_SUFFIX):
        path = path[: -len(METADATA_SUFFIX)]
    return path


def _versions_of(location: Location, name: str) -> list[str]:
    folder = location.path(name)
    try:
        entries = location.fs.ls(folder, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    versions = []
    for e in entries:
        base = e["name"].rstrip("/").rsplit("/", 1)[-1]
        if e.get("type") == "directory" and base.endswith(METADATA_SUFFIX):
            versions.append(base[: -len(METADATA_SUFFIX)])
    return sorted(versions)


def resolve_show_target(what: str, prefix: str | None) -> tuple[Location, str]:
    """``name@version``, ``name`` (one built version), or a path/URL of an output or its record."""
    is_url = "://" in what
    if is_url or what.startswith("/") or what.startswith("."):
        path = _strip_metadata(what)
        if not is_url:
            path = os.path.abspath(path)
        location = open_prefix(prefix)
        base = location.url.rstrip("/") + "/"
        if path.startswith(base):
            return location, path[len(base) :]
        parent, _, leaf = path.rpartition("/")
        return open_prefix(parent or "/"), leaf
    location = open_prefix(prefix)
    if "@" in what:
        name, _, version = what.rpartition("@")
        return location, f"{name}/{version}"
    candidate = _strip_metadata(what)
    if location.has_file(location.path(record_path(candidate))):
        return location, candidate  # a relative output path, name/version
    # Without '@' the whole argument is a name: never read its last part as a version.
    versions = _versions_of(location, candidate)
    if versions:
        latest = latest_built_version(location, candidate, versions)
        return location, f"{candidate}/{latest or versions[-1]}"
    raise NotFoundError(
        f"nothing named {candidate} is built under {location.url}",
        MEMORY_ELSEWHERE if location.is_memory else closest_hint(location, candidate),
        candidate,
    )


def steps_named(location: Location, given: str) -> list[str]:
    """The output paths ``marin cancel`` acts on: ``name@version``'s, or for a bare name each
    version whose folder records a job (every version when none does: each says so).

    Raises:
        InvalidStepError: ``given`` is not a valid name (or name@version).
        NotFoundError: nothing of that name is under the prefix.
    """
    from marin.execution.names import validate_name
    from marin.execution.store.step_folder import job_path
    from marin.unlock import step_output_path

    if "@" in given:
        return [step_output_path(given)]
    validate_name(given)
    paths = [f"{given}/{v}" for v in _versions_of(location, given)]
    if not paths:
        raise NotFoundError(f"nothing named {given} is under {location.url}",
                            closest_hint(location, given), given)  # fmt: skip
    with_job = [p for p in paths if location.has_file(location.path(job_path(p)))]
    return with_job or paths


def latest_built_version(location: Location, name: str, versions: list[str]) -> str | None:
    """The version of ``name`` whose record finished last; None when none has a record."""
    best: tuple[str, str] | None = None
    for version in versions:
        record = read_record(location, f"{name}/{version}")
        if record is None:
            continue
        key = (record.finished_at or "", version)
        if best is None or key > best:
            best = key
    return None if best is None else best[1]


def closest_hint(location: Location, name: str) -> str:
    """Suggest the closest built names (``difflib``), else point at ``marin ls``."""
    from marin.execution.suggest import did_you_mean

    names = {path.rpartition("/")[0] for path in find_artifacts(location)}
    hint = did_you_mean(name, names)
    if hint:
        return hint
    return f"`marin ls --prefix {location.url}` lists what is built"


def _not_built_hint(location: Location, name: str, version: str) -> str:
    """For ``marin show NAME@VERSION`` of nothing: the versions of ``name`` that exist, else the
    closest built ``name@version``, else where to look."""
    from marin.execution.suggest import close_names, did_you_mean

    fallback = "check the name, version and --prefix; `marin ls --prefix P` lists what is built"
    if location.is_memory and not find_artifacts(location):
        return MEMORY_ELSEWHERE
    if not name:
        return fallback
    versions = _versions_of(location, name)
    if version in versions:  # its folder, holding no record or attempt: never "did you mean" it
        return (
            f"{name}@{version}'s folder holds no record or status (a run that never started, "
            f"or files left by hand): `marin plan` says what a run would do with it"
        )
    if versions:
        pick = close_names(version, versions, n=1) or [
            latest_built_version(location, name, versions) or versions[-1]
        ]
        exist = "exists" if len(versions) == 1 else "exist"
        return f"{', '.join(versions)} of {name} {exist} here: did you mean {name}@{pick[0]}?"
    built = {"@".join(path.rsplit("/", 1)) for path in find_artifacts(location)}
    return did_you_mean(f"{name}@{version}", built) or fallback


def check_ls_prefix(prefix: str | Location | None) -> tuple[Location, str | None]:
    """Open ``prefix`` (or take it opened) for ``marin ls``; return a warning when it does not
    exist yet.

    A prefix that is a file is bad input (``StorageError``, exit 2); a missing folder is only
    warned about, since a prefix nothing was built under yet is not an error.
    """
    from marin.execution.errors import StorageError

    location = prefix if isinstance(prefix, Location) else open_prefix(prefix)
    try:
        kind = location.fs.info(location.root).get("type")
    except FileNotFoundError:
        kind = None
    except OSError:
        return location, None
    if kind is None and location.fs.isdir(location.root):
        kind = "directory"  # object stores: a "folder" is a common key prefix
    if kind == "file":
        raise StorageError(
            f"--prefix {location.url} is a file, not a folder of artifacts",
            "give the folder (or URL) that artifacts are built under",
        )
    if kind is None and location.is_memory:
        return location, f"warning: nothing is built under {location.url}: {MEMORY_ELSEWHERE}"
    if kind is None:
        return (
            location,
            f"warning: the prefix {location.url} does not exist (nothing is built there)",
        )
    return location, None


def _json_block(value: Any, indent: str = "    ") -> list[str]:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return [indent + line for line in text.splitlines()]


def show_record(location: Location, output_path: str) -> tuple[str, int]:
    """The text ``marin show`` prints and its exit code (0 built, 1 not built).

    Raises:
        NotFoundError: nothing is at ``output_path``: no record and no status of an attempt.
    """
    found = load_record(location, output_path)
    record = found if isinstance(found, ArtifactRecord) else None
    status = judged(location, output_path, read_attempt(location, output_path))
    if isinstance(found, ForeignRecord):
        status = {**(status or {}), **_foreign_status(found)}
    elif found is None and status is None:
        status = unread_record_status(location, output_path)
    url = location.url_for(output_path)
    log = _log_lines(location, output_path)
    if record is not None:
        return _terminal_lines(_built_lines(location, output_path, record, status, log)), 0
    if status is None:
        name, _, version = output_path.rpartition("/")
        raise NotFoundError(
            f"nothing is built at {url}",
            _not_built_hint(location, name, version),
            f"{name}@{version}" if name else None,
        )
    job = _job_lines(location, output_path)
    return _terminal_lines(_attempt_lines(output_path, url, status, job + log)), 1


def _log_lines(location: Location, output_path: str) -> list[str]:
    """``marin show``'s log line: where the step's log is; on ``memory://``, which no other
    process can open, also its last lines, indented under it."""
    path = location.path(log_path(output_path))
    if not location.has_file(path):
        return ["  log          (none: the step printed and logged nothing)"]
    url = location.url_for(log_path(output_path))
    if not location.is_memory:
        return [f"  log          {url}"]
    lines = location.read_file(path).decode(errors="replace").splitlines()
    shown = lines[-MEMORY_LOG_LINES:]
    head = (
        f"  log          {url} (in this process's memory; last {len(shown)} of {len(lines)} lines)"
    )
    return [head, *("    " + line for line in shown)]


def _attempt_lines(output_path: str, url: str, status: dict[str, Any], log: list[str]) -> list[str]:
    """``marin show`` of an output that is not built: its attempt's state, error and traceback."""
    name, _, version = output_path.rpartition("/")
    lines = [
        f"{name}@{version}: not built ({status.get('state', '?')})",
        f"  output       {url}",
    ]
    for key in ("error", "holder", "started_at", "finished_at"):
        if status.get(key):
            lines.append(f"  {key:<12} {status[key]}")
    trace = status.get("traceback")
    if trace:
        lines.append("  traceback")
        lines += ["    " + line for line in str(trace).rstrip().splitlines()[-12:]]
    lines += log
    return lines


def _built_lines(
    location: Location,
    output_path: str,
    record: ArtifactRecord,
    status: dict[str, Any] | None,
    log: list[str],
) -> list[str]:
    """``marin show`` of a built output: where, what, when, by whom, then deps, config, result."""
    prov = record.provenance or {}
    commit = prov.get("git_commit")
    dirty = prov.get("git_dirty")
    git = "-" if not commit else f"{commit} ({'dirty' if dirty else 'clean'})"
    state = (status or {}).get("state", "SUCCESS")
    lines = [
        f"{record.step_id}  ({state.lower() if isinstance(state, str) else state})",
        f"  output       {location.url_for(output_path)}",
        *([f"  source       {record.source} (adopted: read there)"] if record.source else []),
        *_lineage_lines(location, output_path),
        f"  type         {record.artifact_type}",
        f"  fingerprint  {record.fingerprint}",
        f"  built        {human_time(record.started_at)} -> {human_time(record.finished_at)}",
        f"  duration     {_duration_text(record)}",
        f"  by           {who(record)} (pid {prov.get('pid', '?')})",
        f"  engine       {engine_text(record)}",
        *([f"  job          {job_text(record)}"] if job_text(record) else []),
        *([f"  preemptions  {n} (lost jobs resubmitted)"] if (n := preemptions(record)) else []),
        *_rank_lines(record.step_id, _job_of(record).get("ranks")),
        f"  git          {git}",
        f"  time         {prov.get('time', '-')}",
        f"  argv         {' '.join(str(a) for a in prov.get('argv', [])) or '-'}",
        *log,
    ]
    return lines + _record_data_lines(record)


def _record_data_lines(record: ArtifactRecord) -> list[str]:
    """A record's deps, config and result, indented under their headings."""
    lines = []
    if record.dep_paths:
        lines.append("  deps")
        width = max(len(k) for k in record.dep_paths)
        lines += [f"    {k:<{width}}  {v}" for k, v in sorted(record.dep_paths.items())]
    else:
        lines.append("  deps         (none)")
    lines.append("  config")
    lines += _json_block(record.config)
    lines.append("  result")
    lines += _json_block(record.result)
    return lines


def _lineage_lines(location: Location, output_path: str) -> list[str]:
    """How OpenLineage and the engines' assets name the artifact (docs/lineage.md)."""
    names = artifact_names(location, output_path)
    lines = [f"  dataset      {names.dataset_namespace} {names.dataset_name} (OpenLineage)"]
    prefect_key = prefect_asset_key(names)
    if prefect_key == names.asset_uri:
        return [*lines, f"  asset        {names.asset_uri} (Airflow, Prefect)"]
    return [
        *lines,
        f"  asset        {names.asset_uri} (Airflow)",
        f"  asset        {prefect_key} (Prefect)",
    ]


def _terminal_lines(lines: list[str]) -> str:
    """Every line made safe for a terminal: a stored string cannot add lines or escapes."""
    return "".join(safe_text(line) + "\n" for line in lines)
