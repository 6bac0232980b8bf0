"""Section ``rss``: peak memory of lowering and running, per step.

No worker of its own: it reads the peak RSS the ``overhead`` section's workers report (one
process per size), real builds on local disk and the scheduler with ``build_step`` stubbed."""

from __future__ import annotations

from harness import Harness


def bench(h: Harness) -> None:
    """(7) Peak RSS of lowering + running, from the overhead workers (one process per size).

    Real builds on local disk at the sizes that fit the time budget, and the scheduler with
    ``build_step`` stubbed (so without the per-step record objects) up to 50,000 steps.
    """
    for key, label in (
        ("rss_local", "local disk, real builds"),
        ("rss_stub", "build_step stubbed"),
    ):
        rss = h.raw.get(key) or {}
        points = sorted((int(n), start, peak) for n, (start, peak) in rss.items())
        for n, start, peak in points:
            h.add(
                "rss",
                f"peak RSS lower+run n={n} ({label})",
                peak / 1024,
                "MiB",
                note=f"{(peak - start) / n:.2f} KiB/step above the {start / 1024:.0f} MiB start",
            )
        if len(points) >= 2:
            (n0, s0, p0), (n1, s1, p1) = points[0], points[-1]
            ratio = ((p1 - s1) / n1) / ((p0 - s0) / n0)
            h.judge(
                "rss",
                f"RSS per step n={n1} / n={n0} ({label})",
                ratio,
                "x",
                f"{key}.linearity",
                1.5,
                note="~1 is linear",
            )


WORKERS: dict[str, str] = {}
