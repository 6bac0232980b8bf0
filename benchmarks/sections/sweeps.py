"""Section ``sweeps``: a 4 x 4 sweep builds its 35 unique steps, not 80; one more axis value builds
only the new points; ``Artifact.from_id`` reads once per lookup (issue 57)."""

from __future__ import annotations

from harness import Harness


def bench(h: Harness) -> None:
    """The sweep's builds on the local runner (and, in a full run, three drivers on one prefix);
    1,000 registry lookups."""
    # Counts are judged as what exceeds the exact number, against 0: exact in --quick too.
    drivers = 0 if h.quick else 3
    r = h.worker("sweep", 600, drivers=drivers)
    if r:
        note = f"{r['requested']} requested, {r['unique']} unique"
        h.add("sweeps", "4x4 sweep over 5 steps: builds", r["local_builds"], "builds", note=note)
        h.judge(
            "sweeps",
            "4x4 sweep: builds beyond the unique steps",
            r["local_builds"] - r["unique"],
            "builds",
            "sweeps.local_extra",
            0,
            note=f"local runner, {r['local_s']:.2f} s",
        )
        extra = r["added_builds"] - 8 if r["added_new_points_only"] else r["added_builds"]
        h.judge(
            "sweeps",
            "one more wd value: builds beyond its 4 new points' 8",
            extra,
            "builds",
            "sweeps.added_extra",
            0,
            note=f"{r['added_builds']} built; the 35 built before are served",
        )
        if drivers:
            once = r["drivers_ok"] and r["drivers_each_once"]
            h.judge(
                "sweeps",
                f"4x4 sweep, {drivers} drivers on one prefix: builds beyond the unique steps",
                r["drivers_builds"] - r["unique"] if once else r["drivers_builds"],
                "builds",
                "sweeps.drivers_extra",
                0,
                note=f"{r['drivers_builds']} built by separate processes in "
                f"{r['drivers_s']:.1f} s; each fn ran once",
            )
    r = h.worker("from_id", 300, ids=20 if h.quick else 100, lookups=1000)
    if r:
        h.judge(
            "sweeps",
            f"Artifact.from_id: reads beyond two per lookup ({r['lookups']} lookups)",
            r["reads"] - 2 * r["lookups"],
            "reads",
            "sweeps.from_id_extra",
            0,
            # The record at the manifest's path is read too: a build made there since is never
            # served as the registered one (red team r17-4).
            note=f"{r['reads']} reads on local disk: the manifest, and the record it names",
        )
        h.add("sweeps", "Artifact.from_id, local disk", r["median_us"], "us", note="median")


WORKERS: dict[str, str] = {
    "sweep": "sweep_cost:sweep_worker",
    "from_id": "sweep_cost:from_id_worker",
}
