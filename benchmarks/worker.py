"""Run one benchmark worker: ``worker.py MODULE:FUNCTION ARGS_JSON`` (started by ``harness.py``).

A fresh process per measurement keeps them independent: ``memory://`` is one process-wide store,
peak RSS (``ru_maxrss``) is per process, and a measurement that blows its time budget can be
killed without taking the harness down. Only the worker's own module is imported. The worker
prints one JSON object as its last line.
"""

from __future__ import annotations

import importlib
import json
import logging
import resource
import sys


def main(spec: str, args_json: str) -> None:
    logging.getLogger("marin").setLevel(logging.WARNING)
    module, _, function = spec.partition(":")
    result = getattr(importlib.import_module(module), function)(**json.loads(args_json))
    # Peak resident set size of this process, in KiB (Linux reports KiB).
    result["worker_rss_peak_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
