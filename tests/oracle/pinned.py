"""The shrunk history of every bug the checker found, replayed on every run.

Each came from a fixed-seed history (``seed``: ``seeded(seed)`` of the fast profile, unless
said otherwise), shrunk by ``shrink.py``; ``finding`` says what it found. ``open``: the bug is
still on main, and the test is a strict xfail (the fix makes it pass, and the mark must then
go). ``CLEAN`` is a history that keeps every promise (its script is replayed by a test).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.oracle.adoption import GcOther, RebuildFeed, ToggleAdoption
from tests.oracle.history import History
from tests.oracle.ops import (
    DeleteOutput,
    EditCode,
    EditConfig,
    FailRun,
    Gc,
    KillDriver,
    LeaseLost,
    MoveUserData,
    Plant,
    PreemptPastBudget,
    PutUserData,
    RankFail,
    Run,
    RunOpts,
    Stream,
    TearRecord,
    TwoDrivers,
)
from tests.oracle.pipeline import Adoption, PipelineModel, StepModel
from tests.oracle.world import Context


@dataclass(frozen=True)
class Pinned:
    """A history that found ``kind``: the test asserts it no longer does."""

    kind: str
    history: History
    seed: str
    finding: str
    open: bool = False
    event: str = ""
    """An operation the history must really do (``Executor.gang_events``, or
    ``adopt_events``: a user's data moved away), breaking no promise."""


def chain(n: int, **flags: dict[str, bool]) -> PipelineModel:
    """``s0 -> s1 -> ...``; ``flags``: ``s3={"remote": True}``."""
    return PipelineModel(
        tuple(StepModel(i, (i - 1,) if i else (), **flags.get(f"s{i}", {})) for i in range(n))
    )


WARN = RunOpts()
CODE_REBUILD = RunOpts(on_code_drift="rebuild")
ALICE, BOB = Context("alice"), Context("bob")

PINNED: dict[str, Pinned] = {
    "gc-deletes-a-user-scope-build-the-plan-serves": Pinned(
        "gc-deleted-served",
        History(chain(1, s0={"user_scope": True}), (Run(WARN), Gc(ALICE, False))),
        "9",
        "trust finding 1: marin gc deletes users/alice/... which alice's plan serves",
    ),
    "gc-as-bob-deletes-alices-builds": Pinned(
        "gc-touched-other-user",
        History(chain(1, s0={"user_scope": True}), (Run(WARN), Gc(BOB, False))),
        "76",
        "trust finding 1: marin gc as bob deletes users/alice/",
    ),
    "a-planted-job-json-kills-a-decoy": Pinned(
        "planted:process-killed",
        History(chain(1, s0={"remote": True}), (Plant("decoy", 68), Run(WARN))),
        "53",
        "trust finding 2: a planted job.json + pid.json makes marin run SIGKILL a process",
    ),
    "a-planted-job-with-the-fingerprint-is-waited-for": Pinned(
        "planted:run-hung",
        History(chain(1, s0={"remote": True}), (Plant("decoy-fp", 0), Run(WARN))),
        "arranged from the table (a decoy-fp plant is rare in the seeds)",
        "trust finding 2: a run reattaches to a planted job naming a decoy and waits for it",
    ),
    "a-planted-result-pkl-runs-code": Pinned(
        "planted:code-ran",
        History(chain(1, s0={"remote": True}), (Plant("result", 0), Run(WARN))),
        "210, 238, 320, ... (seeds 200:600)",
        "trust finding 3: a planted result.pkl is unpickled in the driver",
    ),
    "a-planted-result-is-committed": Pinned(
        "planted:result-committed",
        History(chain(1, s0={"remote": True}), (Plant("result", 0), Run(WARN))),
        "210, 238, 320, ... (seeds 200:600)",
        "trust finding 3: a planted result is committed as the step's result",
    ),
    "a-job-json-without-workdir-deletes-outside-the-prefix": Pinned(
        "outside-prefix-touched",
        History(chain(2, s1={"remote": True}), (Plant("no-workdir", 62), Run(WARN))),
        "210 (seeds 200:600)",
        "trust finding 3: a job.json without workdir is followed to $MARIN_LOCAL_JOBS and "
        "that folder is deleted",
    ),
    "a-resume-of-checkpoints-from-a-replaced-input": Pinned(
        "wrong-artifact:resumed",
        History(
            chain(4, s3={"resumable": True}),
            (
                KillDriver(3, "during", WARN),
                EditCode(2, True),
                Run(CODE_REBUILD),
            ),
        ),
        "145",
        "trust finding 5: a resumable step resumes checkpoints made from a replaced input",
    ),
    "a-finished-job-of-replaced-inputs-is-collected": Pinned(
        "wrong-artifact:remote-job",
        History(
            chain(4, s3={"remote": True}),
            (
                KillDriver(3, "before", WARN),
                EditCode(0, True),
                Run(CODE_REBUILD),
            ),
        ),
        "108",
        "trust finding 6: a re-run collects a finished job that read a replaced input",
    ),
    "a-running-job-of-old-code-is-reattached": Pinned(
        "wrong-artifact:remote-job",
        History(
            chain(2, s1={"remote": True}),
            (
                KillDriver(1, "during", WARN),
                EditCode(1, True),
                Run(CODE_REBUILD),
            ),
        ),
        "arranged from the table: seed 108's operations on the job's own code",
        "trust finding 6: a run reattaches to a job of old code and commits its output",
    ),
    "a-torn-job-json-fails-the-run": Pinned(
        "run-failed:torn-job",
        History(chain(1, s0={"remote": True}), (Plant("torn-job", 70), Run(WARN))),
        "4",
        "trust finding 7: a torn job.json fails the step ('delete it by hand')",
    ),
    "a-stream-serves-one-config-for-another": Pinned(
        "wrong-artifact:stream",
        History(chain(1), (Stream(0, ((2, False),), WARN),)),
        "51",
        "trust finding 8: a stream yielding two configs of one name@version serves the first "
        "for the second",
    ),
    "a-user-scope-run-fails-on-a-shared-upstream": Pinned(
        "run-failed:user-scope-shared",
        History(
            chain(1),
            (
                Run(WARN),
                EditCode(0, True),
                Run(RunOpts(Context("alice", "user"), on_code_drift="rebuild")),
            ),
        ),
        "79",
        "trust finding 15: a --scope user run fails when a shared upstream must be rebuilt",
    ),
    "a-killed-rebuild-makes-its-stale-readers-current": Pinned(
        "wrong-artifact:below-unfinished-rebuild",
        History(chain(3), (Run(WARN), EditCode(0, True), KillDriver(1, "kill", CODE_REBUILD))),
        "48",
        "new finding: a rebuild that is killed (or fails) deletes the record that made its "
        "readers stale; they are then served as current, also under rebuild/rebuild",
    ),
    "a-stream-with-a-user-scope-step-crashes": Pinned(
        "crash",
        History(chain(2, s1={"user_scope": True}), (Stream(1, ((0, False),), WARN),)),
        "19",
        "new finding: StepRunner.run over a stream whose steps include a user-scope one "
        "raises KeyError (served_targets_gone looks up the unplaced path)",
    ),
    "a-stream-below-a-user-scope-step-is-checked-where-it-is-placed": Pinned(
        "wrong-artifact:stream",
        History(chain(2, s0={"user_scope": True}), (Stream(1, ((1, True),), WARN),)),
        "54, 127, 149, 176",
        "the checker's own bug: a swept step below a user-scope step is built in the user's "
        "folder (docs/marin.md), and the stream check looked for it at its shared path",
    ),
    "a-resume-across-a-code-change-under-warn-is-said-by-the-plan": Pinned(
        "wrong-artifact:resumed",
        History(chain(3, s2={"resumable": True}), (FailRun(2, WARN), EditCode(2, True), Run(WARN))),
        "1097 (the soak profile)",
        "the checker's own bug: under --on-code-drift warn a partial output of other code is "
        "resumed (docs/caching.md, the identity table), which the plan's `resume` says; the "
        "checker allowed code drift only from a record",
    ),
    "a-second-forced-run-in-one-process-resumes-the-first-ones-attempt": Pinned(
        "wrong-artifact:resumed",
        History(
            PipelineModel(
                (StepModel(0, (), k=2), StepModel(1, (0,), k=3), StepModel(2, (0,), resumable=True))
            ),
            (FailRun(2, RunOpts(force=(2,))), EditCode(2, True), Run(RunOpts(force=(2,)))),
        ),
        "2580 (the soak profile)",
        "new finding: the memo of attempts a forced run started was per process, so a second "
        "--force run in one process (the checker's in-process CLI, a notebook, a Prefect "
        "worker) resumed the first forced run's partial output, of other code, and committed "
        'a mix of two attempts; --force clears it (docs/reliability.md, "Bound to the recipe")',
    ),
    "a-swept-config-built-from-an-input-served-drifted-under-warn": Pinned(
        "wrong-artifact:stream",
        History(chain(3), (Run(WARN), EditConfig(0, True, False), Stream(2, ((0, True),), WARN))),
        "44",
        "the checker's own bug: a swept config built now from an input served drifted under "
        "--on-drift warn differs as that input does (docs/caching.md, exception 4); the stream "
        "check allowed drift only from a record made before the run",
    ),
    "a-swept-config-whose-output-was-deleted-by-hand-is-served-as-it-is": Pinned(
        "wrong-artifact:stream",
        History(
            chain(2),
            (Run(WARN), DeleteOutput(27), Stream(1, ((0, False),), RunOpts(on_drift="rebuild"))),
        ),
        "1183 (the soak profile)",
        "the checker's own bug: an output damaged by hand is served as it is, the record being "
        "the commit point (docs/caching.md, exception 3); the stream check allowed it only to "
        "runs, not to a sweep's configs",
    ),
    "a-job-json-planted-over-a-running-jobs-is-refused-as-the-plan-says": Pinned(
        "run-failed:other",
        History(
            chain(2, s1={"remote": True}),
            (
                KillDriver(1, "during", WARN),
                Plant("result", 0),
                Run(RunOpts(on_drift="rebuild", on_code_drift="rebuild", force=(1,))),
            ),
        ),
        "1574 (the soak profile)",
        "the checker's own bug: a run refuses a step whose running job job.json does not name "
        "(planted over it), as its plan says (`unrecorded`, docs/remote.md); the checker "
        "took only `unreadable` plans for refusals",
    ),
    "a-user-run-serves-its-build-of-a-shared-input-it-moved": Pinned(
        "wrong-artifact:below-unfinished-rebuild",
        History(
            chain(6),
            (
                Run(WARN),
                EditConfig(5, False, False),
                Run(RunOpts(Context("alice", "user"))),
                EditConfig(1, True, False),
            ),
        ),
        "1132 (the soak profile)",
        "new finding: users/alice/o/s5 read the shared o/s4; once o/s1 is rebuilt in the "
        "user's folder, o/s2..o/s4 move there, have no record, and read as pruned, so s5 is "
        "served (also under rebuild/rebuild); nothing was unfinished (the kind is a misnomer)",
    ),
    "a-teammates-gc-reclaims-the-mark-of-an-unfinished-rebuild": Pinned(
        "wrong-artifact:below-unfinished-rebuild",
        History(
            chain(3),
            (
                Run(WARN),
                EditCode(0, True),
                FailRun(1, CODE_REBUILD),
                Gc(ALICE, False, teammate=True),
                Run(CODE_REBUILD),
            ),
        ),
        "arranged from the table (the gc operation's teammate variant)",
        "red team round 2, finding 3: a teammate's gc with --keep-versions 1 keeps s2 (made "
        "from s1's old build) and reclaimed the status of s1's unfinished rebuild that kept it "
        "stale; s1 then read as pruned and s2 was served as current under rebuild/rebuild",
    ),
    "a-user-run-serves-its-reader-of-a-shared-step-whose-rebuild-failed": Pinned(
        "wrong-artifact:below-unfinished-rebuild",
        History(
            chain(2),
            (
                Run(WARN),
                EditConfig(1, False, False),
                Run(RunOpts(Context("bob", "user"))),
                EditCode(0, True),
                FailRun(0, CODE_REBUILD),
                Run(RunOpts(Context("bob", "user"), on_code_drift="rebuild")),
            ),
        ),
        "arranged from the table (red team round 4, finding 5)",
        "red team round 4, finding 5: users/bob/o/s1 read the shared o/s0, whose rebuild "
        "deleted its record and failed; bob's --scope user plan placed s0 in his folder "
        "(nothing there: pruned) and served his s1, also under rebuild/rebuild",
    ),
    "a-gang-whose-rank-raises-fails-as-one": Pinned(
        "gang-rank-survived",
        History(
            chain(2, s1={"remote": True, "ranks": 2}), (Run(WARN), RankFail(1, RunOpts(force=(1,))))
        ),
        "arranged from the table (issue 56: the rank-fail operation)",
        "docs/remote.md, Gang steps: rank 1 raises while rank 0 runs; every rank ends, the "
        "run fails and nothing is committed",
        event="rank-fail",
    ),
    "a-gang-whose-rank-raises-is-retried-not-preempted": Pinned(
        "rank-failure-preempted",
        History(
            chain(2, s1={"remote": True, "ranks": 2, "retries": 1}),
            (Run(WARN), RankFail(1, RunOpts(force=(1,)))),
        ),
        "arranged from the table (issue 56: the rank-fail operation)",
        "docs/remote.md, Gang steps: with retries=1 one new gang builds the step; the record "
        "counts no preemption",
        event="rank-fail",
    ),
    "a-gang-whose-lease-is-lost-is-cancelled": Pinned(
        "gang-rank-survived",
        History(
            chain(2, s1={"remote": True, "ranks": 2}),
            (Run(WARN), LeaseLost(1, RunOpts(force=(1,)))),
        ),
        "arranged from the table (issue 56: the lease-lost operation)",
        "docs/remote.md, Who keeps the lease alive: the stalled driver cancels every rank of "
        "its gang and commits nothing; the new holder builds the step once",
        event="lease-lost",
    ),
    "a-gang-preempted-past-its-budget-fails": Pinned(
        "preempted-past-budget-succeeded",
        History(
            chain(2, s1={"remote": True, "ranks": 2}),
            (Run(WARN), PreemptPastBudget(1, RunOpts(force=(1,))), Run(WARN)),
        ),
        "arranged from the table (issue 56: the preempt-past-budget operation)",
        "docs/remote.md, Preemption is not failure: past max_preemptions=0 the step fails "
        "('after 0 preemptions'), the run never reports success, nothing is committed",
        event="past-budget",
    ),
    "a-checkpoint-of-old-code-resumed-once-its-input-is-unchanged": Pinned(
        "wrong-artifact:below-unfinished-rebuild",
        History(
            PipelineModel(
                (
                    StepModel(0, (), k=2),
                    StepModel(1, (0,), k=2),
                    StepModel(2, (0,)),
                    StepModel(3, (1, 2), k=2),
                    StepModel(4, (3,), k=3, user_scope=True),
                    StepModel(5, (3,), k=2, resumable=True),
                )
            ),
            (
                FailRun(5, RunOpts(Context("bob", "user"))),
                FailRun(0, RunOpts(Context("bob"), force=(0,))),
                EditCode(5, True),
                Run(RunOpts(Context("bob"))),
            ),
        ),
        "4076 (the soak profile)",
        "the checker's own bug: the plan clears s5's checkpoint of old code (`upstream o/s3@v1 "
        "is rebuilt in this run`); s1 and s2 are rebuilt into the same bytes, s3 is unchanged, "
        "and the run resumes it under warn and logs `code changed ...; resumed anyway` "
        "(docs/caching.md, Whose work is it); the checker read only the plan's verdict",
    ),
    "a-killed-drivers-job-writing-during-a-dry-run-gc-is-not-gcs-doing": Pinned(
        "gc-dry-run-changed",
        History(
            PipelineModel(
                (
                    StepModel(0, (), 3, remote=True),
                    StepModel(1, (), 2, remote=True, resumable=True, user_scope=True),
                    StepModel(2, (), 1, remote=True),
                    StepModel(3, (0, 1, 2), 3),
                )
            ),
            (
                KillDriver(1, "before", RunOpts(on_drift="rebuild")),
                Gc(Context(), dry_run=True, teammate=True),
            ),
        ),
        "4995 (the soak profile)",
        "the checker's own bug: the jobs of a killed driver run on and write their outputs "
        "while a teammate's `gc --dry-run` runs; the check took their new data files for gc's",
    ),
    "a-job-of-other-code-reused-under-warn-is-code-drift-the-run-names": Pinned(
        "wrong-artifact:remote-job",
        History(
            PipelineModel(
                (
                    StepModel(0, (), 3),
                    StepModel(1, (), 2),
                    StepModel(2, (0, 1), 3, remote=True),
                    StepModel(3, (2,), 1),
                    StepModel(4, (3,), 2, remote=True),
                )
            ),
            (
                KillDriver(2, "before", RunOpts(on_drift="rebuild")),
                EditCode(2, True),
                Run(WARN),
            ),
        ),
        "5958 (the soak profile)",
        "the checker's own bug: the run collects the job of old code its killed driver left "
        "and logs `code drift ...: local job ... ran other code (...); reused "
        "(on_code_drift=warn)` (docs/caching.md, Whose work is it); the checker read only the "
        "plan made before the run, which cannot know the job's code",
    ),
    "a-sweep-point-served-by-older-code-under-warn-is-code-drift": Pinned(
        "wrong-artifact:stream",
        History(
            PipelineModel(
                (
                    StepModel(0, (), 3),
                    StepModel(1, (0,), 1),
                    StepModel(2, (1,), 1, resumable=True),
                    StepModel(3, (1,), 2, resumable=True),
                    StepModel(4, (0, 2), 2, resumable=True),
                    StepModel(5, (0, 4), 1),
                    StepModel(6, (2, 4), 3),
                )
            ),
            (
                Run(RunOpts(on_code_drift="error")),
                EditCode(6, True),
                EditCode(4, False),
                TwoDrivers(WARN),
                Stream(6, ((0, False), (1, True), (2, True)), RunOpts(on_drift="rebuild")),
            ),
        ),
        "5952 (the soak profile)",
        "the checker's own bug: a sweep under `--on-code-drift warn` serves the record of one "
        "of its configs built by older code (docs/caching.md, exception 1); the stream check "
        "allowed config drift only",
    ),
    "a-user-scope-run-over-a-stale-shared-adoption-fails-every-time": Pinned(
        "run-failed:user-scope-shared",
        History(
            PipelineModel((StepModel(0, (), 2),), Adoption(0, "in-build", "/parts")),
            (Run(WARN), RebuildFeed(True), Run(RunOpts(Context("alice", "user")))),
        ),
        "154 (the adopt profile), shrunk",
        "an adoption of a sub-folder of another pipeline's build, that build rebuilt, then "
        "`marin run --scope user`: the plan showed the adoption `stale ... shared -> user`, "
        "but the run placed it on the shared record (the user-scope placement asked `decide` "
        "without the adoption's builds) and `build_step` refused, on every run: the placement "
        "now judges the shared build as the plan does (/work/notes/redteam/oracle-adopt-1.py)",
    ),
    "a-reader-of-a-built-record-served-as-an-adoption-reads-the-source": Pinned(
        "wrong-artifact:other",
        History(
            PipelineModel((StepModel(0, (), 1), StepModel(1, (0,), 2)), Adoption(0, "in-build")),
            (
                Run(WARN),
                ToggleAdoption(),
                Run(RunOpts(on_drift="rebuild", cascade=False)),
                ToggleAdoption(),
                Run(WARN),
                ToggleAdoption(),
            ),
        ),
        "472 (the adopt profile), shrunk",
        "a built record of the adoption's name@version was served as the adoption (drift "
        "under warn); its reader, rebuilt from the adoption's source, recorded that build as "
        "its input, so once the step was the built one again the reader was served under "
        "rebuild/rebuild with bytes no clean build makes: an adoption's record and a build's "
        "never stand for each other (/work/notes/redteam/oracle-adopt-2.py)",
    ),
    "gc-keeps-a-jobs-input-but-not-what-it-was-made-from": Pinned(
        "wrong-artifact:below-unfinished-rebuild",
        History(
            PipelineModel(
                (
                    StepModel(0, ()),
                    StepModel(1, (), 1),
                    StepModel(2, (), 2),
                    StepModel(3, (0, 1, 2), 3),
                    StepModel(4, (3,), 3),
                    StepModel(5, (4,), 3, remote=True),
                )
            ),
            (
                Run(WARN),
                Run(RunOpts(force=(1,))),
                GcOther(ALICE),
                EditConfig(1, True, False),
                Run(RunOpts(on_drift="rebuild")),
            ),
        ),
        "414 (the adopt profile), shrunk, then without its adoption",
        "a teammate's gc collected s3 but kept s4 as the input of s5's finished local job "
        "('which may run'), not what s4 was made from; s3 then read as never built and was "
        "pruned, so after an upstream edit s4 was served under rebuild/rebuild with bytes of "
        "the old upstream: gc now keeps a job's inputs only for a step with no record (a job "
        "in flight) (/work/notes/redteam/oracle-adopt-3.py)",
    ),
    "a-record-torn-at-the-shared-placement-is-removed-by-hand-for-a-user-too": Pinned(
        "wrong-artifact:below-unfinished-rebuild",
        History(
            PipelineModel(
                (
                    StepModel(0, (), 1),
                    StepModel(1, (), 3),
                    StepModel(2, (), 1),
                    StepModel(3, (0, 1, 2), 3),
                ),
                Adoption(1, "outside"),
            ),
            (
                KillDriver(2, "during", WARN),
                Run(RunOpts(Context("alice", "user"))),
                TearRecord(41),
                ToggleAdoption(),
            ),
        ),
        "65 (the adopt profile), shrunk",
        "the checker's own bug: a record torn at the shared placement, read by a user-scope "
        "plan that places the step in the user's folder (nothing there): its readers are "
        "served as built (docs/caching.md, exception 3); the check knew the shared path only",
    ),
    "a-config-whose-key-changed-type-is-served-the-other-keys-build": Pinned(
        "wrong-artifact:other",
        History(
            chain(2),
            (Run(WARN), EditConfig(1, True, False, retype=0), Run(RunOpts(on_drift="error"))),
        ),
        "47, 78, 83, 132, 183 on 61aa72e; 78 shrunk, then run under --on-drift error",
        "red team round 16, finding 1: a config dict's key lost its type in the fingerprint, so "
        "s1's config {'keyed': {0: 1}} edited to {'keyed': {'0': 1}} (its fn sees the "
        "difference) kept its fingerprint and was served the build of the other config under "
        "rebuild/rebuild, and the run under --on-drift error skipped it (fixed in 1276a4f)",
    ),
    "a-users-data-beside-an-empty-metadata-folder-is-cleared-as-debris": Pinned(
        "user-data-touched",
        History(chain(1), (PutUserData("empty", 0), Run(WARN))),
        "0, 49, 52, 64, 69, 119 on f438e3d; 64 shrunk",
        "red team round 17, finding 2: a user's data at o/s0/v1 beside an empty v1.marin/ "
        "(or one holding only lease.json.guard, or an empty checkpoints/: seeds 49, 52) was "
        "cleared by the build as an earlier attempt's debris; the build now refuses it "
        "('already exists and was not written by Marin'), as marin plan says",
    ),
    "a-users-data-beside-the-lease-guard-is-refused-until-moved-away": Pinned(
        "user-data-touched",
        History(chain(2), (PutUserData("guard", 0), Run(WARN), MoveUserData(0), Run(WARN))),
        "arranged from the table (the user-data operations, the guard's shape)",
        "red team round 17, finding 2: beside only lease.json.guard the build of o/s0 is "
        "refused and its reader blocked, the data left as it is; moved away by hand, as the "
        "refusal says, o/s0 and o/s1 build",
        event="user-data-moved",
    ),
    "a-reader-of-a-stale-adoption-builds-under-no-cascade": Pinned(
        "run-failed:other",
        History(
            PipelineModel(
                (StepModel(0, ()), StepModel(1, (0,))), Adoption(0, "in-build", "/parts")
            ),
            (KillDriver(1, "kill", WARN), RebuildFeed(True), Run(RunOpts(cascade=False))),
        ),
        "24 with the user-data weight at 1.5 (7 steps, s6 reading s0 and s2), shrunk by hand",
        "red team round 18: s0 adopts o/feed/v1/parts; its reader's driver was killed, the feed "
        "rebuilt with other bytes, and every `marin run --no-cascade` failed the reader with "
        "'... rebuilt or removed while this step was being built from it': the builder took a "
        "change made before the run for a race. The stale adoption is served and its reader "
        "built from the data as it is; a partial attempt or a job made before the change is "
        "not resumed (tests/reliability/test_adoption_no_cascade.py)",
    ),
    "a-library-object-a-module-level-call-configures-is-served-after-an-edit": Pinned(
        "wrong-artifact:other",
        History(chain(4), (Run(WARN), EditCode(2, True), Run(WARN))),
        "arranged (s2's REV is a ConfigParser its read_string call fills: REV_SHAPES)",
        "red team r47-1: an edit of a module-level call configuring a library object "
        "(`REV.read_string(...)`) was no code drift: s2, then s3, served as current",
    ),
}

ON_AN_ENGINE = Pinned(
    "wrong-artifact:below-unfinished-rebuild",
    History(chain(3), (Run(WARN), EditCode(0, True), FailRun(1, CODE_REBUILD), Run(CODE_REBUILD))),
    "arranged from the table (seed 48's bug, with a failure instead of a kill)",
    "new finding: a rebuild that fails deletes the record that made its readers stale; they "
    "are then served as current (on the Prefect flow and the Airflow DAG too)",
)
"""The pinned history the engine subset replays on Prefect and Airflow."""

CLEAN = History(
    chain(4, s1={"resumable": True}, s2={"remote": True}),
    (
        Run(WARN),
        EditCode(1, True),
        Run(CODE_REBUILD),
        EditConfig(2, False, False),
        Run(WARN),
        EditConfig(3, True, True),
        Gc(ALICE, False),
        Run(RunOpts(on_drift="rebuild")),
    ),
)
"""Edits, runs under each policy, a remote and a resumable step, gc: every promise kept."""
