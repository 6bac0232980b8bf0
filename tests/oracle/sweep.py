"""A sweep as a step stream: the pipeline's targets, then configs of one step.

A user sweeping ``k`` over one step writes a generator and gives it to ``StepRunner.run``;
forgetting to give each config its own version makes two configs of one ``name@version``.
This module has no import from tests/: repro scripts carry a copy of it.
"""

import contextlib


def variant_specs(k, version, variants):
    """``(k, version)`` of each config: ``k`` plus its delta, at version ``v1x`` when bumped,
    else at the step's own (current) version."""
    return [
        (k + delta, f"v{10 + j}" if bump else version) for j, (delta, bump) in enumerate(variants)
    ]


def run_sweep(module, prefix, idx, wanted, step, on_drift, on_code_drift, codex):
    """``StepRunner.run`` over a generator: ``module.pipeline``, then step ``idx`` (``step``:
    its ``note``, its ``keyed`` dict's ``key`` as it is, ``remote`` and ``resumable``) at each
    ``(k, version)`` of ``wanted``; its report."""
    from marin.execution.lazy import OUT, VersionCodex, apply, build_context
    from marin.execution.plan.options import RunOptions
    from marin.execution.run.runner import StepRunner

    base, fn = getattr(module, f"s{idx}"), getattr(module, f"f_s{idx}")
    step_options = {}
    if step["remote"]:
        step_options["remote"] = "local"
    if step["resumable"]:
        step_options["resumable"] = True

    def handles():
        yield from module.pipeline
        for k, version in wanted:
            cfg = {"k": k, "note": step["note"], "keyed": {step["key"]: 1}}
            handle = apply(f"o/s{idx}", fn, version=version, out=OUT, cfg=cfg, ins=list(base.deps))
            yield handle.with_options(**step_options) if step_options else handle

    runner = StepRunner(RunOptions(on_drift=on_drift, on_code_drift=on_code_drift), prefix=prefix)
    scope = build_context(VersionCodex(*codex)) if codex else contextlib.nullcontext()
    with scope:
        return runner.run(handles())
