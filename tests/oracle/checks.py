"""The checks run after every operation, and the one table of what may differ.

A served artifact (a step a run reports current, or a plan would skip) must be what the
oracle's clean build makes, byte for byte, and return the same value. :func:`allowances`
is the whole list of exceptions, each a rule of docs/caching.md ("What a run may serve that a
clean build would not make"):

- config drift served under ``on_drift=warn``, code drift under ``on_code_drift=warn`` (a
  record's, or a partial output's the run resumes), a stale
  step served under ``--no-cascade`` (the step's own reason in ``plan --json``: ``drift``,
  ``code_drift``, ``stale``);
- an output changed by hand after its commit (the record is the commit point; ``--force``
  repairs it);
- and a step built from one of those, while that one is really stale.

Each violation has a kind; :data:`FINDINGS` maps the kinds to the trust findings of issue 53.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.oracle.oracle import Expected, canonical, read_tree

FINDINGS: dict[str, str] = {
    "gc-deleted-served": "1 (gc deletes user-scope builds a plan serves)",
    "gc-touched-other-user": "1 (gc deletes other users' builds)",
    "planted:process-killed": "2 (a planted job.json + pid.json kills a process)",
    "planted:run-hung": "2 (a run reattaches to a planted job and waits for it)",
    "planted:code-ran": "3 (a planted result.pkl is unpickled)",
    "planted:result-committed": "3 (a planted result is committed as the step's)",
    "outside-prefix-touched": "3 (a job.json without workdir is followed outside the prefix)",
    "wrong-artifact:resumed": "5 (a resume of checkpoints made from a replaced input)",
    "wrong-artifact:remote-job": "6 (a job of old code or old inputs collected)",
    "wrong-artifact:stream": "8 (a stream serves one config of a name@version for another)",
    "wrong-artifact:below-unfinished-rebuild": "new (a rebuild that failed or was killed "
    "deletes the record that made its readers stale; they are then served as current, also "
    "under rebuild/rebuild)",
    "wrong-artifact:other": "- (a wrong artifact served by another path; r16-1 on 61aa72e: a "
    "config whose dict key changed only its type served the other key's build, fast seeds 47, "
    "78, 83, 132, 183)",
    "not-said": "- (a stale artifact served without the run or plan saying so)",
    "fn-ran-twice": "- (fn ran twice for one recipe in one run)",
    "run-failed:torn-job": "7 (a torn job.json fails the step: 'delete it by hand')",
    "run-failed:user-scope-shared": "15 (a user-scope run fails on a shared upstream to rebuild)",
    "run-failed:other": "- (a run failed with no failure injected)",
    "run-failed:prefect": "- (a Prefect flow run failed with no failure injected)",
    "run-failed:airflow": "- (an Airflow DAG run failed with no failure injected)",
    "run-hung": "- (a run did not end, nothing planted)",
    "gc-dry-run-changed": "- (marin gc --dry-run changed files)",
    "crash": "new (marin raised an error it does not mean to: a traceback)",
    "adopted-data-touched": "new (a run or gc changed or deleted data a step adopted, which "
    "Marin never wrote: docs/reliability.md, 'Marin deletes only what it provably wrote')",
    "user-data-touched": "r17-2 (a run or gc changed or deleted data a user put at a step's "
    "output path beside a metadata folder no Marin attempt left: empty, only the lease's guard, "
    "or an empty checkpoints/; a build cleared it as an earlier attempt's debris, fast seeds "
    "0, 49, 52, 64, 69, 119 on f438e3d)",
    "wrong-artifact:adoption": "new (an adoption served with a record of other data)",
    "wrong-artifact:adoption-reader": "new (a reader of an adoption served with what other "
    "data than its adopted data makes)",
    "run-failed:adopted-data": "new (AdoptedDataError where no built step replaces an adoption)",
}
"""Violation kind -> the trust finding (issue 53) it is an instance of."""


@dataclass(frozen=True)
class Violation:
    """One broken promise, after operation ``op`` of a history."""

    kind: str
    op: int
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] after op {self.op}: {self.message}"


@dataclass(frozen=True)
class Policy:
    """The options that decide what a run may serve stale."""

    on_drift: str = "warn"
    on_code_drift: str = "warn"
    cascade: bool = True


STRICT = Policy("rebuild", "rebuild", True)


@dataclass(frozen=True)
class Stored:
    """What the prefix holds for a step: its output tree, its value, and its record."""

    found: Expected | None
    record: dict[str, Any] | None


def stored(output_path: str) -> Stored:
    record = read_record(output_path)
    files, folders = read_tree(output_path)
    result = canonical(record.get("result")) if record is not None else "<no record>"
    return Stored(Expected(files, folders, result), record)


def read_record(output_path: str) -> dict[str, Any] | None:
    try:
        with open(f"{output_path}.marin/record.json") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def step_index(step: dict[str, Any]) -> int:
    """``o/s3`` (or ``o/s3@v1``) -> 3."""
    name = str(step.get("name") or str(step["step"]).rsplit("@", 1)[0])
    return int(name.rsplit("/s", 1)[1])


def kind_of(plan: dict[str, Any], step_id: str, record: dict[str, Any] | None, hand: Hand) -> str:
    """The kind of a wrong artifact: how it was committed, or that it sits below a rebuild
    that failed or was killed (which deleted the record that said it was stale), or that it
    is an adoption or reads one."""
    if "planted" in str((record or {}).get("result")):
        return "planted:result-committed"
    if below_unfinished(plan, step_id, hand):
        return "wrong-artifact:below-unfinished-rebuild"
    if (record or {}).get("source") is not None:
        return "wrong-artifact:adoption"
    if reads_adoption(plan, step_id):
        return "wrong-artifact:adoption-reader"
    return f"wrong-artifact:{mechanism(record)}"


def reads_adoption(plan: dict[str, Any], step_id: str) -> bool:
    """Whether a step ``step_id`` reads (transitively) is recorded as an adoption."""
    return any(
        (read_record(dep["output_path"]) or {}).get("source") is not None
        for dep in upstream_of(plan, step_id)
    )


def upstream_of(plan: dict[str, Any], step_id: str) -> Iterator[dict[str, Any]]:
    """The steps of ``plan --json`` that ``step_id`` reads, transitively, each once."""
    by_id = {s["step"]: s for s in plan.get("steps", [])}
    todo, seen = list(by_id.get(step_id, {}).get("deps", [])), set()
    while todo:
        dep = todo.pop()
        if dep in seen or dep not in by_id:
            continue
        seen.add(dep)
        yield by_id[dep]
        todo.extend(by_id[dep].get("deps", []))


def matches(got: Stored, want: Expected) -> bool:
    """Whether what is stored is the clean build: byte for byte, or for an adoption, a record
    of the data it adopts (its bytes lie elsewhere: its readers are compared instead)."""
    if want.adopted:
        return str((got.record or {}).get("source") or "").endswith(want.adopted)
    return got.found == want


def mechanism(record: dict[str, Any] | None) -> str:
    """How a wrong artifact was committed: by a resume, a remote job, or else."""
    provenance = (record or {}).get("provenance") or {}
    attempt = provenance.get("attempt") or {}
    if isinstance(attempt, dict) and attempt.get("resumed"):
        return "resumed"
    if provenance.get("job"):
        return "remote-job"
    return "other"


def own_reasons(step: dict[str, Any], policy: Policy, damaged: set[str]) -> list[str]:
    """The step's own documented reason to be served stale (docs/caching.md), if any."""
    out = []
    if step.get("drift") and policy.on_drift == "warn":
        out.append("drift")
    if (step.get("code_drift") or resumes_other_code(step)) and policy.on_code_drift == "warn":
        out.append("code drift")
    if step.get("stale") and not policy.cascade:
        out.append("no-cascade")
    if step.get("build_id") in damaged:
        out.append("changed by hand")
    return out


def resumes_other_code(step: dict[str, Any]) -> bool:
    """Whether the plan resumes a partial output of other code (docs/caching.md: under
    ``warn`` it is ours, with a note, and made by both codes)."""
    resume = step.get("resume") or {}
    return bool(resume.get("resume")) and "code changed" in str(resume.get("reason"))


def allowances(
    plan: dict[str, Any], policy: Policy, hand: Hand, differs: dict[str, bool]
) -> dict[str, list[str]]:
    """Step id -> why it may differ from a clean build (empty: it may not). A step inherits
    the allowance of an input that is allowed and really differs from its clean build, and of
    an input whose record was removed by hand (not built since: pruned, docs/caching.md)."""
    allowed: dict[str, list[str]] = {}
    for step in plan.get("steps", []):
        reasons = own_reasons(step, policy, hand.outputs)
        if not step.get("build_id") and hand.removed(step["output_path"]):
            allowed[step["step"]] = ["record removed by hand"]
            continue
        for dep in step.get("deps", []):
            if allowed.get(dep) and (differs.get(dep) or dep not in differs):
                reasons.append(f"input {dep}")
        allowed[step["step"]] = reasons
    return allowed


@dataclass
class Hand:
    """What was damaged by hand: build ids of outputs changed after their commit, and
    output paths whose record was removed."""

    outputs: set[str] = field(default_factory=set)
    records: set[str] = field(default_factory=set)

    def removed(self, output_path: str) -> bool:
        """Whether the record of ``output_path`` was removed by hand, at that placement or at
        the shared one a user's placement reads when hers holds nothing (docs/caching.md)."""
        return output_path in self.records or USER_FOLDER.sub("/", output_path, 1) in self.records


USER_FOLDER = re.compile(r"/users/[^/]+/")


def below_unfinished(plan: dict[str, Any], step_id: str, hand: Hand) -> bool:
    """Whether a step ``step_id`` reads (transitively) has no record because an attempt to
    build it failed or was cut short (not because its record was removed by hand)."""
    return any(
        dep.get("status") in ("failed-before", "run") and not hand.removed(dep["output_path"])
        for dep in upstream_of(plan, step_id)
    )


def differences(plan: dict[str, Any], expected: dict[int, Expected]) -> dict[str, bool]:
    """Step id -> whether what the prefix holds for it differs from its clean build."""
    out = {}
    for step in plan.get("steps", []):
        got = stored(step["output_path"])
        want = expected[step_index(step)]
        if got.record is not None and not want.adopted:  # an adoption's data: unknown
            out[step["step"]] = got.found != want
    return out


def check_served(
    plan: dict[str, Any],
    policy: Policy,
    expected: dict[int, Expected],
    hand: Hand,
    op: int,
    label: str,
) -> list[Violation]:
    """Every step ``plan`` serves (``skip``) is its clean build, or allowed to differ."""
    allowed = allowances(plan, policy, hand, differences(plan, expected))
    kinds: dict[str, str] = {}
    out = []
    for step in plan.get("steps", []):
        if step.get("action") != "skip":
            continue
        got = stored(step["output_path"])
        want = expected[step_index(step)]
        if not matches(got, want) and not allowed.get(step["step"]):
            kind = kinds[step["step"]] = inherited(step, kinds) or kind_of(
                plan, step["step"], got.record, hand
            )
            out.append(
                Violation(
                    kind,
                    op,
                    f"{label}: {step['step']} is served "
                    f"({step.get('reason')}) but differs from a clean build: "
                    f"stored {diff(got, want)}",
                )
            )
    return out


def inherited(step: dict[str, Any], kinds: dict[str, str]) -> str | None:
    """A wrong artifact built from a wrong input is that input's kind of wrong."""
    return next((kinds[d] for d in step.get("deps", []) if d in kinds), None)


def diff(stored: Stored, want: Expected) -> str:
    got = stored.found
    if want.adopted:
        source = (stored.record or {}).get("source")
        return f"a record of source {source}, not of ...{want.adopted}"
    if got is None:
        return "nothing"
    parts = []
    if got.result != want.result:
        parts.append(f"result {got.result} != {want.result}")
    if got.files != want.files or got.folders != want.folders:
        g, w = dict(got.files), dict(want.files)
        changed = sorted(k for k in set(g) | set(w) if g.get(k) != w.get(k))
        parts.append(f"files differ: {changed}")
    return "; ".join(parts) or "?"


CURRENT = ("built", "skipped", "unchanged", "built-by-other")
SAYS = {"drift": ("version bump",), "code drift": ("code changed", "ran other code"),
        "no-cascade": ("stale",)}  # fmt: skip


def check_report(
    report: dict[str, Any],
    pre_plan: dict[str, Any] | None,
    policy: Policy,
    expected: dict[int, Expected],
    hand: Hand,
    op: int,
    log: str = "",
) -> list[Violation]:
    """Every step a run reports current is its clean build, or allowed to differ by the plan
    made just before it with the same options (with the resume verdicts the run's ``log``
    says it reached instead); an allowed one's own reason is in the run's."""
    plan = with_run_resumes(pre_plan or {"steps": []}, report, log)
    allowed = allowances(plan, policy, hand, differences(plan, expected))
    out = []
    kinds: dict[str, str] = {}
    for step in report.get("steps", []):
        if step.get("action") not in CURRENT:
            continue
        got = stored(step["output_path"])
        want = expected[step_index(step)]
        if matches(got, want):
            continue
        reasons = allowed.get(step["step"], [])
        if not reasons:
            deps = {"deps": _deps_of(plan, step["step"])}
            kind = kinds[step["step"]] = inherited(deps, kinds) or kind_of(
                plan, step["step"], got.record, hand
            )
            out.append(
                Violation(
                    kind,
                    op,
                    f"the run reports {step['step']} {step['action']} "
                    f"({step.get('reason')}) but it differs from a clean build: "
                    f"stored {diff(got, want)}",
                )
            )
            continue
        said = str(step.get("reason")) + _resume_line(plan, step) + _job_line(log, step)
        unsaid = [r for r in reasons if r in SAYS and not any(w in said for w in SAYS[r])]
        if unsaid and unsaid == reasons:
            out.append(
                Violation(
                    "not-said",
                    op,
                    f"{step['step']} is served stale ({unsaid}) "
                    f"but the run's reason does not say so: {step.get('reason')}",
                )
            )
    return out


RESUME_LINE = re.compile(r"^\S+\s+INFO\s+resume (\S+): (.*)$", re.MULTILINE)
PENDING = re.compile(r"upstream (\S+) is rebuilt in this run")


def with_run_resumes(plan: dict[str, Any], report: dict[str, Any], log: str) -> dict[str, Any]:
    """``plan`` with what the run logged it reused (a job of other code, under ``warn``:
    code drift), and with the resume verdict the run logged for a step it reports resumed, where
    the plan cleared the partial output only because its inputs "are rebuilt in this run" and
    the run kept each of them (early cutoff: ``unchanged``). The build judges the partial
    output again then, and resumes it, under ``warn`` also across a code change, saying so in
    its log (docs/reliability.md, "Resumable steps": "``warn`` resumes and says so";
    docs/caching.md, "Whose work is it": input builds and code digest)."""
    said = {m.group(1): m.group(2) for m in RESUME_LINE.finditer(log)}
    kept = {
        s["step"] for s in report.get("steps", []) if s.get("action") in ("unchanged", "skipped")
    }
    resumed = {s["step"] for s in report.get("steps", []) if s.get("resumed")}

    def rejudged(step: dict[str, Any]) -> bool:
        planned = str((step.get("resume") or {}).get("reason", ""))
        why = planned.partition(" read other input builds: ")[2].split("; ")
        inputs = [PENDING.fullmatch(w) for w in why if w and w != "it is cleared"]
        return (
            step["step"] in resumed
            and step["step"] in said
            and bool(inputs)
            and all(m is not None and m.group(1) in kept for m in inputs)
        )

    steps = [
        {**s, "resume": {"resume": True, "reason": said[s["step"]]}} if rejudged(s) else s
        for s in plan.get("steps", [])
    ]
    reused = {m.group(1) for m in JOB_OF_OTHER_CODE.finditer(log)}
    steps = [  # a job of other code the run reattached to or collected under warn
        {**s, "code_drift": s.get("code_drift") or ["its job ran other code"]}
        if s["step"] in reused else s
        for s in steps
    ]  # fmt: skip
    return {**plan, "steps": steps}


JOB_OF_OTHER_CODE = re.compile(
    r"^\S+\s+WARNING\s+code drift (\S+): (.* ran other code .*; reused \(on_code_drift=warn\))$",
    re.MULTILINE,
)
"""The run's note of a job of other code it reused under ``warn`` (docs/caching.md, "Whose
work is it": the code digest row; the next plan shows the record's code drift; seed 5958)."""


def _job_line(log: str, step: dict[str, Any]) -> str:
    """The run's note that it reused ``step``'s job of other code, if it did."""
    found = [m.group(2) for m in JOB_OF_OTHER_CODE.finditer(log) if m.group(1) == step["step"]]
    return " " + found[0] if found else ""


def _resume_line(plan: dict[str, Any], step: dict[str, Any]) -> str:
    """What the plan said of a step the run reports resumed: docs/reliability.md's "resume:
    ... code changed ...; resumed anyway" (the run's own reason is why it was built)."""
    if not step.get("resumed"):
        return ""
    planned = next((s for s in plan.get("steps", []) if s["step"] == step["step"]), {})
    return " " + str((planned.get("resume") or {}).get("reason", ""))


def _deps_of(plan: dict[str, Any], step_id: str) -> list[str]:
    return next((s.get("deps", []) for s in plan.get("steps", []) if s["step"] == step_id), [])


def check_once(
    counter: str, run_ids: set[str], op: int, twice: frozenset[str] = frozenset()
) -> list[Violation]:
    """A step's fn started at most once per recipe across ``run_ids`` (one run, or drivers
    racing without a fault); twice for the steps in ``twice`` (a job preempted once)."""
    seen: dict[tuple[str, str], int] = {}
    for line in read_lines(counter):
        if line.get("run") in run_ids:
            key = (str(line.get("step")), str(line.get("recipe")))
            seen[key] = seen.get(key, 0) + 1
    return [
        Violation(
            "fn-ran-twice",
            op,
            f"{step}'s fn started {n} times for recipe {recipe} in run(s) {sorted(run_ids)}",
        )
        for (step, recipe), n in sorted(seen.items())
        if n > (2 if step in twice else 1)
    ]


def read_lines(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for raw in f:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
    return out


def snapshot(root: str) -> dict[str, str]:
    """Every file below ``root`` (relative path -> sha256), links as their target."""
    files, _ = read_tree(root) if os.path.isdir(root) else ((), ())
    return dict(files)
