"""Section ``cache``: code digests of many functions, output digests of large outputs."""

from __future__ import annotations

from harness import Harness


def bench(h: Harness) -> None:
    """Issue 25: code digests of many distinct functions, output digests of large outputs."""
    n = 200 if h.quick else 1000
    r = h.worker("code_digest", 120, n=n, lookups=100_000, reps=1 if h.quick else 3)
    if r:
        h.add(
            "cache",
            f"code digest, {n} distinct functions, first time",
            r["cold_median_s"] * 1e3,
            "ms",
            note=f"{r['cold_median_s'] / n * 1e6:.0f} us/function: parsed and hashed once per "
            "process",
        )
        h.add(
            "cache",
            f"code digest, {n} distinct functions, again",
            r["cached_median_s"] * 1e3,
            "ms",
            note="the per-object cache",
        )
        h.judge(
            "cache",
            "code digest of one shared fn, per step",
            r["lookup_s"] / r["lookups"] * 1e6,
            "us/step",
            "cache.code_lookup",
            2.0,
            note=f"{r['lookups']} lookups: what a pipeline sharing one fn pays per step",
        )
    total, size, small = (64, 16, 1000) if h.quick else (1024, 64, 10_000)
    r = h.worker(
        "output_digest",
        300,
        total_mib=total,
        file_mib=size,
        small_files=small,
        reps=1 if h.quick else 3,
    )
    if r:
        h.add(
            "cache",
            f"output digest, local disk, {total} MiB in {size} MiB files",
            r["big_median_s"],
            "s",
            note=f"{total / r['big_median_s']:.0f} MiB/s, SHA-256 of content from the page cache",
        )
        h.add(
            "cache",
            f"output digest, local disk, {small} files of 1 KiB",
            r["small_median_s"],
            "s",
            note=f"{r['small_median_s'] / small * 1e6:.0f} us/file",
        )


WORKERS: dict[str, str] = {
    "code_digest": "cache_cost:code_digest_worker",
    "output_digest": "cache_cost:output_digest_worker",
}
