"""What issue 25's cache costs: code digests of many functions, output digests of big outputs.

The ``cache`` section (``sections/cache.py``) runs these in worker subprocesses:

- **code digest**: a generated module of ``n`` distinct step functions (each with its own body
  and constant, sharing a few helpers, as a real pipeline's steps do), digested cold (parsed and
  hashed: what a process pays the first time it lowers them) and again (the per-object cache);
  then the digest of one shared function asked for by ``lookups`` steps, as lowering asks (a
  100,000-step pipeline sharing one ``fn``).
- **output digest**: on local disk, one large output (``total_mib`` in files of ``file_mib``)
  and one of many small files, hashed by content. The files were just written, so they are
  read from the page cache: this is the hashing cost, not the disk's read speed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

HELPERS = 20


def _module_source(n: int) -> str:
    lines = ["import json", ""]
    for h in range(HELPERS):
        lines += [f"def helper_{h}(x):", f"    return [v * {h + 1} for v in x]", "", ""]
    for i in range(n):
        lines += [
            f"SCALE_{i} = {i}",
            "",
            "",
            f"def step_{i}(values, out_path):",
            f'    """Step {i}."""',
            f"    scaled = helper_{i % HELPERS}(values)",
            f"    total = sum(scaled) + SCALE_{i}",
            "    with open(out_path, 'w') as f:",
            "        f.write(json.dumps({'total': total}))",
            "    return total",
            "",
            "",
        ]
    return "\n".join(lines)


def code_digest_worker(n: int, lookups: int, reps: int) -> dict[str, Any]:
    """Cold and cached digests of ``n`` distinct functions; cached lookups of one shared one."""
    from marin.execution.digest import code as cd

    folder = tempfile.mkdtemp(prefix="marin-bench-code-")
    try:
        path = os.path.join(folder, f"bench_steps_{n}.py")
        with open(path, "w") as f:
            f.write(_module_source(n))
        spec = importlib.util.spec_from_file_location(f"bench_steps_{n}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        fns = [getattr(module, f"step_{i}") for i in range(n)]
        cold: list[float] = []
        warm: list[float] = []
        for _ in range(reps):
            cd.clear_cache()
            t0 = time.perf_counter()
            digests = [cd.code_digest(fn) for fn in fns]
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for fn in fns:
                cd.code_digest(fn)
            warm.append(time.perf_counter() - t0)
        assert all(d.digest is not None and len(d.parts) == 2 for d in digests)
        assert len({d.digest for d in digests}) == n  # every function is its own code
        # What lowering pays per step of a pipeline sharing one fn: the digest of the function
        # behind each step's apply() call object, as ``lazy._spec_for`` asks for it.
        from marin.execution.lazy import OUT, apply

        runs = [
            apply(f"s{i}", fns[0], version="v1", values=[i], out_path=OUT).run
            for i in range(lookups)
        ]
        t0 = time.perf_counter()
        for run in runs:
            cd.code_digest(getattr(run, "wrapped_fn", run))
        lookup_s = time.perf_counter() - t0
        return {
            "n": n,
            "cold_median_s": statistics.median(cold),
            "cached_median_s": statistics.median(warm),
            "lookups": lookups,
            "lookup_s": lookup_s,
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def output_digest_worker(
    total_mib: int, file_mib: int, small_files: int, reps: int
) -> dict[str, Any]:
    """Local-disk output digests of one large output and of one of many small files."""
    from marin.execution.builder.output_tree import output_digest
    from marin.execution.store.location import open_prefix

    root = tempfile.mkdtemp(prefix="marin-bench-output-")
    try:
        location = open_prefix(root)
        big = os.path.join(root, "big", "v1")
        os.makedirs(big)
        block = os.urandom(1 << 20)
        for i in range(total_mib // file_mib):
            with open(os.path.join(big, f"shard-{i:04d}.bin"), "wb") as f:
                for _ in range(file_mib):
                    f.write(block)
        small = os.path.join(root, "small", "v1")
        for i in range(small_files):
            folder = os.path.join(small, f"d{i // 1000:03d}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"f{i}.json"), "wb") as f:
                f.write(block[: 1024 + i % 7])
        big_s: list[float] = []
        small_s: list[float] = []
        for _ in range(reps):
            t0 = time.perf_counter()
            big_digest = output_digest(location, big)
            big_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            small_digest = output_digest(location, small)
            small_s.append(time.perf_counter() - t0)
        assert big_digest.digest is not None and big_digest.bytes == total_mib << 20
        assert small_digest.digest is not None and small_digest.files == small_files
        return {
            "total_mib": total_mib,
            "file_mib": file_mib,
            "big_median_s": statistics.median(big_s),
            "small_files": small_files,
            "small_median_s": statistics.median(small_s),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
