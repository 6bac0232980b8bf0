"""A Ray job's entrypoint for a remote step: runs ``isolated_child`` on the call in
``$MARIN_CALL`` and prints its outcome, marked with ``$MARIN_OUTCOME_NONCE``, as its last line
(see ``ray.py``). Both variables leave the environment before ``fn`` runs: ``fn`` (and what it
starts) never sees the nonce, so nothing it prints can pass for the outcome."""

from __future__ import annotations

import base64
import os
import sys
import tempfile

from marin.execution.pipeline import isolated_child
from marin.execution.remote.ray import CALL_ENV, GANG_ENV, NONCE_ENV, outcome_line


def main() -> int:
    call_data = base64.b64decode(os.environ.pop(CALL_ENV))
    nonce = os.environ.pop(NONCE_ENV)
    gang = os.environ.pop(GANG_ENV, "")
    if gang:  # "RANKS GPUS": a gang of ranks in one placement group (ray_gang.py)
        from marin.execution.remote.ray_gang import run_gang

        size, gpus = (int(part) for part in gang.split())
        data = run_gang(call_data, size, gpus)
        sys.stdout.write(f"\n{outcome_line(nonce, data)}\n")
        sys.stdout.flush()
        return 0
    with tempfile.TemporaryDirectory(prefix="marin-ray-job-") as tmp:
        call, result = os.path.join(tmp, "call.pkl"), os.path.join(tmp, "result.json")
        fd = os.open(call, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # as the child checks
        with os.fdopen(fd, "wb") as f:
            f.write(call_data)
        isolated_child.main([call, result])
        with open(result, "rb") as f:
            data = f.read()
    sys.stdout.write(f"\n{outcome_line(nonce, data)}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
