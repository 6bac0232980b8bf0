"""Seeded graph generators for the benchmarks.

Every generator returns ``(handles, targets)``: all the handles it made (in creation order, deps
before dependents) and the sink handles to pass to ``lower``/``run``. Steps are no-ops unless a
``durations`` mapping gives a step's sleep time, so the engine's own overhead is what is measured.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from marin.execution.lazy import OUT, ArtifactStep, apply


def noop(deps: Sequence[str], out: str) -> None:
    """A step that does nothing: the scheduler and the commit are all that is left to time."""
    return None


def sleeper(deps: Sequence[str], out: str, seconds: float) -> None:
    time.sleep(seconds)


def _step(
    name: str, deps: list[ArtifactStep], seconds: float | None, version: str = "v0"
) -> ArtifactStep:
    if seconds is None:
        return apply(name, noop, version=version, deps=deps, out=OUT)
    return apply(name, sleeper, version=version, deps=deps, out=OUT, seconds=seconds)


def _sinks(handles: list[ArtifactStep]) -> list[ArtifactStep]:
    used = {id(d) for h in handles for d in h.deps}
    return [h for h in handles if id(h) not in used]


Durations = Callable[[int], float] | None


def chain(n: int, *, seed: int = 0, durations: Durations = None, tag: str = "chain"):
    """``s0 <- s1 <- ... <- s(n-1)``: every step waits for the previous one."""
    handles: list[ArtifactStep] = []
    prev: list[ArtifactStep] = []
    for i in range(n):
        h = _step(f"{tag}/s{i:06d}", prev, durations(i) if durations else None)
        handles.append(h)
        prev = [h]
    return handles, [handles[-1]]


def _own_function(i: int) -> Callable[[Sequence[str], str], None]:
    """A no-op step function of its own: one factory's closure (over ``i``), as a sweep makes."""

    def step(deps: Sequence[str], out: str) -> None:
        return None if out else print(i)

    return step


def closures(n: int, *, seed: int = 0, durations: Durations = None, tag: str = "closures"):
    """A chain whose every step has a function of its own (closures of one factory): what
    lowering costs when each step's code is digested, not one shared function."""
    handles: list[ArtifactStep] = []
    for i in range(n):
        deps = handles[-1:]
        handles.append(apply(f"{tag}/s{i:06d}", _own_function(i), version="v0", deps=deps, out=OUT))
    return handles, [handles[-1]]


def fan(n: int, *, seed: int = 0, durations: Durations = None, tag: str = "fan"):
    """One source, ``n - 2`` independent middle steps, one sink that joins them all."""
    source = _step(f"{tag}/source", [], durations(0) if durations else None)
    middle = [
        _step(f"{tag}/m{i:06d}", [source], durations(i + 1) if durations else None)
        for i in range(max(n - 2, 0))
    ]
    sink = _step(f"{tag}/sink", middle, durations(n - 1) if durations else None)
    return [source, *middle, sink], [sink]


def random_dag(
    n: int, *, seed: int = 0, durations: Durations = None, tag: str = "rand", max_deps: int = 3
):
    """Each step depends on up to ``max_deps`` random earlier steps (0 for the first)."""
    rng = random.Random(seed)
    handles: list[ArtifactStep] = []
    for i in range(n):
        k = rng.randint(0, min(max_deps, i))
        deps = [handles[j] for j in sorted(set(rng.sample(range(i), k)))] if k else []
        handles.append(_step(f"{tag}/s{i:06d}", deps, durations(i) if durations else None))
    return handles, _sinks(handles)


def experiment(n: int, *, seed: int = 0, durations: Durations = None, tag: str = "exp"):
    """A layered ML experiment: raw shards -> tokenized -> datasets -> train -> eval -> report.

    Shards fan into per-dataset mixes, each model trains on one or two mixes, each model has
    several evals, and one report joins every eval. Sizes scale with ``n`` (about ``n`` steps).
    """
    rng = random.Random(seed)
    handles: list[ArtifactStep] = []
    counter = iter(range(10**9))

    def make(name: str, deps: list[ArtifactStep]) -> ArtifactStep:
        i = next(counter)
        h = _step(f"{tag}/{name}", deps, durations(i) if durations else None)
        handles.append(h)
        return h

    budget = max(n, 8)
    n_raw = max(budget * 3 // 10, 1)
    n_mix = max(budget // 20, 1)
    n_models = max(budget // 20, 1)
    n_evals = max((budget - 2 * n_raw - n_mix - n_models - 1) // n_models, 1)
    raw = [make(f"raw/{i:06d}", []) for i in range(n_raw)]
    tok = [make(f"tok/{i:06d}", [r]) for i, r in enumerate(raw)]
    # Every shard feeds some mix and every mix some model, so all steps reach the report.
    mixes = []
    for i in range(n_mix):
        own = tok[i::n_mix]
        extra = rng.sample(tok, min(len(tok), rng.randint(1, 10)))
        mixes.append(make(f"mix/{i:05d}", list({id(t): t for t in own + extra}.values())))
    evals: list[ArtifactStep] = []
    for m in range(n_models):
        picked = [mixes[m % n_mix], *rng.sample(mixes, min(len(mixes), rng.randint(0, 1)))]
        model = make(f"train/{m:05d}", list({id(x): x for x in picked}.values()))
        evals += [make(f"eval/{m:05d}/{e:04d}", [model]) for e in range(n_evals)]
    report = make("report", evals)
    return handles, [report]


GENERATORS: dict[str, Callable[..., tuple[list[ArtifactStep], list[ArtifactStep]]]] = {
    "chain": chain,
    "closures": closures,
    "fan": fan,
    "random": random_dag,
    "experiment": experiment,
}


def make(kind: str, n: int, **kwargs: Any) -> tuple[list[ArtifactStep], list[ArtifactStep]]:
    return GENERATORS[kind](n, **kwargs)
