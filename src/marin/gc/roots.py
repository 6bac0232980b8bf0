"""``marin gc``'s roots: what it keeps for its own sake (``collect.decide`` then keeps every build
a kept record was made from). Each kind of root is one function here, and ``api`` lists them
in one place:

- **adopted**: every build an adopted step of the targets reads (``adopted_sources``);
- **served**: every step the targets' plans serve, as each plan places it (``plan/scope.py``,
  the function ``marin plan`` and ``run`` use): the shared graph, and for each user gc looks
  after, that user's placement (``users/<user>/...``, or the shared build it reads);
- **registered** (``gc/registry.py``): every build ``marin register`` named, whatever the
  targets;
- **other users'**: every build in the folder of a user gc does not look after (without
  ``--all-users``: everyone but the user running it; with or without it, every user folder when
  the plan places no step in one), never touched; with ``--all-users``, another user's build of
  a step whose version comes from the run (``version=None``) at a version other than the one
  this gc's ``--version``/``--override`` give it (that user's own codex, which gc was not
  given: ``provenance.lowered.versions`` in its record says which);
- **recent**: with ``--keep-versions N`` each name's N newest builds, with ``--older-than`` every
  build more recent (or of unknown age).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from marin.execution.errors import MarinError, SymlinkError
from marin.execution.pipeline.graph import Graph, collect_steps
from marin.execution.pipeline.scope import current_user, user_named
from marin.execution.plan.scope import needs_user, place_pins, resolve_scopes
from marin.execution.store.location import Location
from marin.execution.store.records import USERS_FOLDER, parse_stored_time, user_scoped_tail
from marin.execution.store.step_folder import JOB_FILE, JobRecord, load_job
from marin.gc.walk import IO_PARALLELISM, LINKED, Listing, Slot, built_at, name_of, owner_of

Roots = dict[str, str]
"""Output path -> why it is kept."""

NEEDED = "needed by the targets"


def served(
    graph: Graph, location: Location, scope: str, users: Iterable[str]
) -> tuple[Roots, dict[str, str]]:
    """The output path of every step the targets' plans serve: the graph as lowered (the
    shared builds), and each of ``users``' placement of it under ``scope`` (only when a step
    is placed in a user's folder at all). Also the user folders left alone (folder -> why):
    those whose placement meets a symbolic link (never followed: what that user's plan serves
    cannot be known, so nothing there is touched)."""
    shared = place_pins(graph.targets, location)  # absolute pins, placed as a run does
    roots = {spec.output_path: NEEDED for spec in collect_steps(shared)}
    left: dict[str, str] = {}
    if not needs_user(shared, scope):
        return roots, left
    for user in users:
        try:
            placed = resolve_scopes(shared, location, scope, (), user)
        except SymlinkError:
            why = "a symbolic link lies where its plan places a step (never followed)"
            left[f"{USERS_FOLDER}/{user}"] = why
            continue
        for spec in collect_steps(placed):
            roots.setdefault(spec.output_path, f"{NEEDED} (as {user}'s plan places it)")
    return roots, left


def looked_after(
    graph: Graph, location: Location, scope: str, listing: Listing, all_users: bool
) -> tuple[list[str], dict[str, str], Roots]:
    """The users whose folders gc looks after (``gc_users``), the user folders it leaves alone
    (folder -> why), and what the targets' plans serve (``served``).

    Raises:
        InvalidStepError: ``$MARIN_USER`` (or the OS user) is not a valid user name.
    """
    placed = places_users(graph, location, scope)
    users, others = gc_users(user_folders(listing), all_users, placed)
    roots, unplaced = served(graph, location, scope, users)
    left = {owner_of(folder) for folder in unplaced}
    return [u for u in users if u not in left], {**others, **unplaced}, roots


def adopted_sources(graph: Graph, location: Location) -> Roots:
    """Where each adopted step of the targets reads its data (its ``source``, as its consumers
    resolve it; URL -> why): the builds under the prefix it lies in or holds are kept
    (``collect.decide``), as the plan serves them through that step."""
    return {
        spec.data_url(location.url): f"{spec.step_id} adopts it (its source)"
        for spec in graph.steps
        if spec.source is not None
    }


def user_folders(listing: Listing) -> list[str]:
    """The user of every user folder the walk found, except one that is itself a symbolic link
    (``users/mallory -> alice``): never followed, it is listed as not Marin's."""
    found = [s.owner for s in listing.slots]
    for entry in listing.foreign:
        owner = owner_of(entry.path)
        if entry.why != LINKED or entry.path != f"{USERS_FOLDER}/{owner}":
            found.append(owner)
    return [owner for owner in found if owner]


def places_users(graph: Graph, location: Location, scope: str) -> bool:
    """Whether the targets' plan under ``scope`` places any step in a user's folder."""
    return needs_user(place_pins(graph.targets, location), scope)


def gc_users(
    owners: Iterable[str], all_users: bool, placed: bool = True
) -> tuple[list[str], dict[str, str]]:
    """The users whose folders gc looks after, and the user folders it leaves alone (folder ->
    why). One rule for every user folder: it is looked after only when the plan places steps
    in user folders (``placed``: a shared plan proves nothing about what a user's own
    ``--scope user`` runs serve). Then, without ``all_users``: the user running it
    (``$MARIN_USER``, else the OS user; none for a service account); with it, each user folder
    found (``owners``) whose name is a user.

    Raises:
        InvalidStepError: ``$MARIN_USER`` (or the OS user) is not a valid user name.
    """
    me = current_user()
    mine = [me] if me and placed else []
    left: dict[str, str] = {}
    for owner in sorted(set(owners)):
        folder = f"{USERS_FOLDER}/{owner}"
        if not placed:
            whose = "your" if owner == me else f"{owner}'s"
            left[folder] = f"{whose} user builds: this plan places nothing there (--scope user)"
            continue
        if not all_users:
            if owner != me:
                left[folder] = "another user's builds (--all-users collects them too)"
            continue
        try:
            valid = user_named(owner) == owner
        except MarinError:
            valid = False
        if valid:
            mine.append(owner)
        else:
            left[folder] = "not a user's folder (its name is no user name)"
    return sorted(set(mine)), left


def other_versions(slots: Sequence[Slot], graph: Graph, users: Iterable[str]) -> Roots:
    """In the folders of ``users`` other than the one running gc: every build of a step the
    targets defer (``version=None``) at a version other than this gc's codex gives it. Its
    version is that user's ``--version``/``--override`` (its record names the codex), which
    this gc was not given: it cannot know whether that user's plan serves it."""
    me = current_user()
    others = set(users) - {me}
    if not others:
        return {}
    deferred = {s.name: s.version for s in graph.steps if "version_from" in s.provenance}
    kept: Roots = {}
    for slot in slots:
        if slot.owner not in others:
            continue
        name, _, version = user_scoped_tail(slot.output_path).rpartition("/")
        if name in deferred and version != deferred[name]:
            kept[slot.output_path] = (
                f"{slot.owner}'s build at another version than this gc's codex gives "
                f"{name} ({deferred[name]}): that user's own --version, not this gc's to judge"
            )
    return kept


def left_alone(slots: Sequence[Slot], folders: Iterable[str]) -> Roots:
    """Every slot inside one of the user ``folders`` gc leaves alone."""
    owners = {owner_of(folder) for folder in folders}
    return {s.output_path: "another user's build" for s in slots if s.owner in owners}


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
"""The age given a build whose time cannot be read: the oldest (``--keep-versions``)."""


def recent(
    slots: Sequence[Slot], keep_versions: int | None, cutoff: datetime.datetime | None
) -> Roots:
    """``--keep-versions``: each name's newest N builds; ``--older-than``: anything built at
    or after ``cutoff``, or of unknown age."""
    kept: Roots = {}
    if keep_versions is not None:
        by_name: dict[str, list[Slot]] = {}  # per user folder and name
        for slot in slots:
            if slot.record is not None:
                by_name.setdefault(f"{slot.owner}:{name_of(slot)}", []).append(slot)
        for group in by_name.values():
            group.sort(
                key=lambda s: (parse_stored_time(built_at(s)) or _EPOCH, s.output_path),
                reverse=True,
            )
            for slot in group[:keep_versions]:
                kept.setdefault(slot.output_path, f"among the newest {keep_versions} versions")
    if cutoff is not None:
        for slot in slots:
            when = parse_stored_time(built_at(slot))
            if when is None:
                kept.setdefault(slot.output_path, "its age is unknown")
            elif when >= cutoff:
                kept.setdefault(slot.output_path, "built more recently than the cutoff")
    return kept


def read_by_jobs(location: Location, candidates: Sequence[Slot], slots: Sequence[Slot]) -> Roots:
    """The builds the remote job of a step gc would delete reads (its ``job.json``'s inputs,
    by build id): the job may still run (an orphan, left alone), or a next run may collect
    it, checking that its inputs are still those builds. Kept until its step is gone.

    Only a step with no record can have a job in flight (a rebuild deletes the record before
    it submits one): the leftovers the listing named, or its status, say which to read."""
    candidates = [
        s
        for s in candidates
        if s.record is None and (JOB_FILE in s.leftovers or s.status is not None)
    ]
    with ThreadPoolExecutor(IO_PARALLELISM, "marin-gc") as pool:
        jobs = list(pool.map(lambda s: load_job(location, s.output_path), candidates))
    by_build = {s.record.build_id: s for s in slots if s.record is not None and s.record.build_id}
    roots: Roots = {}
    for slot, job in zip(candidates, jobs, strict=True):
        if not isinstance(job, JobRecord):
            continue
        for build_id in job.inputs.values():
            read = by_build.get(build_id)
            if read is not None:
                why = f"read by {job.backend} job {job.job_id} of {slot.step_id}, which may run"
                roots.setdefault(read.output_path, why)
    return roots


def merged(*parts: Roots) -> Roots:
    """The roots of every kind; a path kept for several reasons says the first."""
    roots: Roots = {}
    for part in parts:
        for path, why in part.items():
            roots.setdefault(path, why)
    return roots
